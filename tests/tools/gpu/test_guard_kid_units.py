"""The guarded verify's handle on a sandboxed child (tools/gpu/verify/guard_kid.py) rule by rule, without
a sandbox: a Kid built on pipes the test holds (its requests, its replies, the sandbox's report
channel) and a process that stands for the sandbox's outer one. What each way of stopping maps
to (timeout, candidate_crashed, harness_tampered, a sandbox limit before all of them), what a
sandbox that did not start maps to (sandbox_failed, sandbox_unavailable), and the exit report
read only with the sandbox's token. Two tests start a stand-in sandbox.py (the same protocol:
the policy frame on stdin, reports on the policy's report_fd) to pin how a Kid launches one; the
real sandbox starting a Kid is tests/tools/integrity/test_sandbox_limits.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tools.gpu import wire
from harnesslab.tools.gpu.isolation import sandbox_policy as sp
from harnesslab.tools.gpu.verify import guard_kid as gk

TOKEN = "t0ken"


class Ends:
    """The test's ends of a Kid's pipes: what the Kid sent, what it will read back, and the
    sandbox's report channel."""

    def __init__(self, requests: int, replies: int, reports: int) -> None:
        self.requests, self.replies, self.reports = requests, replies, reports

    def report(self, obj: Any) -> None:
        os.write(self.reports, (json.dumps(obj) + "\n").encode())

    def exit_report(self, *limits: str, token: str = TOKEN) -> None:
        self.report(
            {"event": "sandbox_exit", "token": token, "status": 0, "limits_hit": list(limits)}
        )

    def close_reports(self) -> None:
        """The sandbox's outer process is gone: its report channel ends."""
        if self.reports >= 0:
            os.close(self.reports)
            self.reports = -1


class Proc:
    """Stands for the sandbox's outer process where a real one would take seconds: records what
    the Kid does to it. `on_term` exits at TERM; `on_wait` exits when first waited for (it had
    been asked to); else it exits only at KILL. A wait without a bound fails the test: the
    verify would hang on a process that never exits."""

    def __init__(self, *, on_term: bool = False, on_wait: bool = False) -> None:
        self.on_term, self.on_wait = on_term, on_wait
        self.calls: list[str] = []
        self.returncode: int | None = None
        self.stdin: Any = None
        self.stdout: Any = None

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.calls.append("TERM")
        if self.on_term:
            self.returncode = -15

    def kill(self) -> None:
        self.calls.append("KILL")
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        assert timeout is not None, "an unbounded wait on a child"
        self.calls.append("wait")
        if self.returncode is None and self.on_wait:
            self.returncode = 0
        if self.returncode is None:
            raise subprocess.TimeoutExpired("sandbox", timeout)
        return self.returncode


MakeKid = Callable[..., tuple[gk.Kid, Ends]]


