"""The process-group runner: what it kills, when, and that its pipes never stall a child."""

from __future__ import annotations

import os
import signal
import sys

import anyio
import pytest

from harnesslab.tools.execution.procgroup import KILL_GRACE_S, ProcessGroup, run

from .procs import live_group, wait_until


@pytest.fixture
def anyio_backend():
    return "asyncio"


def alive(pid: int) -> bool:
    """Whether pid is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


async def assert_group_gone(pgid: int) -> None:
    """Group pgid has no live process within 5 s (what is left is killed, so no test leaks)."""
    try:
        await wait_until(lambda: not live_group(pgid), timeout_s=5)
    finally:
        if live_group(pgid):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.anyio
async def test_a_grandchild_that_outlives_its_parent_is_killed_with_the_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # The leader starts a child that starts a sleeper in the background and exits; then the
    # leader exits too. The sleeper, two generations down, is still in the leader's group.
    script = f"sh -c 'sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}'; echo leader-done"
    pid = 0
    try:
        with anyio.fail_after(30):
            done = await run(["sh", "-c", script], timeout_s=60)
        pid = int(pidfile.read_text())
        assert done.returncode == 0 and not done.timed_out
        assert done.stdout.strip() == "leader-done"
        await wait_until(lambda: not alive(pid), timeout_s=5)
    finally:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.anyio
async def test_the_deadline_kills_the_group_and_reports_timed_out(tmp_path):
    pidfile = tmp_path / "pgid"
    started: list[int] = []
    with anyio.fail_after(30):
        done = await run(
            ["sh", "-c", f"ps -o pgid= -p $$ > {pidfile}; sleep 300 & sleep 300"],
            timeout_s=1.0,
            on_start=started.append,
        )
    assert done.timed_out and done.returncode is None
    assert done.duration_s < 1.0 + 2 * KILL_GRACE_S + 5
    pgid = int(pidfile.read_text())
    assert pgid == started[0]  # the child leads its own group
    await assert_group_gone(pgid)


@pytest.mark.anyio
async def test_output_larger_than_a_pipe_buffer_on_both_streams_does_not_deadlock():
    size = 4 << 20  # 4 MiB on each stream; a pipe holds 64 KiB
    program = (
        "import sys\n"
        f"for i in range({size} // 1024):\n"
        "    sys.stdout.write('o' * 1023 + '\\n'); sys.stderr.write('e' * 1024)\n"
        "sys.stdout.write('END')\n"
    )
    lines: list[str] = []
    with anyio.fail_after(60):
        done = await run(
            [sys.executable, "-c", program], timeout_s=30, keep_bytes=1 << 20, on_line=lines.append
        )
    assert done.returncode == 0 and not done.timed_out
    assert len(lines) == size // 1024 + 1 and lines[-1] == "END"  # the last line has no newline
    assert len(done.stdout) == 1 << 20 and done.stdout.endswith("o\nEND")  # the tail is kept
    assert len(done.stderr) == 1 << 20


@pytest.mark.anyio
async def test_a_process_that_ignores_term_is_killed_after_the_grace():
    group = await ProcessGroup.spawn(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
         "; print('ready', flush=True); time.sleep(300)"],
    )  # fmt: skip
    try:
        assert group.process.stdout is not None
        with anyio.fail_after(20):
            assert b"ready" in await group.process.stdout.receive()
            before = anyio.current_time()
            await group.terminate(grace_s=0.5)
        assert group.returncode == -signal.SIGKILL  # TERM did nothing; KILL ended it
        assert anyio.current_time() - before >= 0.5
    finally:
        await group.kill(grace_s=0.5)


@pytest.mark.anyio
async def test_a_cancelled_run_kills_the_group_and_reraises(tmp_path):
    pidfile = tmp_path / "pgid"
    with anyio.move_on_after(1.0) as scope:
        await run(["sh", "-c", f"ps -o pgid= -p $$ > {pidfile}; sleep 300"], timeout_s=60)
    assert scope.cancelled_caught
    await assert_group_gone(int(pidfile.read_text()))


@pytest.mark.anyio
async def test_a_child_killed_by_a_signal_reports_that_signal():
    with anyio.fail_after(20):
        done = await run(["sh", "-c", "echo bye; kill -KILL $$"], timeout_s=10)
    assert done.signal == signal.SIGKILL and done.returncode == -signal.SIGKILL
    assert not done.timed_out and done.stdout == "bye\n"
    with anyio.fail_after(20):
        assert (await run(["sh", "-c", "exit 3"], timeout_s=10)).signal is None
