"""An agent process: its own process group, output capped into files, killed with everything
it started on timeout or cancel (and whatever it leaves in its group when it exits)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from ..errors import EnvironmentProblem
from ..execution.executor import kill_group, release, terminate_group

OUTPUT_CAP_BYTES = 4 << 20
TAIL_BYTES = 64 << 10
DRAIN_S = 5.0  # output still in the pipes after the agent exited


class _CappedFile:
    """Writes the first `cap` bytes, then keeps only a tail; `close` appends the tail."""

    def __init__(self, path: Path, cap: int) -> None:
        self.fh = open(path, "wb")
        self.cap = cap
        self.written = 0
        self.tail = bytearray()
        self.dropped = 0

    def write(self, chunk: bytes) -> None:
        room = self.cap - self.written
        if room > 0:
            head = chunk[:room]
            self.fh.write(head)
            self.fh.flush()
            self.written += len(head)
            chunk = chunk[room:]
        if chunk:
            self.tail.extend(chunk)
            if len(self.tail) > TAIL_BYTES:
                self.dropped += len(self.tail) - TAIL_BYTES
                del self.tail[: len(self.tail) - TAIL_BYTES]

    def close(self) -> None:
        if self.tail:
            if self.dropped:
                self.fh.write(f"\n[... {self.dropped} bytes dropped ...]\n".encode())
            self.fh.write(bytes(self.tail))
        self.fh.close()


async def _pump(stream: Any, sink: _CappedFile, done: anyio.Event) -> None:
    try:
        if stream is not None:
            async for chunk in stream:
                sink.write(chunk)
    finally:
        done.set()


class ProcessOutcome(BaseModel):
    exit_code: int | None
    timed_out: bool
    duration_s: float
    dropped_bytes: int


async def run_process(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    stdout_file: Path,
    stderr_file: Path,
    cap_bytes: int = OUTPUT_CAP_BYTES,
    on_start: Callable[[int], None] | None = None,
    on_exit: Callable[[int], None] | None = None,
) -> ProcessOutcome:
    """Run argv in a new process group with output capped into files. A timeout kills the group
    (TERM, then KILL) and returns timed_out=True; a cancel kills it and re-raises; when the leader
    exits, whatever it left in its group is killed."""
    started = time.perf_counter()
    try:
        process = await anyio.open_process(
            argv,
            cwd=str(cwd),
            env={**os.environ, **env},
            start_new_session=True,
            stdin=-3,  # DEVNULL: an agent waiting for keyboard input would hang until timeout
        )
    except OSError as exc:
        raise EnvironmentProblem(
            f"could not start {argv[0]!r}: {exc}",
            next_step="check the agent command (--agent-cmd) and that its program is installed",
        ) from exc
    if on_start is not None:
        on_start(process.pid)
    out = _CappedFile(stdout_file, cap_bytes)
    err = _CappedFile(stderr_file, cap_bytes)
    timed_out = False
    try:
        with anyio.move_on_after(timeout_s) as scope:
            async with anyio.create_task_group() as tg:
                done = [anyio.Event(), anyio.Event()]
                tg.start_soon(_pump, process.stdout, out, done[0])
                tg.start_soon(_pump, process.stderr, err, done[1])
                await process.wait()
                # The leader is gone: whatever it left in its group goes too, which also closes
                # the pipes a background child would otherwise hold open until the timeout.
                kill_group(process.pid, signal.SIGKILL)
                with anyio.move_on_after(DRAIN_S):
                    for ev in done:
                        await ev.wait()
                tg.cancel_scope.cancel()
        if scope.cancelled_caught:
            timed_out = True
            await terminate_group(process)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await terminate_group(process)
        raise
    finally:
        out.close()
        err.close()
        await release(process)
        if on_exit is not None:
            on_exit(process.pid)
    return ProcessOutcome(
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        duration_s=time.perf_counter() - started,
        dropped_bytes=out.dropped + err.dropped,
    )


class ProbeOutcome(BaseModel):
    """A short command's exit status and output (an agent CLI's --version, --help, status)."""

    argv: list[str]
    exit_code: int | None
    timed_out: bool
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 3) -> str:
        """The last lines of stderr, else of stdout: where a CLI says what went wrong."""
        for text in (self.stderr, self.stdout):
            kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
            if kept:
                return " | ".join(kept[-lines:])[:500]
        return ""


async def probe(
    argv: list[str], *, env: dict[str, str], timeout_s: float, cwd: Path | None = None
) -> ProbeOutcome:
    """Run a short command the same way as an agent (own process group, stdin closed, output
    capped, killed on timeout) and return its output. Raises EnvironmentProblem when argv[0]
    cannot be started."""
    with tempfile.TemporaryDirectory(prefix="harnesslab-probe-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = await run_process(
            argv,
            cwd=cwd or Path(tmp),
            env=env,
            timeout_s=timeout_s,
            stdout_file=out,
            stderr_file=err,
            cap_bytes=1 << 20,
        )
        return ProbeOutcome(
            argv=argv,
            exit_code=proc.exit_code,
            timed_out=proc.timed_out,
            stdout=out.read_text(errors="replace"),
            stderr=err.read_text(errors="replace"),
        )


__all__ = ["OUTPUT_CAP_BYTES", "ProbeOutcome", "ProcessOutcome", "probe", "run_process"]
