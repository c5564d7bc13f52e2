"""One process-group runner for every child this machine starts: the local executor's commands
and warm workers, agent processes, the clean room's MCP driver (and through the executor the
compile pool's workers).

A child starts in a new session, so it leads its own process group and everything it starts
stays in that group unless it leaves it (setsid). `run` streams its output while it runs, holds
a deadline, and on a timeout or a cancel kills the whole group: TERM, then KILL after a grace
period. When the leader exits by itself, whatever it left in its group is KILLed too, which
also closes the pipes a background child would otherwise hold open until the deadline. Every
child is reaped and its pipes closed before `run` returns or `ProcessGroup.kill` ends.

Side of the trust boundary: trusted (it decides nothing; what the child prints is handed on as
bytes and lines for the caller to judge).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

KILL_GRACE_S = 2.0
PIPE, DEVNULL = subprocess.PIPE, subprocess.DEVNULL
LineSink = Callable[[str], Awaitable[None] | None]
ChunkSink = Callable[[bytes], Awaitable[None] | None]


async def emit(sink: Callable[[Any], Awaitable[None] | None], value: Any) -> None:
    """Call a sink that may be a plain function or a coroutine function."""
    maybe = sink(value)
    if maybe is not None:
        await maybe


def kill_group(pid: int, sig: int) -> None:
    """Send `sig` to process group `pid`; a group that is gone (or not ours) is no error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Capture:
    """One output stream as it arrives: its last `limit` bytes kept (the end of a log says what
    went wrong), each complete line handed to `on_line`, each chunk to `sink`."""

    def __init__(
        self, limit: int, *, on_line: LineSink | None = None, sink: ChunkSink | None = None
    ) -> None:
        self.limit = limit
        self.on_line = on_line
        self.sink = sink
        self.kept = bytearray()
        self._pending = b""

    async def feed(self, chunk: bytes) -> None:
        if self.limit > 0:
            self.kept.extend(chunk)
            if len(self.kept) > self.limit:
                del self.kept[: len(self.kept) - self.limit]
        if self.sink is not None:
            await emit(self.sink, chunk)
        if self.on_line is not None:
            *lines, self._pending = (self._pending + chunk).split(b"\n")
            for line in lines:
                await emit(self.on_line, line.decode(errors="replace"))

    async def end(self) -> None:
        """The stream ended: a last line without a newline still counts."""
        if self.on_line is not None and self._pending:
            await emit(self.on_line, self._pending.decode(errors="replace"))
        self._pending = b""

    def text(self) -> str:
        return self.kept.decode(errors="replace")


@dataclass(frozen=True)
class Finished:
    """How a `run` ended. `returncode`: the child's (negative N: killed by signal N), None when
    the deadline killed it. `stdout`/`stderr`: their last `keep_bytes` bytes."""

    returncode: int | None
    timed_out: bool
    duration_s: float
    stdout: str
    stderr: str

    @property
    def signal(self) -> int | None:
        """The signal that killed the child, None if it exited (or timed out)."""
        code = self.returncode
        return -code if code is not None and code < 0 else None


