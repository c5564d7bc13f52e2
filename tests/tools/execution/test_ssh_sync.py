"""The SSH executor's sync through its long-lived helper (tools/execution/ssh_sync.py), against a
real OpenSSH sshd and the in-process asyncssh server: a sync after the first opens no command
channel, yet every sync still sees what changed on the host; a helper that is gone is replaced;
aclose leaves none behind. Remote and local are the same machine here."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tests.sshd_fixtures import SSHHost
from harnesslab.tests.tools.execution.procs import live_group, wait_until
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.execution import ssh_sync
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.execution.ssh import SSHExecutor
from harnesslab.tools.settings import Settings

pytestmark = pytest.mark.ssh

SKIP = ("scratch", "tcache")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def counted(host: SSHHost) -> AsyncIterator[tuple[SSHExecutor, list[list[str]]]]:
    """An executor whose commands (each an SSH exec: run's and start's) are recorded."""
    ex = SSHExecutor(host.target())
    spawned: list[list[str]] = []
    spawn = ex._spawn

    async def recording(entry, argv, cwd, env):  # type: ignore[no-untyped-def]
        spawned.append(list(argv))
        return await spawn(entry, argv, cwd, env)

    ex._spawn = recording  # type: ignore[method-assign]
    try:
        with anyio.fail_after(60):
            await ex.connect()
            yield ex, spawned
    finally:
        await ex.aclose()


def helper_group(ex: SSHExecutor) -> int:
    """The process group of the executor's sync helper (its run base's pid file)."""
    proc = ex._sync._proc
    assert proc is not None
    return int(Path(f"{proc._base}.pid").read_text())


def stage(tmp_path: Path) -> Path:
    local = tmp_path / "stage"
    (local / "harness").mkdir(parents=True)
    (local / "harness" / "runner.py").write_text("runner = 1\n")
    (local / "tasks").mkdir()
    (local / "tasks" / "reference.py").write_text("ref = 1\n")
    return local


@asynccontextmanager
async def synced(
    host: SSHHost, tmp_path: Path
) -> AsyncIterator[tuple[SSHExecutor, list[list[str]], Path, Path]]:
    """counted's executor once stage(tmp_path) is synced to its "stage" folder: (executor,
    its commands, the local folder, the host's)."""
    local = stage(tmp_path)
    async with counted(host) as (ex, spawned):
        remote = Path(ex.path("stage"))
        await ex.sync_tree(local, str(remote))
        yield ex, spawned, local, remote


