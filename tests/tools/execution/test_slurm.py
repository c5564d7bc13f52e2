"""The Slurm executor against a real one-node Slurm cluster (tests/slurm_cluster.py: munged,
slurmctld and slurmd on this machine, two count-only "GPUs"), the runner on the Triton CPU
interpreter. What the contract suite cannot see: the allocation's GPUs as slots (a sweep and the
lab fanned over both), a pending allocation, cancel and timeout inside the job, a node failing
mid-call, release when idle and on exit."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tests.slurm_cluster import Cluster, slurm_settings
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution import health_check
from harnesslab.tools.execution.backends import build_executors
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.execution.slurm import SlurmExecutor
from harnesslab.tools.lab.matrix import LabOptions, run_lab
from harnesslab.tools.state.workspace import Workspace, init_workspace

SMALL = "1024x1024_fp16"
pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def launcher(slurm_cluster: Cluster, tmp_path: Path) -> AsyncIterator[Launcher]:
    settings = slurm_settings(slurm_cluster, tmp_path / "state", interpret="always")
    launcher = Launcher(settings, build_executors(settings))
    try:
        yield launcher
    finally:
        with anyio.fail_after(30):
            await launcher.aclose()
    released(slurm_cluster)


async def until(predicate: Callable[[], object], timeout_s: float = 20.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.1)


def released(cluster: Cluster) -> None:
    """Nothing left in squeue (a cancelled job shows COMPLETING for a moment first)."""
    cluster.wait_until(lambda: cluster.jobs() == [], "squeue empty", 20)


def workspace(launcher: Launcher, tmp_path: Path) -> Workspace:
    return init_workspace("rmsnorm_gate", tmp_path / "ws", launcher.settings)


def executor(launcher: Launcher) -> SlurmExecutor:
    (ex,) = launcher.executors
    assert isinstance(ex, SlurmExecutor)
    return ex


def blocker(cluster: Cluster) -> str:
    """A job of someone else holding every GPU of the cluster."""
    out = cluster.command(
        "sbatch", "--parsable", f"--gres=gpu:{cluster.gpus}", "--output=/dev/null",
        "--chdir=/tmp", "--wrap=sleep 600",
    )  # fmt: skip
    job = out.strip()
    cluster.wait_until(lambda: f"{job} RUNNING" in " ".join(cluster.jobs()), "blocker running")
    return job


def steps(cluster: Cluster, job: str) -> list[str]:
    """The job's steps, except the holding job's own script."""
    out = cluster.command("squeue", "-h", "-s", "-j", job, "-o", "%i")
    return [s for s in out.split() if not s.endswith((".batch", ".extern"))]


async def test_eval_runs_in_the_allocation_and_a_sweep_uses_both_of_its_gpus(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    ws = workspace(launcher, tmp_path)
    assert [s.gpu_index for s in launcher.slots] == [0, 1]  # the allocation's GPUs are slots
    with anyio.fail_after(240):
        result = await run_objective(ws, launcher, cases=[SMALL])
        assert result.status == "passed", result
        assert result.env.host == slurm_cluster.node
        swept = await sweep(ws, launcher, space={"num_warps": [1, 2, 4, 8]}, cases=[SMALL])
    assert swept.ok == 4, swept
    # Each config names the node and the GPU Slurm gave its step: both GPUs timed configs.
    assert {r.host for r in swept.results} == {slurm_cluster.node}
    assert sorted({r.gpu_index for r in swept.results}) == ["0", "1"]
    assert executor(launcher).job_id in " ".join(slurm_cluster.jobs())


async def test_a_pending_allocation_is_reported_with_slurms_reason_then_runs(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    ws = workspace(launcher, tmp_path)
    other = blocker(slurm_cluster)
    said: list[str] = []

    async def progress(done: int, total: int, message: str) -> None:
        said.append(message)
        if message.startswith("pending:"):  # seen: let the other job end
            slurm_cluster.command("scancel", other)

    try:
        with anyio.fail_after(240):
            result = await run_objective(ws, launcher, cases=[SMALL], progress=progress)
    finally:
        subprocess.run(["scancel", other], env=slurm_cluster.env, check=False)
    assert "pending: Resources" in said
    assert result.status == "passed"


async def test_a_request_the_cluster_can_never_satisfy_fails_at_once_with_the_fix(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """The default 8 CPUs per GPU on a node with 2 CPUs: Slurm queues the job for ever
    (PartitionConfig). It waited until the command's own timeout; now it fails in seconds,
    cancelled, saying why and which setting fits."""
    settings = slurm_settings(slurm_cluster, tmp_path / "state", slurm_cpus_per_gpu=8)
    (ex,) = build_executors(settings)
    try:
        with anyio.fail_after(30), pytest.raises(ExecutorError) as raised:
            await ex.connect()
    finally:
        await ex.aclose()
    err = raised.value
    assert "never start" in err.message and "PartitionConfig" in err.message
    assert "Requested node configuration is not available" in err.message  # Slurm's words
    assert "at most 2 CPUs and 2 GPUs" in err.message
    assert "HARNESSLAB_SLURM_CPUS_PER_GPU=1" in (err.next_step or "")
    released(slurm_cluster)


async def test_health_shows_partitions_free_gpus_and_a_pending_job(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harnesslab.tools.execution import slurm

    monkeypatch.setattr(slurm, "HEALTH_WAIT_S", 1.0)
    ex = executor(launcher)
    ws = workspace(launcher, tmp_path)
    other = blocker(slurm_cluster)
    try:
        with anyio.fail_after(60):  # the runner's health request does not wait for the queue
            health = await health_check(launcher, ws.task, runner=True)
    finally:
        subprocess.run(["scancel", other], env=slurm_cluster.env, check=False)
    (report,) = health.hosts
    assert report.reachable and report.scheduler is not None and report.device is None
    (partition,) = report.scheduler["partitions"]
    assert partition["gpus"] == 2 and partition["free_gpus"] == 0
    assert report.scheduler["job"]["state"] == "PENDING"
    assert [n.message for n in report.notes if n.kind == "pending"] == [
        f"job {ex.job_id} pending: Resources"
    ]


async def test_cancelling_a_call_whose_allocation_is_pending_leaves_no_job(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    ws = workspace(launcher, tmp_path)
    other = blocker(slurm_cluster)
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:

                async def progress(done: int, total: int, message: str) -> None:
                    if message.startswith("pending:"):
                        tg.cancel_scope.cancel()

                tg.start_soon(lambda: run_objective(ws, launcher, cases=[SMALL], progress=progress))
        assert slurm_cluster.jobs() == [other, "RUNNING"]  # ours is gone, not left queued
        assert executor(launcher).job_id is None
    finally:
        subprocess.run(["scancel", other], env=slurm_cluster.env, check=False)


async def test_cancel_and_timeout_kill_the_step_in_the_job(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    ex = executor(launcher)
    pidfile = tmp_path / "pid"
    sleeper = ["sh", "-c", f"echo $$ > {pidfile}; sleep 300"]
    with anyio.fail_after(60):
        timed = await ex.run(sleeper, env={"CUDA_VISIBLE_DEVICES": "1"}, timeout_s=2)
        assert timed.timed_out and timed.exit_code is None
        job = ex.job_id
        assert job is not None
        await until(lambda: steps(slurm_cluster, job) == [], 10)
        pidfile.unlink()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: ex.run(sleeper, timeout_s=120))
            await until(pidfile.exists, 20)
            assert len(steps(slurm_cluster, job)) == 1
            tg.cancel_scope.cancel()
        await until(lambda: steps(slurm_cluster, job) == [], 10)
        # The allocation outlives its steps and serves the next call.
        assert (await ex.run(["echo", "ok"], timeout_s=30)).stdout == "ok\n"
        assert ex.job_id == job


async def test_a_runner_call_that_times_out_leaves_no_step(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    ws = workspace(launcher, tmp_path)
    with anyio.fail_after(120):
        await run_objective(ws, launcher, cases=[SMALL])  # GPU 0's warm runner is up
        job = executor(launcher).job_id
        assert job is not None
        warm = steps(slurm_cluster, job)
        assert len(warm) == 1 and launcher.slots[0].worker is not None
        launcher.settings.eval_timeout_s = 0.3  # every case takes far longer
        # GPU 1 (the least used): its runner's step is killed while it starts (the runner
        # never took the request: a fault of the call, not a result of the candidate) ...
        # A warm host can start a runner within 0.3 s, so this one's step first sleeps.
        ex = executor(launcher)
        start = ex.start

        async def slow_start(argv: list[str], **kw: Any) -> Any:
            return await start(["sh", "-c", 'sleep 5; exec "$@"', "sh", *argv], **kw)

        ex.start = slow_start  # type: ignore[method-assign]
        with pytest.raises(ExecutorError) as starting:
            await run_objective(ws, launcher)
        ex.start = start  # type: ignore[method-assign]
        await until(lambda: steps(slurm_cluster, job) == warm, 10)
        # ... GPU 0: the warm runner's step is killed mid-request.
        serving = await run_objective(ws, launcher)
        await until(lambda: steps(slurm_cluster, job) == [], 10)
    assert starting.value.kind == "timeout" and not starting.value.started
    assert serving.status != "passed"
    assert [s.worker for s in launcher.slots] == [None, None]


async def test_a_node_failing_mid_call_is_classified_and_the_next_call_gets_a_new_allocation(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    ex = executor(launcher)
    pidfile = tmp_path / "pid"
    lost: list[ExecutorError] = []
    try:
        with anyio.fail_after(90):
            await ex.connect()
            first = ex.job_id
            async with anyio.create_task_group() as tg:

                async def doomed() -> None:
                    try:
                        got = await ex.run(
                            ["sh", "-c", f"echo $$ > {pidfile}; sleep 300"], timeout_s=60
                        )
                    except ExecutorError as exc:
                        lost.append(exc)
                    else:
                        raise AssertionError(f"no error: {got}")

                tg.start_soon(doomed)
                await until(pidfile.exists, 20)
                slurm_cluster.kill_slurmd()
    finally:
        slurm_cluster.start_slurmd()
    assert [e.kind for e in lost] == ["node_failure"], lost
    assert "new allocation" in lost[0].next_step
    with anyio.fail_after(60):
        again = await ex.run(["echo", "back"], timeout_s=30)
    assert again.stdout == "back\n" and ex.job_id not in (None, first)


async def test_a_command_killed_by_a_signal_on_a_live_node_is_its_own_result(
    launcher: Launcher,
) -> None:
    """srun reports "task 0: Killed" both for a task whose node died and for one killed by a
    signal; a probe step tells them apart: on a live node the kill is the command's result."""
    ex = executor(launcher)
    with anyio.fail_after(60):
        got = await ex.run(["sh", "-c", "kill -9 $$"], timeout_s=30)
        job = ex.job_id
        again = await ex.run(["echo", "same"], timeout_s=30)
    assert got.exit_code == 137 and not got.timed_out
    assert again.stdout == "same\n" and ex.job_id == job  # the allocation was kept