class ProcessGroup:
    """A child started in a new session: it leads process group `pid`."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.pid = process.pid
        self._killed = False

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
        stdin: int = PIPE,
        stdout: int = PIPE,
        stderr: int | str | Path = PIPE,
    ) -> ProcessGroup:
        """Start argv in a new session. `stdin`/`stdout`: PIPE or DEVNULL; `stderr`: PIPE,
        DEVNULL or a file it is appended to. OSError when it cannot start."""
        if not isinstance(stderr, int):
            with open(stderr, "ab") as errlog:  # the child keeps its own copy
                return await cls.spawn(
                    argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=errlog.fileno()
                )
        process = await anyio.open_process(
            argv,
            cwd=None if cwd is None else str(cwd),
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        return cls(process)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def killed(self) -> bool:
        """Whether `kill` was called."""
        return self._killed

    async def wait(self, timeout_s: float = KILL_GRACE_S) -> int | None:
        """The leader's exit status once it exits within `timeout_s` (shielded), else None."""
        with anyio.move_on_after(timeout_s, shield=True):
            await self.process.wait()
        return self.process.returncode

    async def terminate(self, grace_s: float = KILL_GRACE_S) -> None:
        """TERM the group, wait up to grace_s for the leader, then KILL the group (stragglers
        the leader left behind included) and wait once more. Shielded from cancellation."""
        kill_group(self.pid, signal.SIGTERM)
        await self.wait(grace_s)
        kill_group(self.pid, signal.SIGKILL)
        await self.wait(grace_s)

    async def release(self) -> None:
        """Close the pipes and reap the leader (bounded, shielded). A pipe left open keeps
        asyncio's transport alive past its event loop, and the collector then fails on it
        wherever it runs (tests/conftest.py collects per test file to catch that)."""
        with anyio.move_on_after(KILL_GRACE_S, shield=True):
            await self.process.aclose()

    async def kill(self, grace_s: float = KILL_GRACE_S) -> None:
        """Terminate the group and release the leader; safe to call twice."""
        if self._killed:
            return
        self._killed = True
        with anyio.CancelScope(shield=True):
            await self.terminate(grace_s)
            await self.release()


async def _drain(stream: Any, capture: Capture) -> None:
    if stream is None:
        return
    async for chunk in stream:
        await capture.feed(chunk)
    await capture.end()


async def run(
    argv: list[str],
    *,
    timeout_s: float,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
    keep_bytes: int = 8 << 20,
    on_line: LineSink | None = None,
    stdout_to: ChunkSink | None = None,
    stderr_to: ChunkSink | None = None,
    drain_s: float = KILL_GRACE_S,
    on_start: Callable[[int], None] | None = None,
) -> Finished:
    """Run argv in its own process group until it exits or `timeout_s` passes.

    `stdin`: bytes written to it then closed (None: /dev/null). Output streams while the child
    runs: each stdout line to `on_line`, each chunk of stdout/stderr to `stdout_to`/`stderr_to`;
    the last `keep_bytes` of each are returned. When the leader exits, its group is KILLed and
    output still in the pipes is read for up to `drain_s` (a child that left the group may hold
    them open). The deadline kills the group (TERM, then KILL) and returns timed_out=True; a
    cancel kills it and re-raises. `on_start(pid)` once it started. OSError when it cannot."""
    started = time.perf_counter()
    group = await ProcessGroup.spawn(
        argv, cwd=cwd, env=env, stdin=PIPE if stdin is not None else DEVNULL
    )
    process = group.process
    out = Capture(keep_bytes, on_line=on_line, sink=stdout_to)
    err = Capture(keep_bytes, sink=stderr_to)
    timed_out = False
    try:
        if on_start is not None:
            on_start(group.pid)
        with anyio.move_on_after(timeout_s) as deadline:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, process.stdout, out)
                tg.start_soon(_drain, process.stderr, err)
                if stdin is not None and process.stdin is not None:
                    try:
                        await process.stdin.send(stdin)
                        await process.stdin.aclose()
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass  # it exited without reading all of it: its exit status says why
                await process.wait()
                # The leader is gone; children left in its group must not linger, nor keep the
                # output pipes (and so this call) open until the deadline.
                kill_group(group.pid, signal.SIGKILL)
                # One that left the group (setsid) may still hold the pipes: read what is there
                # for `drain_s`, then stop waiting for it.
                tg.cancel_scope.deadline = anyio.current_time() + drain_s
        if deadline.cancelled_caught:
            timed_out = True
            await group.terminate()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await group.terminate()
        raise
    finally:
        await group.release()
    return Finished(
        returncode=None if timed_out else process.returncode,
        timed_out=timed_out,
        duration_s=time.perf_counter() - started,
        stdout=out.text(),
        stderr=err.text(),
    )


__all__ = [
    "DEVNULL",
    "KILL_GRACE_S",
    "PIPE",
    "Capture",
    "ChunkSink",
    "Finished",
    "LineSink",
    "ProcessGroup",
    "emit",
    "kill_group",
    "run",
]
