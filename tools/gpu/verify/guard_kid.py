"""The guarded verify's handle on one sandboxed child process: the candidate's process
(guard_child.py) or a replayer (replay.py), started through sandbox.py with the verify's
policy, asked one request at a time, and told why it stopped (a sandbox limit, a crash, a
timeout) in the harness's own words.

Staged beside guard.py (standard library, never harnesslab). Trusted side: the parent of the
guarded verify holds it; nothing the child writes reaches a verdict but its reply frames, which
the parent judges. Siblings are imported by the one rule in runner.py's docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import wire
    from ..isolation import sandbox_policy as sp
else:  # imported by guard.py, from the staged folder on sys.path
    import sandbox_policy as sp
    import wire

T = TypeVar("T")
_perf = time.perf_counter
HERE = os.path.dirname(os.path.abspath(__file__))
# How long a sandbox's outer process may take to report what it applied (it does so before the
# target runs: a Python start and a few syscalls, well under a second on an idle host).
START_S = 30.0


class KidFailed(Exception):
    def __init__(self, code: str, detail: str, role: str) -> None:
        super().__init__(detail)
        self.code, self.role = code, role


def stage_root() -> str:
    """The stage folder (this file lives in <stage>/harness)."""
    return os.path.dirname(HERE)


class Kid:
    """A sandboxed child: the candidate's process (guard_child.py) or a replayer (replay.py).
    Requests are frames on its stdin; replies frames on its stdout. Its stderr is discarded:
    a candidate writes there, and nothing it writes may reach a verdict. The sandbox's own
    reports (what it applied; which limit ended it) come on a pipe only its outer process
    holds."""

    def __init__(self, role: str, script: str, policy: sp.Policy, timeout_s: float,
                 pass_fds: tuple[int, ...] = ()) -> None:  # fmt: skip
        self.role, self.timeout_s, self.require = role, timeout_s, policy.require
        py = sys.executable
        self.reports, report_w = os.pipe()
        launch = sp.command(py, os.path.join(HERE, "sandbox.py"), replace(policy, report_fd=report_w),
                            sp.python_argv(py, [os.path.join(HERE, script)]))  # fmt: skip
        self.token = launch.token
        try:
            self.proc = subprocess.Popen(
                launch.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, pass_fds=(*pass_fds, report_w), close_fds=True,
                start_new_session=False,
            )  # fmt: skip
        finally:
            os.close(report_w)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.fd_in, self.fd_out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.sandbox: dict[str, Any] = {}
        self.limit = ""
        # A replayer's end of the socketpair the arena's descriptors travel on (SCM_RIGHTS),
        # set by guard_gpu.replayer; the candidate's process has none.
        self.sock: socket.socket | None = None
        self.cand_dir = ""  # a candidate's process: its folder (guard_spawn.spawn_child)
        try:
            os.write(self.fd_in, launch.stdin)  # the policy, before any frame
        except OSError:
            pass  # it died at once: started() says so

    def started(self) -> dict[str, Any]:
        """The sandbox's own report (first line, written before the target runs)."""
        why = ""
        try:
            report = json.loads(wire.read_line(self.reports, START_S))
        except wire.WireError as exc:
            report, why = None, f"no report in {START_S:g} s" if exc.kind == "timeout" else ""
        except ValueError:
            report, why = None, "its report is not JSON"
        if not isinstance(report, dict) or report.get("event") != "sandbox":
            # Nothing of the candidate has run yet: the harness's failure, not the candidate's.
            if isinstance(report, dict) and report.get("event") == "sandbox_failed":
                why = str(report.get("error"))[:300]
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            if code == 3:
                raise KidFailed(
                    "sandbox_unavailable", "no sandbox can be applied here", self.role
                ) from None
            why = why or (f"it exited with {code}" if code is not None else "no report")
            raise KidFailed("sandbox_failed", f"the sandbox did not start: {why}", self.role)
        self.sandbox = {k: v for k, v in report.items() if k != "event"}
        if self.require and self.sandbox.get("level") not in ("full", "partial"):
            raise KidFailed("sandbox_unavailable", "no sandbox can be applied here", self.role)
        return self.sandbox

    def send(self, msg: Mapping[str, Any]) -> None:
        try:
            wire.send(self.fd_in, msg)
        except OSError as exc:
            raise self.failed("candidate_crashed", "the process is gone") from exc

    def ask(self, msg: Mapping[str, Any], *, timeout_s: float | None = None,
            spin: bool = False) -> tuple[dict[str, Any], float]:  # fmt: skip
        """Send a request, wait for the reply: (reply, wall-clock microseconds here)."""
        t0 = _perf()
        self.send(msg)
        return self.reply(t0, timeout_s=timeout_s, spin=spin)

    def reply(self, t0: float, *, timeout_s: float | None = None,
              spin: bool = False) -> tuple[dict[str, Any], float]:  # fmt: skip
        """The reply to the request sent at `t0` (send, then other work, then this)."""
        try:
            reply = wire.recv(self.fd_out, timeout_s or self.timeout_s, spin=spin)
        except wire.WireError as exc:
            if exc.kind == "timeout":
                raise self.failed("timeout", "no answer in time") from None
            if exc.kind == "eof":
                raise self.failed("candidate_crashed", "the process died") from None
            raise KidFailed("harness_tampered", "the reply broke the protocol", self.role) from None
        wall_us = (_perf() - t0) * 1e6
        if not isinstance(reply, dict):
            raise KidFailed("harness_tampered", "the reply is not an object", self.role)
        if "fatal" in reply:  # an exception type name (guard_child.exception_kind): for the
            # operator's reasons; the public verdict shows the code's fixed sentence
            kind = str(reply["fatal"])[:80]
            raise KidFailed("candidate_crashed", f"the process failed ({kind})", self.role)
        return reply, wall_us

    def failed(self, code: str, detail: str) -> KidFailed:
        """Why the process stopped answering: a sandbox limit when its outer process counted
        one (the candidate's own word never decides it), else `code`."""
        limit = self.stop()
        if limit:
            return KidFailed(
                "resource_limit", f"resource_limit: {limit} (the sandbox's limit ended it)",
                self.role,
            )  # fmt: skip
        return KidFailed(code, detail, self.role)

    def stop(self) -> str:
        """End the sandbox (TERM to its outer process, which kills the rest and removes its
        scratch folder and cgroup; KILL if it does not), read its exit report: the limit that
        ended it, or ''."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # its reaper and target follow it (PDEATHSIG)
                self.proc.wait(timeout=5)
        if self.reports >= 0:
            self.limit = sp.limit_hit(self._exit_report())
            os.close(self.reports)
            self.reports = -1
        return self.limit

    def _exit_report(self) -> dict[str, Any] | None:
        try:
            while True:
                end = sp.exit_report(wire.read_line(self.reports, 2).decode(), self.token)
                if end is not None:
                    return end
        except (wire.WireError, UnicodeDecodeError):
            return None

    def close(self) -> None:
        close_all([self])

    def ask_exit(self) -> None:
        try:
            wire.send(self.fd_in, {"op": "exit"})
        except OSError:
            pass

    def reap(self) -> None:
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass  # it ignores the exit frame (a rebound os._exit): stop() ends it
        self.stop()
        for fh in (self.proc.stdin, self.proc.stdout, self.sock):
            try:
                if fh is not None:
                    fh.close()
            except OSError:
                pass


class Roles:
    """The roles of a verify's sandboxed processes (`kids`: the candidate's, and the incumbent's
    when the host staged one): an incumbent's failure loses the comparison, never the verdict.
    Shared by the kernel verify (guard.Verify) and the step verify (step_guard.StepVerify)."""

    kids: list[Any]

    def drop_incumbent(self) -> None:
        """The incumbent leaves the verify (its process closed): nothing more of it is run."""
        for kid in self.kids:
            if kid.role == "incumbent":
                kid.close()
        self.kids = [k for k in self.kids if k.role == "candidate"]

    def lose_incumbent(self, result: dict[str, Any], exc: KidFailed) -> None:
        """An incumbent's failure loses the comparison, not the verdict: it is dropped (and
        closed). Any other role's failure is raised again, on to the verdict."""
        if exc.role != "incumbent":
            raise exc
        result["incumbent_error"] = f"{exc.code}: {exc}"
        self.drop_incumbent()

    @contextlib.contextmanager
    def incumbent_may_fail(self, result: dict[str, Any]) -> Iterator[None]:
        """A step that an incumbent may fail (lose_incumbent); it is not run again."""
        try:
            yield
        except KidFailed as exc:
            self.lose_incumbent(result, exc)

    def without_failed_incumbent(self, result: dict[str, Any], attempt: Callable[[], T]) -> T:
        """`attempt()`, run again without the incumbent when the incumbent failed it
        (lose_incumbent); the candidate's failure, on either run, goes on to the caller."""
        try:
            return attempt()
        except KidFailed as exc:
            self.lose_incumbent(result, exc)
            return attempt()