async def test_the_allocation_ends_itself_when_idle(slurm_cluster: Cluster, tmp_path: Path) -> None:
    settings = slurm_settings(slurm_cluster, tmp_path / "state", slurm_idle_s=2)
    (ex,) = build_executors(settings)
    assert isinstance(ex, SlurmExecutor)
    try:
        with anyio.fail_after(60):
            await ex.run(["true"], timeout_s=30)
            job = ex.job_id
            await until(lambda: job not in " ".join(slurm_cluster.jobs()), 20)
            # The next call notices and gets a new allocation.
            assert (await ex.run(["echo", "ok"], timeout_s=30)).stdout == "ok\n"
            assert ex.job_id not in (None, job)
    finally:
        await ex.aclose()
    released(slurm_cluster)


async def test_the_lab_deals_its_tasks_over_both_gpus_and_merges_the_parts(
    launcher: Launcher, tmp_path: Path, slurm_cluster: Cluster
) -> None:
    opts = LabOptions(
        tasks=["rmsnorm_gate", "swiglu"], quick=True, max_cases=1, repeats=1, ncu=False,
        compile=False, budget_s=120,
    )  # fmt: skip
    with anyio.fail_after(300):
        results = await run_lab(launcher, opts, tmp_path / "lab")
    parts = results["info"]["parts"]
    assert sorted((p["gpu_index"], tuple(p["tasks"])) for p in parts) == [
        ("0", ("rmsnorm_gate",)),
        ("1", ("swiglu",)),
    ]
    assert set(results["tasks"]) == {"rmsnorm_gate", "swiglu"}
    by_task = {(r["task"], r["gpu_index"], r["host"]) for r in results["rows"]}
    assert by_task == {
        ("rmsnorm_gate", "0", slurm_cluster.node),
        ("swiglu", "1", slurm_cluster.node),
    }
    assert "incomplete" not in results["info"]
