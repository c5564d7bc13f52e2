"""Fault injection over a real transport: SSH connections dropped (a real sshd, and the in-process
asyncssh server) and Slurm allocations cancelled, while a call runs and while the workers idle.
The blame must be the infrastructure's (tools/errors.py: retryable, nothing recorded of the
candidate), a call that never started is retried without a word, nothing is left running on
the host, and the next call works."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest

from harnesslab.tests.slurm_cluster import Cluster, slurm_settings
from harnesslab.tests.ssh_testserver import serve_loopback
from harnesslab.tests.sshd_fixtures import SSHHost
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.execution.backends import build_executors
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.execution.slurm import SlurmExecutor
from harnesslab.tools.execution.ssh import SSHExecutor
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace, init_workspace

SMALL = "1024x1024_fp16"
MARKER = "411.77"  # `sleep 411.77`: the slow candidate's child, to find leftovers by


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def slow_kernel(source: str) -> str:
    """The kernel with a child process and 8 s at import: a window to break the transport."""
    return (
        f'import subprocess, time\nsubprocess.Popen(["sleep", "{MARKER}"])\ntime.sleep(8)\n{source}'
    )


def leftovers() -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"sleep {MARKER}"], capture_output=True, text=True)
    return out.stdout.split()


async def worker_busy(launcher: Launcher) -> None:
    """Until the slot's warm worker exists (it takes the request at once), and a moment."""
    with anyio.fail_after(180):
        while launcher.slots[0].worker is None:
            await anyio.sleep(0.05)
    await anyio.sleep(1.5)


async def broken_mid_call(ws: Workspace, launcher: Launcher, breaks) -> list[ExecutorError]:
    """run_objective on the slow kernel while `breaks()` cuts its transport."""
    errors: list[ExecutorError] = []

    async def call() -> None:
        try:
            await run_objective(ws, launcher, cases=[SMALL])
        except ExecutorError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await worker_busy(launcher)
        breaks()
    return errors


@pytest.mark.anyio
async def test_a_warm_process_tells_a_lost_connection_from_its_own_death(ssh_host: SSHHost):
    """The primitives the launcher blames with (real sshd and asyncssh): a process whose
    connection dropped is `lost`; one killed by a signal on a live connection has its 128+N."""
    ex = SSHExecutor(ssh_host.target())
    try:
        with anyio.fail_after(60):
            await ex.connect()
            killed = await ex.start(["sh", "-c", "read line; kill -9 $$"])
            await killed.send_line("go")
            assert await killed.receive_line() is None
            assert (await killed.ended()).code == 137 and not killed.alive()
            await killed.kill()
            idle = await ex.start(["sh", "-c", "read line; echo got; sleep 60"])
            assert idle.alive()
            ssh_host.drop_connections()
            assert await idle.receive_line() is None
            ending = await idle.ended()
            assert ending.lost is not None and ending.lost.kind == "dropped"
            assert not idle.alive()
            await idle.kill()
            assert (await ex.run(["echo", "back"], timeout_s=30)).stdout == "back\n"
    finally:
        await ex.aclose()


@pytest.mark.slow
@pytest.mark.anyio
async def test_ssh_connections_dropped_idle_and_mid_call(tmp_path: Path):
    """The whole path on the in-process SSH server (it runs the runner as this user, so this
    interpreter's torch is what it imports; the real sshd logs in as another user)."""
    local = Settings(state_dir=tmp_path / "state", interpret="always")
    settings = local.model_copy(update={"remote_python": local.python})
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    source = (ws.root / "kernel.py").read_text()
    async with await serve_loopback(tmp_path / "remote") as remote:
        launcher = Launcher(
            settings, [SSHExecutor(remote.target(remote_root=str(tmp_path / "rr")))]
        )
        try:
            with anyio.fail_after(600):
                assert (await run_objective(ws, launcher, cases=[SMALL])).status == "passed"
                remote.drop_connections()  # while the warm worker idles
                again = await run_objective(ws, launcher, cases=[SMALL])
                assert again.status == "passed", again.reason  # before: "worker is gone"
                (ws.root / "kernel.py").write_text(slow_kernel(source))
                errors = await broken_mid_call(ws, launcher, remote.drop_connections)
                # before: a failed record "runner exited with None: worker died"
                assert [(e.kind, e.retryable) for e in errors] == [("dropped", True)]
                assert len(ws.ledger().records()) == 2  # the two passes; nothing of the third
                (ws.root / "kernel.py").write_text(source)
                assert (await run_objective(ws, launcher, cases=[SMALL])).status == "passed"
                while leftovers():  # the reconnect killed what the lost command left
                    await anyio.sleep(0.2)
        finally:
            await launcher.aclose()


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.anyio
async def test_slurm_allocations_cancelled_idle_and_mid_call(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    settings = slurm_settings(
        slurm_cluster, tmp_path / "state", interpret="always", python=Settings().python
    )
    launcher = Launcher(settings, build_executors(settings))
    (ex,) = launcher.executors
    assert isinstance(ex, SlurmExecutor)
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    source = (ws.root / "kernel.py").read_text()
    try:
        with anyio.fail_after(600):
            assert (await run_objective(ws, launcher, cases=[SMALL])).status == "passed"
            slurm_cluster.command("scancel", str(ex.job_id))  # while the worker idles
            again = await run_objective(ws, launcher, cases=[SMALL])  # on a new allocation
            assert again.status == "passed", again.reason  # before: two vague failures
            (ws.root / "kernel.py").write_text(slow_kernel(source))
            job = str(ex.job_id)
            errors = await broken_mid_call(
                ws, launcher, lambda: slurm_cluster.command("scancel", job)
            )
            assert [(e.kind, e.retryable) for e in errors] == [("allocation_lost", True)]
            assert "new allocation" in errors[0].next_step
            assert len(ws.ledger().records()) == 2
            (ws.root / "kernel.py").write_text(source)
            assert (await run_objective(ws, launcher, cases=[SMALL])).status == "passed"
            while leftovers():
                await anyio.sleep(0.2)
    finally:
        with anyio.fail_after(60):
            await launcher.aclose()
