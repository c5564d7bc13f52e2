"""An agent process: its own process group, output capped into files, killed with everything
it started on timeout or cancel (and whatever it leaves in its group when it exits)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel

from ..errors import EnvironmentProblem
from ..execution import procgroup

OUTPUT_CAP_BYTES = 4 << 20
TAIL_BYTES = 64 << 10
DRAIN_S = 5.0  # output still in the pipes after the agent exited


class _CappedFile:
    """Writes the first `cap` bytes, then keeps only a tail; `close` appends the tail. The file
    is made when the process started (`open`), not before."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.fh: BinaryIO | None = None
        self.cap = cap
        self.written = 0
        self.tail = bytearray()
        self.dropped = 0

    def open(self) -> None:
        self.fh = open(self.path, "wb")  # noqa: SIM115 - closed by close()

    def write(self, chunk: bytes) -> None:
        assert self.fh is not None, "written before open"
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
        if self.fh is None:
            return
        if self.tail:
            if self.dropped:
                self.fh.write(f"\n[... {self.dropped} bytes dropped ...]\n".encode())
            self.fh.write(bytes(self.tail))
        self.fh.close()


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
    exits, whatever it left in its group is killed (tools/execution/procgroup.py)."""
    out = _CappedFile(stdout_file, cap_bytes)
    err = _CappedFile(stderr_file, cap_bytes)
    started: list[int] = []

    def record_start(pid: int) -> None:
        started.append(pid)
        out.open()
        err.open()
        if on_start is not None:
            on_start(pid)

    try:
        done = await procgroup.run(
            argv,
            cwd=cwd,
            env={**os.environ, **env},
            timeout_s=timeout_s,
            keep_bytes=0,  # the files keep it
            stdout_to=out.write,
            stderr_to=err.write,
            drain_s=DRAIN_S,
            on_start=record_start,
        )
    except OSError as exc:
        raise EnvironmentProblem(
            f"could not start {argv[0]!r}: {exc}",
            next_step="check the agent command (--agent-cmd) and that its program is installed",
        ) from exc
    finally:
        out.close()
        err.close()
        if on_exit is not None and started:
            on_exit(started[0])
    return ProcessOutcome(
        exit_code=done.returncode,
        timed_out=done.timed_out,
        duration_s=done.duration_s,
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
