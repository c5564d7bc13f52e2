"""remote_health_check's library half: is every GPU host reachable and ready for GPU work?

One model (`HostHealth`) and one probe (`probe_host`) for every executor backend, run through
the executor's own `run`: reachability and command round-trip latency, the harness's Python with
torch/triton/CUDA (one small `python -c`), GPUs from nvidia-smi (name, driver, memory, clocks;
a host without nvidia-smi is not an error), free disk under the executor's root in GB (1e9
bytes). `health_check` (tools/execution/check_hosts.py) runs it on every host of a launcher.
Every failure comes back classified (an ExecutorError kind and a next step), never raised.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import anyio
from pydantic import BaseModel, Field, computed_field

from ..errors import ExecutorError
from .command_result import CommandResult


class ProbeTarget(Protocol):
    """What the probe needs of an executor (executor.Executor is one; its `health` runs the
    probe on itself, so this module sits below it)."""

    name: str
    host: str

    async def connect(self) -> None: ...

    async def run(self, argv: list[str], *, timeout_s: float) -> CommandResult: ...

    def path(self, *parts: str) -> str: ...


_SYS = r"""df -Pk -- "$1" | awk 'NR==2 {print $4}'; echo @@
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --format=csv,noheader,nounits \
 --query-gpu=index,name,driver_version,memory.total,memory.used,memory.free,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu; fi
exit 0"""
_SMI_FIELDS = (
    "index",
    "name",
    "driver_version",
    "memory_total_mib",
    "memory_used_mib",
    "memory_free_mib",
    "sm_clock_mhz",
    "max_sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
)
_PY_PROBE = """import json, sys
r = {"python": sys.version.split()[0], "errors": {}}
try:
    import torch
    r.update(torch=torch.__version__, cuda=torch.cuda.is_available())
    r["cuda_devices"] = torch.cuda.device_count()
except Exception as e:
    r["errors"]["torch"] = f"{type(e).__name__}: {e}"
try:
    import triton
    r["triton"] = triton.__version__
except Exception as e:
    r["errors"]["triton"] = f"{type(e).__name__}: {e}"
