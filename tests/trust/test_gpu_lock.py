"""Attack (or accident): two servers on one workspace, or a server and a CLI verify, time on the
same GPU at once and each other's numbers are noise. Every runner call that times holds a lock
file for its (host, GPU); a waiter says who holds it."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream
from mcp import Client

from harnesslab.servers.builtin import ServerState
from harnesslab.servers.task_server import build_task_server
from harnesslab.tests.conftest_shared import flock_free, small_rmsnorm
from harnesslab.tests.ssh_testserver import serve_loopback
from harnesslab.tools.execution.executor import LocalExecutor
from harnesslab.tools.execution.gpu_lock import lock_path
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.execution.ssh import SSHExecutor
from harnesslab.tools.gpu.verify.phase_lock import WAITING as PHASE_WAITING
from harnesslab.tools.integrity.verify import guarded_verify
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import TaskSpec, load_task

from .support import SMALL, init_ws

pytestmark = pytest.mark.anyio
WAITING = re.compile(r"waiting for GPU 0 \(held by pid (\d+)\)")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fake_settings(tmp: Path) -> Settings:
    """Settings whose runner interpreter, here and on the "GPU host", is
    tests/trust/fake_runner.py (fresh processes); `python -c` (the lock holder) stays Python."""
    wrapper = tmp / "fake-python"
    runner = Path(__file__).with_name("fake_runner.py")
    wrapper.write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\n'
        f'exec {sys.executable} {runner} "$@"\n'
    )
    wrapper.chmod(0o755)
    return Settings(
        state_dir=tmp / "state", python=str(wrapper), remote_python=str(wrapper), warm_workers=False
    )


@contextlib.asynccontextmanager
async def two_launchers(kind: str, tmp: Path, settings: Settings) -> AsyncIterator[list[Launcher]]:
    """Two servers' launchers for GPU 0 of one host: this machine, or an SSH host (an asyncssh
    server on loopback that runs commands here, both clients with their own connections)."""
    if kind == "local":
        yield [Launcher(settings), Launcher(settings)]
        return
    async with await serve_loopback(tmp / "remote") as remote:
        root = str(tmp / "remote_root")
        yield [Launcher(settings, [SSHExecutor(remote.target(remote_root=root))]) for _ in "ab"]


@pytest.mark.parametrize("kind", ["local", "ssh"])
async def test_two_launchers_never_time_on_one_gpu_at_once(tmp_path, monkeypatch, kind):
    sock = tmp_path / "runner.sock"
    monkeypatch.setenv("FAKE_RUNNER_SOCKET", str(sock))
    settings = fake_settings(tmp_path)
    task = load_task("rmsnorm_gate")
    async with two_launchers(kind, tmp_path, settings) as (first, second):
        await one_at_a_time(first, second, task, sock)


async def one_at_a_time(first: Launcher, second: Launcher, task: TaskSpec, sock: Path) -> None:
    started_tx, started_rx = anyio.create_memory_object_stream[SocketStream](4)
    heard: list[str] = []
    waiting = anyio.Event()

    async def on_event(ev: dict[str, Any]) -> None:
        if ev.get("event") == "waiting":
            heard.append(ev["message"])
            waiting.set()

    async def runner_started(stream: SocketStream) -> None:
        await stream.receive()
        await started_tx.send(stream)

    results: list[Any] = []

    async def run(launcher: Launcher, **kw: Any) -> None:
        results.append(await launcher.call({"mode": "health"}, task=task, **kw))

    with anyio.fail_after(60):
        listener = await anyio.create_unix_listener(sock)
        async with listener, anyio.create_task_group() as serving:
            serving.start_soon(listener.serve, runner_started)
            async with anyio.create_task_group() as calls:
                calls.start_soon(run, first)
                a = await started_rx.receive()  # the first run holds GPU 0
                calls.start_soon(functools.partial(run, second, on_event=on_event))
                await waiting.wait()  # the second waits for it...
                assert started_rx.statistics().current_buffer_used == 0  # ...not started
                await a.send(b"go")
                b = await started_rx.receive()  # it starts once the first has finished
                await b.send(b"go")
            serving.cancel_scope.cancel()
    assert [r.result["status"] for r in results] == ["passed", "passed"]
    await first.aclose()
    await second.aclose()
    (message,) = heard
    holder = WAITING.fullmatch(message)
    assert holder is not None
    if isinstance(first.slots[0].executor, LocalExecutor):
        assert int(holder.group(1)) == os.getpid()


async def test_a_tool_waiting_for_the_gpu_says_who_holds_it(tmp_path, monkeypatch, capsys):
    root = init_ws(tmp_path, monkeypatch, capsys)
    monkeypatch.delenv("FAKE_RUNNER_SOCKET", raising=False)
    settings = fake_settings(tmp_path)
    other = Launcher(settings)  # another process's run, as far as the lock file knows
    state = ServerState.open(root, settings)
    progress: list[str] = []
    told = anyio.Event()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")
        if WAITING.fullmatch(message or ""):
            told.set()

    with anyio.fail_after(60):
        async with Client(build_task_server(state)) as client:
            result: list[Any] = []
            async with anyio.create_task_group() as tg:
                async with other.hold(other.slots[0]):

                    async def objective() -> None:
                        result.append(
                            await client.call_tool(
                                "run_objective", {"cases": [SMALL]}, progress_callback=on_progress
                            )
                        )

                    tg.start_soon(objective)
                    await told.wait()
                    assert result == []  # still waiting while the GPU is held
            assert not result[0].is_error
    await state.aclose()
    await other.aclose()
    assert any(WAITING.fullmatch(m) for m in progress)


@pytest.mark.parametrize("kind", ["local", "ssh"])
async def test_a_waiter_that_gives_up_never_takes_the_gpu_later(tmp_path, kind):
    settings = fake_settings(tmp_path)
    async with two_launchers(kind, tmp_path, settings) as (first, second):
        waiting = anyio.Event()

        async def wait_for_gpu() -> None:
            async with second.hold(second.slots[0], on_wait=lambda _msg: waiting.set()):
                pytest.fail("the GPU was held by the first launcher")

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                async with first.hold(first.slots[0]):
                    tg.start_soon(wait_for_gpu)
                    await waiting.wait()
                    tg.cancel_scope.cancel()  # the second gives up while the first holds it
            async with first.hold(first.slots[0]):  # free again, not taken by a ghost
                pass
        await first.aclose()
        await second.aclose()


async def test_a_guarded_verify_works_beside_others_and_queues_only_to_time(tmp_path):
    """Four verifies at once used to queue whole (each held the GPU for all of its ~20 s): a
    verify now holds the lock file shared while it works, so other verifies' untimed work runs
    beside it while nobody times, and it waits like any caller while another process times."""
    settings = Settings(state_dir=tmp_path / "state", interpret="always", warm_workers=False)
    task = small_rmsnorm(tmp_path / "rmsnorm_small")  # how the lock is held, not what is verified
    ws = init_workspace(str(task), tmp_path / "ws", settings)
    timing_run, launcher = Launcher(settings), Launcher(settings)
    path = lock_path(settings, launcher.slots[0].executor.host, 0)
    queued = anyio.Event()
    verdicts: list[Any] = []
    seen: set[tuple[bool, bool]] = set()

    async def on_progress(done: float, total: float, message: str) -> None:
        if message == PHASE_WAITING.format(gpu=0):
            queued.set()

    async def verify() -> None:
        verdicts.append(await guarded_verify(ws, launcher, settings, progress=on_progress))

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            async with timing_run.hold(timing_run.slots[0]):  # a run_objective times on GPU 0
                tg.start_soon(verify)
                await queued.wait()  # the verify says it waits, and does
            while not verdicts:  # then it works: watch how it holds the lock file
                seen.add((flock_free(path, fcntl.LOCK_SH), flock_free(path, fcntl.LOCK_EX)))
                await anyio.sleep(0.02)
    await launcher.aclose()
    await timing_run.aclose()
    assert verdicts[0].verdict == "passed", verdicts[0].reasons
    # held shared: another verify could work beside it, a timing run could not start
    assert (True, False) in seen
    assert flock_free(path, fcntl.LOCK_EX)  # and released at the end