def sealed_memfd(size: int, scratch_root: str) -> int:
    """A memfd of `size` bytes sealed against resizing, for a child's shared arena (a hostile
    child cannot truncate it under this process); a temporary file where memfd is missing."""
    try:
        fd = os.memfd_create("hl-arena", os.MFD_ALLOW_SEALING)  # type: ignore[attr-defined]
        os.ftruncate(fd, size)
        import fcntl

        fcntl.fcntl(fd, 1033, 0x0002 | 0x0004 | 0x0001)  # F_ADD_SEALS: SHRINK|GROW|SEAL
    except (AttributeError, OSError):
        import tempfile

        with tempfile.TemporaryFile(dir=scratch_root) as tmp:
            os.ftruncate(tmp.fileno(), size)
            fd = os.dup(tmp.fileno())
    return fd


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command's closing parenthesis (state, ppid,
    ...), or [] when the process is gone or /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (its children, theirs, ...), read from /proc ([] without it)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        fields = _stat(entry)
        if len(fields) > 1 and fields[1].isdigit():  # else gone meanwhile
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _state(pid: int) -> str:
    return (_stat(pid) or ["gone"])[0]


@contextlib.contextmanager
def frozen(kids: Iterable[Kid], wait_s: float = 2.0) -> Iterator[list[int]]:
    """Every process of these kids' sandboxes below the outer one (the reaper, the target and
    whatever it started) stopped with SIGSTOP for the block, continued after it: a stopped
    process runs no thread, so it cannot load the host or start GPU work meanwhile (work it
    queued before keeps running on the device). A process forked while the others were being
    stopped is stopped in the next round; the block starts once each shows as stopped (or is
    gone), or after `wait_s`. Yields the stopped pids ([] where /proc is missing)."""
    stopped: list[int] = []
    try:
        for _ in range(8):
            new = [p for k in kids if k.proc.poll() is None
                   for p in descendants(k.proc.pid) if p not in stopped]  # fmt: skip
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(
            _state(p) not in ("T", "t", "gone", "Z", "X") for p in stopped
        ):
            time.sleep(0.001)
        yield stopped
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)


def close_all(kids: Iterable[Kid]) -> None:
    """Ask every process to exit, then reap each: their teardowns (CUDA's included) overlap."""
    kids = list(kids)
    for kid in kids:
        kid.ask_exit()
    for kid in kids:
        kid.reap()