@pytest.mark.anyio
async def test_syncs_after_the_first_open_no_channel_and_still_see_every_change_on_the_host(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    local = stage(tmp_path)
    async with counted(ssh_host) as (ex, spawned):
        remote = Path(ex.path("stage"))
        first = await ex.sync_tree(local, str(remote), skip=SKIP)
        started = len(spawned)  # the helper's start
        unchanged = await ex.sync_tree(local, str(remote), skip=SKIP)
        (local / "harness" / "runner.py").write_text("runner = 2\n")
        edited_here = await ex.sync_tree(local, str(remote), skip=SKIP)
        (remote / "tasks" / "reference.py").write_text("tampered on the host\n")
        edited_there = await ex.sync_tree(local, str(remote), skip=SKIP)
        (remote / "harness" / "runner.py").unlink()
        deleted_there = await ex.sync_tree(local, str(remote), skip=SKIP)
        (local / "tasks" / "reference.py").unlink()
        (remote / "tcache").mkdir()
        (remote / "tcache" / "k.bin").write_text("the host's own\n")
        (remote / "tasks" / "out.log").write_text("the host's own\n")
        deleted_here = await ex.sync_tree(local, str(remote), skip=SKIP)
        again = await ex.sync_tree(local, str(remote), skip=SKIP)
    assert first == ["harness/runner.py", "tasks/reference.py"] and started == 1
    assert spawned[1:] == []  # every later step ran in the helper
    assert unchanged == [] and again == []
    assert edited_here == ["harness/runner.py"]
    assert edited_there == ["tasks/reference.py"] and deleted_there == ["harness/runner.py"]
    assert (remote / "harness" / "runner.py").read_text() == "runner = 2\n"
    assert deleted_here == [] and not (remote / "tasks" / "reference.py").exists()
    assert (remote / "tcache" / "k.bin").read_text() == "the host's own\n"
    assert (remote / "tasks" / "out.log").read_text() == "the host's own\n"


@pytest.mark.anyio
async def test_a_helper_killed_on_the_host_is_replaced_and_the_sync_stays_right(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    async with synced(ssh_host, tmp_path) as (ex, _spawned, local, remote):
        pgid = helper_group(ex)
        os.killpg(pgid, signal.SIGKILL)
        await wait_until(lambda: not live_group(pgid), 10)
        await wait_until(lambda: ex.channels_held() == 0, 10)  # its channel is free again
        (local / "harness" / "runner.py").write_text("runner = 3\n")
        sent = await ex.sync_tree(local, str(remote))
        replaced = await ex.sync_tree(local, str(remote))
        held = ex.channels_held()
        assert helper_group(ex) != pgid
    assert sent == ["harness/runner.py"] and replaced == []
    assert (remote / "harness" / "runner.py").read_text() == "runner = 3\n"
    assert held == 1


@pytest.mark.anyio
async def test_a_sync_cancelled_mid_reply_kills_its_helper_and_the_next_one_works(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    async with synced(ssh_host, tmp_path) as (ex, _spawned, local, remote):
        pgid = helper_group(ex)
        proc = ex._sync._proc
        assert proc is not None
        waiting = anyio.Event()

        async def never(sep: bytes, max_bytes: int = 0) -> bytes | None:
            waiting.set()
            await anyio.sleep_forever()
            return None

        proc.receive_until = never  # type: ignore[method-assign]
        (local / "harness" / "runner.py").write_text("runner = 4\n")
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.sync_tree, local, str(remote))
            await waiting.wait()
            tg.cancel_scope.cancel()
        await wait_until(lambda: not live_group(pgid), 10)
        sent = await ex.sync_tree(local, str(remote))
    assert sent == ["harness/runner.py"]
    assert (remote / "harness" / "runner.py").read_text() == "runner = 4\n"


@pytest.mark.anyio
async def test_aclose_leaves_no_sync_helper_running(ssh_host: SSHHost, tmp_path: Path) -> None:
    async with synced(ssh_host, tmp_path) as (ex, _spawned, _local, _remote):
        pgid = helper_group(ex)
        assert live_group(pgid)
    await wait_until(lambda: not live_group(pgid), 10)


@pytest.mark.anyio
async def test_a_failed_step_is_reported_and_the_helper_serves_the_next_sync(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    local = stage(tmp_path)
    async with counted(ssh_host) as (ex, spawned):
        remote = Path(ex.path("stage"))
        remote.parent.mkdir(parents=True, exist_ok=True)
        (remote.parent / "a-file").write_text("not a folder\n")
        with pytest.raises(ExecutorError) as failed:
            await ex.sync_tree(local, str(remote.parent / "a-file" / "stage"))
        sent = await ex.sync_tree(local, str(remote))
    assert failed.value.kind == "remote_env" and "exit 1" in str(failed.value)
    assert failed.value.stderr_tail  # mkdir's complaint, through the helper's stderr frame
    assert sent == ["harness/runner.py", "tasks/reference.py"]
    assert len(spawned) == 1


@pytest.mark.anyio
async def test_odd_names_on_the_host_and_a_folder_name_with_a_newline_sync_right(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    async with synced(ssh_host, tmp_path) as (ex, spawned, local, remote):
        # host-made names that look like the listing's and the reply's framing, or no text
        (remote / "tasks" / "x\n@@HL-STAT@@\ny").write_text("host\n")
        (remote / "tasks" / "\n0123 0\n").write_text("host\n")
        os.close(os.open(bytes(remote / "tasks") + b"/\xff.bin", os.O_CREAT | os.O_WRONLY))
        (local / "tasks" / "reference.py").write_text("ref = 2\n")
        sent = await ex.sync_tree(local, str(remote))
        unchanged = await ex.sync_tree(local, str(remote))
        # a line per argument: a name with a newline goes through a command of its own
        odd = remote.parent / "odd\nstage"
        odd_sent = await ex.sync_tree(local, str(odd))
        (local / "harness" / "runner.py").unlink()  # the apply's arguments: the folder, a file
        odd_deleted = await ex.sync_tree(local, str(odd))
    assert sent == ["tasks/reference.py"] and unchanged == []
    assert odd_deleted == [] and not (odd / "harness" / "runner.py").exists()
    assert (remote / "tasks" / "reference.py").read_text() == "ref = 2\n"
    assert odd_sent == ["harness/runner.py", "tasks/reference.py"]
    assert (odd / "tasks" / "reference.py").read_text() == "ref = 2\n"
    assert len(spawned) == 5  # the helper, then the odd folder's steps


@pytest.mark.anyio
async def test_the_helpers_channel_counts_against_the_launchers_capacity(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    local = stage(tmp_path)
    async with counted(ssh_host) as (ex, _spawned):
        launcher = Launcher(Settings(state_dir=tmp_path / "state"), [ex])
        before = launcher.parallel_capacity()
        await ex.sync_tree(local, ex.path("stage"))
        after = launcher.parallel_capacity()
    assert before is not None and after == before - 1


@pytest.mark.anyio
async def test_an_apply_that_stops_early_still_takes_all_its_bytes(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    # more than a pipe holds: bytes the apply left unread would be read as the next request
    async with synced(ssh_host, tmp_path) as (ex, spawned, _local, remote):
        gone = ex.path("no-such-folder")
        failed = await ex._sync.run("apply", [gone], stdin=b"\n1\n2\n" * (1 << 18), timeout_s=5)
        listed = await ex._sync.run("state", [str(remote)], timeout_s=5)
    assert failed.exit_code == 1 and not failed.timed_out
    assert listed.exit_code == 0 and "harness/runner.py" in listed.stdout
    assert len(spawned) == 1


def test_the_local_scan_reuses_a_digest_only_for_a_file_settled_before_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.py").write_text("one\n")
    (root / "b.py").write_text("two\n")
    want = hashlib.sha256(b"one\n").hexdigest()
    known: dict[Path, Any] = {}
    assert ssh_sync._scan(root, known)["a.py"][0] == want
    assert known == {}  # just written: its time may still tick with the next write
    monkeypatch.setattr(ssh_sync, "RACY_NS", 0)  # every file settled
    ssh_sync._scan(root, known)
    stat, _digest = known[root / "a.py"]
    known[root / "a.py"] = (stat, "reused")
    assert ssh_sync._scan(root, known)["a.py"][0] == "reused"
    (root / "b.py").unlink()
    ssh_sync._scan(root, known)
    assert set(known) == {root / "a.py"}


def test_the_local_scan_sees_a_same_size_rewrite_whose_mtime_was_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.py").write_text("one\n")
    monkeypatch.setattr(ssh_sync, "RACY_NS", 0)  # every file settled: its digest is kept
    known: dict[Path, Any] = {}
    ssh_sync._scan(root, known)
    stored = known[root / "a.py"][0]
    # file times tick coarsely: wait (bounded) until a new write gets a later ctime
    probe = tmp_path / "probe"
    for _ in range(10_000):
        probe.write_text("tick")
        if probe.stat().st_ctime_ns > stored[4]:
            break
    else:
        pytest.fail("the file system's clock did not move")
    before = (root / "a.py").stat()
    (root / "a.py").write_text("two\n")
    os.utime(root / "a.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    assert ssh_sync._scan(root, known)["a.py"][0] == hashlib.sha256(b"two\n").hexdigest()


@pytest.mark.anyio
async def test_syncs_at_once_never_wait_for_the_helper_and_all_land(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    local = stage(tmp_path)
    async with counted(ssh_host) as (ex, spawned):
        await ex.sync_tree(local, ex.path("first"))
        results: dict[str, list[str]] = {}

        async def sync(name: str) -> None:
            results[name] = await ex.sync_tree(local, ex.path(name))

        async with anyio.create_task_group() as tg:
            for name in ("a", "b", "c"):
                tg.start_soon(sync, name)
        roots = [Path(ex.path(name)) for name in ("a", "b", "c")]
    assert all(sent == ["harness/runner.py", "tasks/reference.py"] for sent in results.values())
    assert all((r / "tasks" / "reference.py").read_text() == "ref = 1\n" for r in roots)
    assert len(spawned) > 1  # the helper was busy: the others ran their steps themselves


@pytest.mark.anyio
async def test_a_step_past_its_limit_is_timed_out_and_its_helper_killed(
    ssh_host: SSHHost, tmp_path: Path
) -> None:
    local = stage(tmp_path)
    async with counted(ssh_host) as (ex, _spawned):
        remote = ex.path("stage")
        await ex.sync_tree(local, remote)
        pgid = helper_group(ex)
        proc = ex._sync._proc
        assert proc is not None

        async def silent(sep: bytes, max_bytes: int = 0) -> bytes | None:
            await anyio.sleep_forever()
            return None

        proc.receive_until = silent  # type: ignore[method-assign]
        late = await ex._sync.run("state", [remote], timeout_s=0.5)
        await wait_until(lambda: not live_group(pgid), 10)
        listed = await ex._sync.run("state", [remote], timeout_s=10)
    assert late.timed_out and late.exit_code is None and late.stdout == ""
    assert listed.exit_code == 0 and "harness/runner.py" in listed.stdout


@pytest.mark.parametrize("cut", ["output", "status", "stderr", "garbled status"])
@pytest.mark.anyio
async def test_a_reply_cut_short_or_garbled_is_not_trusted_the_step_runs_as_a_command(
    ssh_host: SSHHost, tmp_path: Path, cut: str
) -> None:
    local = stage(tmp_path)
    async with counted(ssh_host) as (ex, spawned):
        remote = ex.path("stage")
        await ex.sync_tree(local, remote)
        pgid = helper_group(ex)
        proc = ex._sync._proc
        assert proc is not None
        receive = proc.receive_until
        parts = ["output", "status", "stderr"]

        async def cutting(sep: bytes, max_bytes: int = 64 << 20) -> bytes | None:
            got = await receive(sep, max_bytes)
            part = parts.pop(0)
            if part == cut:
                return None
            return b"zz" if cut == "garbled status" and part == "status" else got

        proc.receive_until = cutting  # type: ignore[method-assign]
        listed = await ex._sync.run("state", [remote], timeout_s=10)
        await wait_until(lambda: not live_group(pgid), 10)
    assert listed.exit_code == 0 and "harness/runner.py" in listed.stdout
    assert len(spawned) == 2  # the helper, then the step as a command of its own