@pytest.fixture
def make_kid() -> Iterator[MakeKid]:
    """A Kid without a sandbox: `proc` (default: a live `sleep`) stands for the outer process."""
    made: list[tuple[gk.Kid, Ends, list[int]]] = []

    def make(proc: Any = None, *, role: str = "candidate", require: bool = False,
             timeout_s: float = 0.05) -> tuple[gk.Kid, Ends]:  # fmt: skip
        kid = gk.Kid.__new__(gk.Kid)
        kid.role, kid.timeout_s, kid.require, kid.token = role, timeout_s, require, TOKEN
        kid.reports, reports_w = os.pipe()
        requests_r, kid.fd_in = os.pipe()
        kid.fd_out, replies_w = os.pipe()
        kid.proc = proc if proc is not None else subprocess.Popen(["sleep", "30"])
        kid.sandbox, kid.limit, kid.sock = {}, "", None
        ends = Ends(requests_r, replies_w, reports_w)
        made.append((kid, ends, [requests_r, kid.fd_in, kid.fd_out, replies_w]))
        return kid, ends

    yield make
    for kid, ends, fds in made:
        if isinstance(kid.proc, subprocess.Popen) and kid.proc.poll() is None:
            kid.proc.kill()
            kid.proc.wait()
        ends.close_reports()
        for fd in [*fds, kid.reports]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def exited(code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sh", "-c", f"exit {code}"])
    proc.wait()
    return proc


def failure(call: Callable[[], Any]) -> gk.KidFailed:
    with pytest.raises(gk.KidFailed) as err:
        call()
    return err.value


def test_a_kid_failure_carries_its_code_role_and_the_operators_detail() -> None:
    err = gk.KidFailed("timeout", "no answer in time", "incumbent")
    assert (err.code, err.role, str(err)) == ("timeout", "incumbent", "no answer in time")


def test_the_stage_root_is_the_folder_above_the_harness_files() -> None:
    assert gk.stage_root() == os.path.dirname(os.path.dirname(os.path.abspath(gk.__file__)))


# -- started: the sandbox's first report ------------------------------------------------------


def test_a_sandbox_report_is_what_was_applied_without_its_event(make_kid: MakeKid) -> None:
    kid, ends = make_kid()
    ends.report({"event": "sandbox", "level": "partial", "landlock": 3})
    assert kid.started() == {"level": "partial", "landlock": 3}
    assert kid.sandbox == {"level": "partial", "landlock": 3}


@pytest.mark.parametrize("level", ["full", "partial"])
def test_a_required_sandbox_at_full_or_partial_level_starts(make_kid: MakeKid, level: str) -> None:
    kid, ends = make_kid(require=True)
    ends.report({"event": "sandbox", "level": level})
    assert kid.started() == {"level": level}


def test_a_required_sandbox_that_applied_nothing_is_unavailable(make_kid: MakeKid) -> None:
    kid, ends = make_kid(require=True, role="incumbent")
    ends.report({"event": "sandbox", "level": "none"})
    err = failure(kid.started)
    assert (err.code, err.role) == ("sandbox_unavailable", "incumbent")
    kid, ends = make_kid(require=False)  # not required: the same report runs the child
    ends.report({"event": "sandbox", "level": "none"})
    assert kid.started() == {"level": "none"}


def test_a_sandbox_that_says_why_it_failed_is_sandbox_failed_with_its_words(make_kid) -> None:
    kid, ends = make_kid(exited(1), role="candidate")
    ends.report({"event": "sandbox_failed", "error": "FileExistsError: " + "x" * 400})
    err = failure(kid.started)
    assert (err.code, err.role) == ("sandbox_failed", "candidate")
    assert str(err) == "the sandbox did not start: " + ("FileExistsError: " + "x" * 400)[:300]


@pytest.mark.parametrize("first", [{"event": "sandbox_exit"}, ["sandbox"], "sandbox"])
def test_any_other_first_report_is_sandbox_failed_with_the_exit_code(make_kid, first) -> None:
    kid, ends = make_kid(exited(1))
    ends.report(first)
    err = failure(kid.started)
    assert (err.code, str(err)) == ("sandbox_failed", "the sandbox did not start: it exited with 1")


def test_a_report_that_is_not_json_or_never_comes_is_sandbox_failed(make_kid, monkeypatch) -> None:
    kid, ends = make_kid(exited(0))
    os.write(ends.reports, b"{not json\n")
    assert str(failure(kid.started)) == "the sandbox did not start: its report is not JSON"
    kid, ends = make_kid(exited(0))
    ends.close_reports()  # it exited without a word
    assert str(failure(kid.started)) == "the sandbox did not start: it exited with 0"
    monkeypatch.setattr(gk, "START_S", 0.05)
    kid, ends = make_kid(exited(0))  # its report channel stays open, silent
    assert str(failure(kid.started)) == "the sandbox did not start: no report in 0.05 s"


def test_a_sandbox_that_neither_reports_nor_exits_is_sandbox_failed(make_kid: MakeKid) -> None:
    proc = Proc()
    kid, ends = make_kid(proc)
    ends.close_reports()
    err = failure(kid.started)
    assert (err.code, str(err)) == ("sandbox_failed", "the sandbox did not start: no report")
    assert proc.calls == ["wait"]  # a bounded wait (Proc fails an unbounded one)


def test_exit_code_3_means_no_sandbox_can_be_applied_here(make_kid: MakeKid) -> None:
    kid, ends = make_kid(exited(3), role="incumbent")
    ends.close_reports()
    err = failure(kid.started)
    assert (err.code, err.role) == ("sandbox_unavailable", "incumbent")
    kid, ends = make_kid(exited(3))
    ends.report({"event": "sandbox_failed", "error": "no Landlock"})
    assert failure(kid.started).code == "sandbox_unavailable"


# -- ask: one request, one reply ----------------------------------------------------------------


def test_a_request_reaches_the_child_and_its_reply_comes_back_timed(make_kid, monkeypatch) -> None:
    kid, ends = make_kid()
    wire.send(ends.replies, {"ok": True, "n": 2})
    clock = iter([10.0, 10.25])
    monkeypatch.setattr(gk, "_perf", lambda: next(clock))
    reply, wall_us = kid.ask({"op": "call", "args": [1]})
    assert reply == {"ok": True, "n": 2} and wall_us == 250_000.0
    assert wire.recv(ends.requests, 1) == {"op": "call", "args": [1]}


def test_an_ask_waits_the_kids_timeout_or_its_own_and_spins_only_when_asked(
    make_kid: MakeKid, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timed ask spins (a sleeping CPU's wake-up would land in the wall clock); the others
    sleep in select."""
    kid, _ = make_kid(timeout_s=7.0)
    seen: list[tuple[int, Any, bool]] = []

    def recv(fd: int, timeout_s: float | None = None, *, spin: bool = False) -> Any:
        seen.append((fd, timeout_s, spin))
        return {"ok": True}

    monkeypatch.setattr(wire, "recv", recv)
    kid.ask({"op": "load"})
    kid.ask({"op": "time"}, timeout_s=0.5, spin=True)
    assert seen == [(kid.fd_out, 7.0, False), (kid.fd_out, 0.5, True)]


def test_no_answer_in_time_is_a_timeout_and_the_child_is_ended(make_kid: MakeKid) -> None:
    kid, ends = make_kid(role="incumbent")
    ends.exit_report()
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, err.role, str(err)) == ("timeout", "incumbent", "no answer in time")
    assert kid.proc.poll() is not None and kid.reports == -1


def test_a_child_that_died_before_answering_crashed(make_kid: MakeKid) -> None:
    kid, ends = make_kid()
    ends.exit_report()
    os.close(ends.replies)
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, str(err)) == ("candidate_crashed", "the process died")


def test_a_child_gone_before_the_request_crashed(make_kid: MakeKid) -> None:
    kid, ends = make_kid()
    ends.exit_report()
    os.close(ends.requests)  # nobody reads its stdin: the write fails (EPIPE)
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, str(err)) == ("candidate_crashed", "the process is gone")


@pytest.mark.parametrize("ask", ["timeout", "died", "gone"])
def test_a_sandbox_limit_outranks_the_way_the_child_stopped(make_kid: MakeKid, ask: str) -> None:
    """The sandbox's outer process counted the limit; the candidate's own word never decides."""
    kid, ends = make_kid(role="candidate")
    ends.report({"event": "sandbox", "level": "full"})
    ends.exit_report("memory", "pids")
    ends.close_reports()
    if ask == "died":
        os.close(ends.replies)
    if ask == "gone":
        os.close(ends.requests)
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, err.role) == ("resource_limit", "candidate")
    assert str(err) == "resource_limit: memory (the sandbox's limit ended it)"


@pytest.mark.parametrize(
    "raw",
    [(wire.MAX_FRAME + 1).to_bytes(4, "big"), b"\0\0\0\x05{nope", b"\0\0\0\x03[1,"],
)
def test_a_reply_that_breaks_the_protocol_is_harness_tampered(make_kid, raw: bytes) -> None:
    kid, ends = make_kid(role="incumbent-replay")
    ends.exit_report("memory")  # a limit does not excuse a broken protocol
    os.write(ends.replies, raw)
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, err.role, str(err)) == (
        "harness_tampered", "incumbent-replay", "the reply broke the protocol"
    )  # fmt: skip


@pytest.mark.parametrize("reply", [[1, 2], "ok", None, 3])
def test_a_reply_that_is_not_an_object_is_harness_tampered(make_kid, reply: Any) -> None:
    kid, ends = make_kid()
    wire.send(ends.replies, reply)
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, str(err)) == ("harness_tampered", "the reply is not an object")


def test_a_fatal_reply_is_a_crash_naming_the_exception_kind_for_the_operator(make_kid) -> None:
    kid, ends = make_kid(role="candidate")
    wire.send(ends.replies, {"fatal": "RuntimeError", "ok": True})
    err = failure(lambda: kid.ask({"op": "call"}))
    assert (err.code, err.role) == ("candidate_crashed", "candidate")
    assert str(err) == "the process failed (RuntimeError)"
    wire.send(ends.replies, {"fatal": "E" * 200})  # the kind is cut: it is the child's text
    assert str(failure(lambda: kid.ask({"op": "call"}))) == f"the process failed ({'E' * 80})"
    wire.send(ends.replies, {"fatal": None})
    assert failure(lambda: kid.ask({"op": "call"})).code == "candidate_crashed"


# -- stop / the exit report -------------------------------------------------------------------------


def test_stop_ends_a_live_sandbox_and_reads_the_limit_from_its_exit_report(make_kid) -> None:
    kid, ends = make_kid()
    reports = kid.reports
    ends.report({"event": "sandbox", "level": "full"})
    ends.exit_report("cpu", token="a guess")  # the target cannot forge it without the token
    os.write(ends.reports, b"not json\n")
    ends.exit_report("memory")
    assert kid.stop() == "memory" and kid.limit == "memory"
    assert kid.proc.poll() is not None and kid.reports == -1
    with pytest.raises(OSError):
        os.fstat(reports)  # the report channel is closed
    ends.close_reports()
    assert kid.stop() == "memory"  # read once: a second stop says the same


@pytest.mark.parametrize("lines", [b"", b"\xff\xfe\n", b'{"event": "sandbox", "level": "full"}\n'])
def test_no_exit_report_with_the_token_means_no_limit(make_kid, lines: bytes) -> None:
    kid, ends = make_kid(exited(0))
    os.write(ends.reports, lines)
    ends.close_reports()
    assert kid.stop() == "" and kid.reports == -1


def test_an_exit_report_without_a_hit_means_no_limit(make_kid: MakeKid) -> None:
    kid, ends = make_kid(exited(0))
    ends.exit_report()
    ends.close_reports()
    assert kid.stop() == ""
    kid, ends = make_kid()
    ends.exit_report()
    ends.close_reports()
    err = kid.failed("timeout", "no answer in time")
    assert (err.code, str(err)) == ("timeout", "no answer in time")


def test_stop_asks_with_term_then_kills_a_sandbox_that_stays(make_kid: MakeKid) -> None:
    proc = Proc(on_term=True)
    kid, ends = make_kid(proc)
    ends.close_reports()
    kid.stop()
    assert proc.calls == ["TERM", "wait"]
    proc = Proc()  # ignores TERM
    kid, ends = make_kid(proc)
    ends.close_reports()
    kid.stop()
    assert proc.calls == ["TERM", "wait", "KILL", "wait"] and proc.returncode == -9


def test_stop_leaves_an_exited_sandbox_alone(make_kid: MakeKid) -> None:
    proc = Proc()
    proc.returncode = 0
    kid, ends = make_kid(proc)
    ends.close_reports()
    assert kid.stop() == "" and proc.calls == []


# -- close ----------------------------------------------------------------------------------------


def kid_with_files(make_kid: MakeKid, proc: Proc) -> tuple[gk.Kid, Ends]:
    kid, ends = make_kid(proc)
    proc.stdin = os.fdopen(os.dup(kid.fd_in), "wb", buffering=0)
    proc.stdout = os.fdopen(os.dup(kid.fd_out), "rb", buffering=0)
    kid.sock = socket.socketpair()[0]
    return kid, ends


def test_close_asks_the_child_to_exit_then_reads_its_exit_report(make_kid: MakeKid) -> None:
    proc = Proc(on_wait=True)
    kid, ends = kid_with_files(make_kid, proc)
    sock = kid.sock
    assert sock is not None
    ends.exit_report("pids")
    ends.close_reports()
    kid.close()
    assert wire.recv(ends.requests, 1) == {"op": "exit"}
    assert proc.calls == ["wait"]  # it exited when asked: no TERM
    assert kid.limit == "pids" and kid.reports == -1
    assert proc.stdin.closed and proc.stdout.closed and sock.fileno() == -1


def test_close_ends_a_child_that_ignores_the_exit_frame_or_is_gone(make_kid: MakeKid) -> None:
    proc = Proc()
    kid, ends = kid_with_files(make_kid, proc)
    ends.close_reports()
    kid.close()
    assert proc.calls == ["wait", "TERM", "wait", "KILL", "wait"]
    proc = Proc(on_wait=True)
    kid, ends = make_kid(proc)
    ends.close_reports()
    os.close(ends.requests)  # nobody reads the exit frame: close says nothing
    kid.close()
    assert kid.reports == -1


# -- __init__: the launch, with a stand-in sandbox.py --------------------------------------------

STAND_IN = """\
import json, os, struct, sys
inp, out = sys.stdin.buffer, sys.stdout.buffer
policy = json.loads(inp.read(int(inp.read(8), 16) + 1))
def report(obj):
    os.write(policy["report_fd"], (json.dumps(obj) + "\\n").encode())
report({"event": "sandbox", "level": "full", "pgid": os.getpgid(0), "target": sys.argv[-1]})
sys.stderr.write("the target's own stderr\\n")
sys.stderr.flush()
while True:
    head = inp.read(4)
    if len(head) < 4:
        break
    msg = json.loads(inp.read(struct.unpack(">I", head)[0]))
    if msg.get("op") == "exit":
        break
    data = json.dumps({"echo": msg}).encode()
    out.write(struct.pack(">I", len(data)) + data)
    out.flush()
report({"event": "sandbox_exit", "token": policy["token"], "status": 0, "limits_hit": ["pids"]})
"""


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_kid_launches_its_sandbox_with_the_policy_and_a_report_pipe_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The policy travels on stdin with the report descriptor and a token; the child's stderr
    reaches nothing; the sandbox stays in the verify's process group (the executor's group kill
    on a timeout reaches it); nothing of the Kid stays open after close."""
    (tmp_path / "sandbox.py").write_text(STAND_IN)
    monkeypatch.setattr(gk, "HERE", str(tmp_path))
    before = open_fds()
    kid = gk.Kid("candidate", "guard_child.py", sp.Policy(), 5.0)
    assert kid.sandbox == {} and kid.limit == "" and kid.sock is None
    started = kid.started()
    assert started["level"] == "full" and started["pgid"] == os.getpgrp()
    assert started["target"] == str(tmp_path / "guard_child.py")
    assert kid.ask({"op": "load"})[0] == {"echo": {"op": "load"}}
    kid.close()
    assert kid.proc.returncode == 0  # it left on the exit frame, not at TERM
    assert kid.limit == "pids"  # its exit report carried the Kid's token
    assert open_fds() == before
    assert "the target's own stderr" not in capfd.readouterr().err


def test_a_stand_in_that_exits_at_once_is_a_sandbox_failure(tmp_path, monkeypatch) -> None:
    (tmp_path / "sandbox.py").write_text("import sys\nsys.exit(1)\n")
    monkeypatch.setattr(gk, "HERE", str(tmp_path))
    kid = gk.Kid("candidate", "guard_child.py", sp.Policy(), 5.0)
    err = failure(kid.started)
    kid.close()
    assert (err.code, str(err)) == ("sandbox_failed", "the sandbox did not start: it exited with 1")


TREE = """
import os, subprocess, sys, time
if len(sys.argv) < 2:
    subprocess.Popen([sys.executable, __file__, "1"])
elif sys.argv[1] == "1":
    subprocess.Popen([sys.executable, __file__, "2"])
time.sleep(60)
"""


def test_frozen_stops_every_process_below_each_sandbox_and_continues_them_after(
    tmp_path: Path,
) -> None:
    """The outer process (the sandbox's, which the parent talks to) stays running; its child
    and grandchild (the reaper and the target) are stopped for the block, then continued."""
    import sys
    import time

    script = tmp_path / "tree.py"
    script.write_text(TREE)
    outer = subprocess.Popen([sys.executable, str(script)])
    kid = type("K", (), {"proc": outer})()
    try:
        deadline = time.monotonic() + 20
        while len(gk.descendants(outer.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = gk.descendants(outer.pid)
        assert len(below) == 2
        with gk.frozen([kid]) as stopped:
            assert sorted(stopped) == sorted(below)
            assert all(gk._state(p) == "T" for p in below) and gk._state(outer.pid) != "T"
        assert all(gk._state(p) not in ("T", "t") for p in below)
        with gk.frozen([]) as none:
            assert none == []
    finally:
        for pid in gk.descendants(outer.pid):
            os.kill(pid, 9)
        outer.kill()
        outer.wait()
