"""remote_health_check's library half: is every GPU host reachable and ready for GPU work?

Per executor: reachability and command round-trip latency, GPUs from nvidia-smi (name, driver,
free memory, clocks), free disk under the executor's root, and the runner's own view through a
`health` request (device, torch/triton versions, measured copy bandwidth). SSH executors bring
their own `health()` (tools/execution/ssh.py); its report is merged in. A GPU slot whose lock is held by a
running evaluation is reported busy instead of waited for.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from ..errors import ExecutorError
from ..task.spec import TaskSpec
from .executor import Executor
from .launcher import Launcher

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


class Problem(BaseModel):
    kind: str = Field(description="unreachable, auth, remote_env, disk_full, no_gpu, busy, ...")
    message: str
    next_step: str = ""


class HostHealth(BaseModel):
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
    driver_version: str | None = None
    copy_gbps: float | None = Field(default=None, description="runner-measured copy bandwidth")
    gpus: list[dict[str, Any]] = Field(default_factory=list, description="nvidia-smi per GPU")
    disk_free_gb: float | None = None
    busy_slots: list[str] = Field(default_factory=list, description="GPUs running a job now")
    problems: list[Problem] = Field(default_factory=list, description="faults to fix")
    notes: list[Problem] = Field(
        default_factory=list, description="not faults: a busy GPU, no GPU (CPU interpreter)"
    )


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


async def _latency_ms(executor: Executor, samples: int = 3) -> float:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await executor.run(["true"], timeout_s=30)
        times.append((time.perf_counter() - t0) * 1e3)
    return round(sorted(times)[len(times) // 2], 2)


async def _system(executor: Executor, report: HostHealth, min_free_gb: float) -> None:
    res = await executor.run(["sh", "-c", _SYS, "sh", executor.path()], timeout_s=60)
    disk, _, smi = res.stdout.partition("@@\n")
    if disk.strip().isdigit():
        report.disk_free_gb = round(int(disk) / (1 << 20), 2)
        if report.disk_free_gb < min_free_gb:
            report.problems.append(
                Problem(
                    kind="disk_full",
                    message=f"only {report.disk_free_gb} GB free under {executor.path()}.",
                    next_step="free space there (or move the state/remote root)",
                )
            )
    report.gpus = parse_smi(smi)
    if report.gpus and not report.driver_version:
        report.driver_version = str(report.gpus[0]["driver_version"])


def _merge_remote(report: HostHealth, remote: Any) -> None:
    data = remote.model_dump() if hasattr(remote, "model_dump") else dict(remote)
    report.reachable = bool(data.get("reachable", report.reachable))
    for key in ("latency_ms", "python_version", "torch_version", "triton_version", "disk_free_gb"):
        if data.get(key) is not None:
            setattr(report, key, data[key])
    if data.get("gpus") and not report.gpus:
        report.gpus = list(data["gpus"])
    for p in data.get("problems") or []:
        report.problems.append(Problem.model_validate(p))


async def health_check(
    launcher: Launcher,
    task: TaskSpec,
    *,
    runner: bool = True,
    min_free_disk_gb: float = 1.0,
) -> HealthReport:
    """Check every executor. `runner=False` skips the runner request (torch import, seconds)."""
    hosts = []
    for executor in launcher.executors:
        report = HostHealth(host=executor.host, executor=executor.name, reachable=False)
        slots = [s for s in launcher.slots if s.executor is executor]
        report.busy_slots = [s.label for s in slots if s.lock.locked()]
        try:
            if hasattr(executor, "health"):
                remote = await executor.health(remote_python=launcher.settings.remote_python)
                _merge_remote(report, remote)
            else:
                report.latency_ms = await _latency_ms(executor)
                report.reachable = True
            if report.reachable:
                await _system(executor, report, min_free_disk_gb)
                free = [s for s in slots if not s.lock.locked()]
                if runner and free:
                    await _runner_health(launcher, task, free[0], report)
        except ExecutorError as exc:
            report.problems.append(
                Problem(kind=exc.kind, message=exc.message, next_step=exc.next_step)
            )
        if report.busy_slots:
            report.notes.append(
                Problem(
                    kind="busy",
                    message=f"{', '.join(report.busy_slots)} busy with an evaluation now.",
                    next_step="results of GPU tools queue behind it; this is not a fault",
                )
            )
        hosts.append(report)
    faults = [p for h in hosts for p in h.problems]
    ok = all(h.reachable for h in hosts) and not faults
    parts = []
    for h in hosts:
        gpu = h.gpus[0]["name"] if h.gpus else (h.device or "no GPU seen")
        parts.append(f"{h.host}: {'reachable' if h.reachable else 'UNREACHABLE'}, {gpu}")
    summary = "; ".join(parts)
    if faults:
        summary += f". {len(faults)} problem(s): {faults[0].message} Next: {faults[0].next_step}"
    return HealthReport(ok=ok, hosts=hosts, summary=summary)


async def _runner_health(launcher: Launcher, task: TaskSpec, slot, report: HostHealth) -> None:
    call = await launcher.call({"mode": "health"}, task=task, slot=slot, timeout_s=120)
    res = call.result or {}
    if res.get("status") != "passed":
        report.problems.append(
            Problem(
                kind="remote_env",
                message=f"the runner failed its health request: {call.failure()}",
                next_step="check torch and triton for the runner's python (HARNESSLAB_PYTHON / "
                "HARNESSLAB_REMOTE_PYTHON)",
            )
        )
        return
    env = res.get("env") or {}
    report.device = env.get("device")
    report.interpret = env.get("interpret")
    report.python_version = report.python_version or env.get("python")
    report.torch_version = env.get("torch")
    report.triton_version = env.get("triton")
    report.cuda_version = env.get("cuda")
    report.driver_version = report.driver_version or env.get("driver")
    report.copy_gbps = res.get("copy_gbps")
    if env.get("interpret"):
        report.notes.append(
            Problem(
                kind="no_gpu",
                message=f"no CUDA GPU on {report.host}: kernels run on the Triton CPU "
                "interpreter and timings are not meaningful.",
                next_step="fine for correctness work; set --gpu-host for real timings",
            )
        )


__all__ = ["HealthReport", "HostHealth", "Problem", "health_check", "parse_smi"]
