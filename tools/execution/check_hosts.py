"""remote_health_check's run over a launcher: every executor's host probed (its own `health`:
tools/execution/health.py), plus the runner's own view through a `health` request on a free GPU
slot (device, versions, measured copy bandwidth). A slot whose lock is held by a running
evaluation is reported busy instead of waited for. Every failure comes back classified (an
ExecutorError kind and a next step), never raised.

Side of the trust boundary: trusted (host); the report is what the hosts and the runner said.
"""

from __future__ import annotations

from ..errors import ExecutorError
from ..task import TaskSpec
from .health import HealthReport, HostHealth, Problem
from .launcher import Launcher, Slot


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
        slots = [s for s in launcher.slots if s.executor is executor]
        try:
            report = await executor.health(
                python=executor.python(launcher.settings),
                min_free_disk_gb=min_free_disk_gb,
                # On this machine the runner's health request below imports torch anyway.
                python_probe=not executor.on_this_machine,
            )
            report.busy_slots = [s.label for s in slots if s.lock.locked()]
            free = [s for s in slots if not s.lock.locked()]
            pending = any(n.kind == "pending" for n in report.notes)  # a queued allocation
            if report.reachable and runner and free and not pending:
                await _runner_health(launcher, task, free[0], report)
        except ExecutorError as exc:
            report = HostHealth(host=executor.host, executor=executor.name, reachable=False)
            report.add(exc.kind, exc.message, exc.next_step)
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


async def _runner_health(
    launcher: Launcher, task: TaskSpec, slot: Slot, report: HostHealth
) -> None:
    call = await launcher.call({"mode": "health"}, task=task, slot=slot, timeout_s=120)
    res = call.result or {}
    if res.get("status") != "passed":
        report.add(
            "remote_env",
            f"the runner failed its health request: {call.failure()}",
            "check torch and triton for the runner's python (HARNESSLAB_PYTHON / "
            "HARNESSLAB_REMOTE_PYTHON)",
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


__all__ = ["health_check"]
