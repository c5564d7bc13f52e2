"""remote_health_check's evidence: what an SSH host can do, every failure classified.

One report per host: reachable, latency (median of 3 `true` commands through the full command
path), the remote Python with torch/triton/CUDA (one small `python -c`), free disk under
remote_root, and GPUs from nvidia-smi when the host has it (a host without it is not an error).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio
from pydantic import BaseModel, Field, computed_field

from ..errors import ExecutorError

if TYPE_CHECKING:
    from .ssh import SSHExecutor


class GpuInfo(BaseModel):
    """One GPU as nvidia-smi reports it."""

    index: int
    name: str
    driver_version: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    sm_clock_mhz: int | None
    max_sm_clock_mhz: int | None

    @classmethod
    def from_smi(cls, cells: list[str]) -> GpuInfo:
        def num(text: str) -> int | None:
            return int(float(text)) if text.replace(".", "", 1).isdigit() else None

        index, name, driver, total, used, sm, max_sm = cells
        return cls(
            index=num(index) or 0,
            name=name,
            driver_version=driver,
            memory_total_mib=num(total),
            memory_used_mib=num(used),
            sm_clock_mhz=num(sm),
            max_sm_clock_mhz=num(max_sm),
        )


class HealthProblem(BaseModel):
    kind: str = Field(description="ExecutorError kind: unreachable, auth, remote_env, ...")
    message: str
    next_step: str = ""


class RemoteHealth(BaseModel):
    """What remote_health_check shows. `problems` empty means ready for GPU work."""

    host: str
    reachable: bool
    latency_ms: float | None = Field(default=None, description="median of 3 `true` commands")
    python_version: str | None = None
    torch_version: str | None = None
    triton_version: str | None = None
    cuda_available: bool | None = None
    cuda_device_count: int | None = None
    disk_free_gb: float | None = Field(default=None, description="free under remote_root")
    nvidia_smi: bool = Field(default=False, description="nvidia-smi found on the host")
    gpus: list[GpuInfo] = Field(default_factory=list)
    problems: list[HealthProblem] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return self.reachable and not self.problems

    @computed_field  # type: ignore[prop-decorator]
    @property
    def error_kind(self) -> str | None:
        return self.problems[0].kind if self.problems else None

    def add(self, kind: str, message: str, next_step: str = "") -> None:
        self.problems.append(HealthProblem(kind=kind, message=message, next_step=next_step))


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

_SYS_PROBE = r"""df -Pk -- "$1" | awk 'NR==2 {print $4}'; echo @@
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --format=csv,noheader,nounits \
 --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm; fi
exit 0"""


async def probe_health(
    ex: SSHExecutor, remote_python: str = "python3", min_free_disk_gb: float = 1.0
) -> RemoteHealth:
    """The report for ex's host; never raises ExecutorError (see SSHExecutor.health)."""
    report = RemoteHealth(host=ex.host, reachable=False)
    try:
        await ex.connect()
        report.latency_ms = round(await ex.latency_ms(), 2)
    except ExecutorError as exc:
        report.add(exc.kind, exc.message, exc.next_step)
        return report
    report.reachable = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(_probe_python, ex, report, remote_python)
        tg.start_soon(_probe_system, ex, report, min_free_disk_gb)
    return report


async def _probe_python(ex: SSHExecutor, report: RemoteHealth, python: str) -> None:
    try:
        result = await ex.run([python, "-c", _PY_PROBE], timeout_s=120)
    except ExecutorError as exc:
        report.add(exc.kind, exc.message, exc.next_step)
        return
    if result.timed_out:
        report.add("timeout", f"{python} -c 'import torch' took over 120 s on {ex.host}.")
        return
    try:
        info = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report.add("remote_env", f"{python} on {ex.host} failed: {result.stderr_tail(5)}")
        return
    report.python_version = info.get("python")
    report.torch_version = info.get("torch")
    report.triton_version = info.get("triton")
    report.cuda_available = info.get("cuda")
    report.cuda_device_count = info.get("cuda_devices")
    fix = f"install it for {python} on the host (or set HARNESSLAB_REMOTE_PYTHON)"
    for module, error in sorted(info.get("errors", {}).items()):
        report.add("remote_env", f"{module} does not import on {ex.host}: {error}", fix)
    if report.torch_version and not report.cuda_available:
        report.add(
            "remote_env",
            f"torch on {ex.host} sees no CUDA device.",
            "check nvidia-smi, the driver, and CUDA_VISIBLE_DEVICES on the host",
        )


async def _probe_system(ex: SSHExecutor, report: RemoteHealth, min_free_gb: float) -> None:
    try:
        result = await ex.run(["sh", "-c", _SYS_PROBE, "sh", ex.path()], timeout_s=60)
    except ExecutorError as exc:
        report.add(exc.kind, exc.message, exc.next_step)
        return
    disk, _, smi = result.stdout.partition("@@\n")
    if disk.strip().isdigit():
        report.disk_free_gb = round(int(disk) * 1024 / 1e9, 2)
        if report.disk_free_gb < min_free_gb:
            report.add(
                "disk_full",
                f"only {report.disk_free_gb} GB free under {ex.path()} on {ex.host}.",
                "free space there or move remote_root (HARNESSLAB_REMOTE_ROOT)",
            )
    report.nvidia_smi = bool(smi.strip())
    for line in smi.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 7:
            report.gpus.append(GpuInfo.from_smi(cells))


__all__ = ["GpuInfo", "HealthProblem", "RemoteHealth", "probe_health"]