print(json.dumps(r))"""


class Problem(BaseModel):
    kind: str = Field(
        description="unreachable, auth, remote_env, disk_full, no_gpu, busy, pending, ..."
    )
    message: str
    next_step: str = ""


class HostHealth(BaseModel):
    """One executor's host. `problems` empty (and reachable) means ready for GPU work."""

    host: str
    executor: str
    reachable: bool
    latency_ms: float | None = Field(default=None, description="median round trip of `true`")
    device: str | None = Field(default=None, description="what the runner runs on")
    interpret: bool | None = Field(default=None, description="Triton CPU interpreter in use")
    python_version: str | None = None
    torch_version: str | None = None
    triton_version: str | None = None
    cuda_version: str | None = None
    cuda_available: bool | None = Field(default=None, description="torch sees a CUDA device")
    cuda_device_count: int | None = None
    driver_version: str | None = None
    copy_gbps: float | None = Field(default=None, description="runner-measured copy bandwidth")
    nvidia_smi: bool = Field(default=False, description="nvidia-smi found on the host")
    gpus: list[dict[str, Any]] = Field(default_factory=list, description="nvidia-smi per GPU")
    disk_free_gb: float | None = Field(
        default=None, description="GB (1e9 bytes) free under the root"
    )
    scheduler: dict[str, Any] | None = Field(
        default=None,
        description="a batch scheduler's view (Slurm): partitions with free GPUs, this "
        "server's job (id, state, reason, nodes)",
    )
    busy_slots: list[str] = Field(default_factory=list, description="GPUs running a job now")
    problems: list[Problem] = Field(default_factory=list, description="faults to fix")
    notes: list[Problem] = Field(
        default_factory=list, description="not faults: a busy GPU, no GPU (CPU interpreter)"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return self.reachable and not self.problems

    @computed_field  # type: ignore[prop-decorator]
    @property
    def error_kind(self) -> str | None:
        return self.problems[0].kind if self.problems else None

    def add(self, kind: str, message: str, next_step: str = "") -> None:
        self.problems.append(Problem(kind=kind, message=message, next_step=next_step))


class HealthReport(BaseModel):
    ok: bool = Field(description="every host reachable and without problems")
    hosts: list[HostHealth]
    summary: str


def _num(text: str) -> int | float | str | None:
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        return text or None
    return int(value) if value.is_integer() else value


def parse_smi(text: str) -> list[dict[str, Any]]:
    gpus = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(_SMI_FIELDS):
            row = {k: _num(v) for k, v in zip(_SMI_FIELDS, cells, strict=True)}
            row["name"], row["driver_version"] = cells[1], cells[2]
            gpus.append(row)
    return gpus


async def latency_ms(executor: ProbeTarget, samples: int = 3) -> float:
    """Median round trip of `true` through the executor's full command path."""
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await executor.run(["true"], timeout_s=30)
        times.append((time.perf_counter() - t0) * 1e3)
    return round(sorted(times)[len(times) // 2], 2)


async def probe_host(
    executor: ProbeTarget,
    *,
    python: str,
    min_free_disk_gb: float = 1.0,
    python_probe: bool = True,
) -> HostHealth:
    """The report for `executor`'s host (see the module docstring). `python_probe=False` skips
    the `python -c` import of torch (the runner's health request imports it anyway)."""
    report = HostHealth(host=executor.host, executor=executor.name, reachable=False)
    try:
        await executor.connect()
        report.latency_ms = await latency_ms(executor)
    except ExecutorError as exc:
        report.add(exc.kind, exc.message, exc.next_step)
        return report
    report.reachable = True
    async with anyio.create_task_group() as tg:
        if python_probe:
            tg.start_soon(_probe_python, executor, report, python)
        tg.start_soon(_probe_system, executor, report, min_free_disk_gb)
    return report


async def _probe_python(executor: ProbeTarget, report: HostHealth, python: str) -> None:
    try:
        result = await executor.run([python, "-c", _PY_PROBE], timeout_s=120)
    except ExecutorError as exc:
        report.add(exc.kind, exc.message, exc.next_step)
        return
    if result.timed_out:
        report.add("timeout", f"{python} -c 'import torch' took over 120 s on {executor.host}.")
        return
    try:
        info = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.add("remote_env", f"{python} on {executor.host} failed: {result.stderr_tail(5)}")
        return
    report.python_version = info.get("python")
    report.torch_version = info.get("torch")
    report.triton_version = info.get("triton")
    report.cuda_available = info.get("cuda")
    report.cuda_device_count = info.get("cuda_devices")
    fix = f"install it for {python} on the host (or set HARNESSLAB_REMOTE_PYTHON)"
    for module, error in sorted(info.get("errors", {}).items()):
        report.add("remote_env", f"{module} does not import on {executor.host}: {error}", fix)
    if report.torch_version and not report.cuda_available:
        report.add(
            "remote_env",
            f"torch on {executor.host} sees no CUDA device.",
            "check nvidia-smi, the driver, and CUDA_VISIBLE_DEVICES on the host",
        )


async def _probe_system(executor: ProbeTarget, report: HostHealth, min_free_gb: float) -> None:
    try:
        res = await executor.run(["sh", "-c", _SYS, "sh", executor.path()], timeout_s=60)
    except ExecutorError as exc:
        report.add(exc.kind, exc.message, exc.next_step)
        return
    disk, _, smi = res.stdout.partition("@@\n")
    if disk.strip().isdigit():
        report.disk_free_gb = round(int(disk) * 1024 / 1e9, 2)
        if report.disk_free_gb < min_free_gb:
            report.add(
                "disk_full",
                f"only {report.disk_free_gb} GB free under {executor.path()} on {executor.host}.",
                "free space there or move the state dir / remote_root (HARNESSLAB_REMOTE_ROOT)",
            )
    report.nvidia_smi = bool(smi.strip())
    report.gpus = parse_smi(smi)
    if report.gpus and not report.driver_version:
        report.driver_version = str(report.gpus[0]["driver_version"])


__all__ = [
    "HealthReport",
    "HostHealth",
    "Problem",
    "latency_ms",
    "parse_smi",
    "probe_host",
]
