"""The candidate's process of the guarded verify (tools/gpu/verify/guard_child.py) on the CPU path,
rule by rule: what it replies to each request (load, arena, call, end_case, an unknown op), the
observations a call reports as reason codes, the exception names it may send, and child_main's
own rules (the protocol on a copy of stdout, prints to stderr, a fatal frame, no atexit). The
process is a fork of the test running child_main exactly as the sandbox runs it (stdin the
requests, stdout the replies), without the sandbox: its hooks (an audit hook, patched timers and
thread starts) stay in the fork. One fork serves the whole call sequence below; the sandboxed
process itself is tests/tools/integrity/test_cheats.py's.
"""

from __future__ import annotations

import io
import mmap
import os
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import wire
from harnesslab.tools.gpu.verify import guard_child as gc
from harnesslab.tools.gpu.verify import guard_observer as go

KERNEL = textwrap.dedent(
    """
    from __future__ import annotations

    import _thread
    import atexit
    import collections
    import ctypes
    import dataclasses
    import importlib.util
    import logging
    import os
    import socket
    import sys
    import threading
    import time
    import types
    import typing

    import torch
    import triton
    import triton.language as tl

    print("imported-", end="")  # a candidate's print: stderr, never the protocol
    atexit.register(lambda: open(os.environ["HL_TEST_ATEXIT"], "w").close())
    _spec = importlib.util.spec_from_file_location("foreign", os.environ["HL_TEST_FOREIGN"])
    foreign = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(foreign)  # a kernel defined outside the candidate's folder
    import torch.overrides
    from triton.runtime.interpreter import GridExecutor

    WATCHED = {  # what the candidate's process checks is still itself at each call
        "perf_counter": (time, "perf_counter"), "perf_counter_ns": (time, "perf_counter_ns"),
        "time": (time, "time"), "monotonic": (time, "monotonic"),
        "numpy": (torch.Tensor, "numpy"), "tolist": (torch.Tensor, "tolist"),
        "__array__": (torch.Tensor, "__array__"), "item": (torch.Tensor, "item"),
        "start_new_thread": (_thread, "start_new_thread"),
        "threading_start": (threading, "_start_new_thread"),
        "grid_call": (GridExecutor, "__call__"),
    }
    ORIGINAL = {k: getattr(o, n) for k, (o, n) in WATCHED.items()}


    @triton.jit
    def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2, mask=m)


    def double(x):
        y = torch.empty_like(x)
        if x.numel():
            _double[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y


    KEPT = []


    def _noop():
        pass


    MADE = []  # classes make_class made (in its call)


    class First:  # made at import, patched by the first call (patch_first)
        pass


    class Old:  # made at import: a call that sets its attributes patches a class it did not make
        pass


    def fake_namedtuple(**names):  # collections.namedtuple's own code, `names` in its globals
        code = collections.namedtuple.__code__
        fake = types.FunctionType(code, {**collections.namedtuple.__globals__, **names})
        return fake("P", "a", rename=False, defaults=(1,), module="m")

    double(torch.ones(4))  # a launch while the module loads

    SELF = sys.modules[__name__]  # as pickle, typing and dataclasses find the module


    def fn(x, mode="double", scale=1):
        print("called-", end="")
        if mode == "alias":
            return x
        if mode == "kept":
            if not KEPT:
                KEPT.append(double(x))
            return KEPT[0]
        if mode == "torch":
            return x * 2
        if mode == "raise":
            raise ValueError("text the candidate chose")
        if mode == "tuple":
            return (double(x),)
        if mode == "wrong_shape":
            return double(x)[:1]
        if mode == "float64":
            return double(x).to(torch.float64)
        if mode == "item":
            scale = x[0].item()  # 1.0: the value reaches the candidate
        if mode == "tolist":
            scale = x.tolist()[0]
        if mode == "numpy":
            scale = float(x.numpy()[0])
        if mode == "__array__":
            scale = float(x.__array__()[0])
        if mode == "getframe":
            sys._getframe(0)
        if mode == "tb_frame":
            try:
                raise KeyError
            except KeyError as exc:
                exc.__traceback__.tb_frame
        if mode == "code_attr":
            double.__code__
        if mode == "exec":
            exec("1")
        if mode == "exec_code":  # no compile: a code object it already holds
            exec(_noop.__code__, {})
        if mode == "compile":
            compile("1", "<c>", "exec")
        if mode == "set_attr":
            _noop.__defaults__ = ()
        if mode == "big_fill":  # large enough for torch's own thread pool
            torch.empty(1 << 18).fill_(1.0)
        if mode == "namedtuple":
            collections.namedtuple("P", "a b")
        if mode == "namedtuple_defaults":  # collections sets the defaults of the __new__ it made
            assert collections.namedtuple("P", "a b", defaults=(1,))(0).b == 1
        if mode == "NamedTuple":
            class Pair(typing.NamedTuple):
                a: int
                b: int = 2
            assert Pair(1).b == 2
        if mode == "NamedTuple_call":  # typing reads its caller's module name from a frame
            typing.NamedTuple("Pair", [("a", int)])
        if mode == "dataclass":
            @dataclasses.dataclass(frozen=True, slots=True)
            class Point:
                a: int = 1
            assert Point(2).a == 2
        if mode == "dataclass_old":
            dataclasses.dataclass(Old)
        if mode == "patch_old":  # a class's special attributes are what CPython audits
            Old.__doc__ = "patched"
        if mode == "patch_first":
            First.__doc__ = "patched"
        if mode == "make_class":  # made in this call: its own here, not in a later call
            MADE.append(type("Made", (), {}))
            MADE[-1].__doc__ = "set while it is new"
        if mode == "patch_made":  # state carried across calls on a class of an earlier call
            MADE[-1].__doc__ = "patched"
        if mode == "patch_torch":
            torch.nn.Identity.__doc__ = "patched"
        if mode == "new_torch_class":  # torch makes some classes on first use: they stay torch's
            type("T", (), {"__module__": "torch.fake"}).__doc__ = "patched"
        if mode == "fake_namedtuple_type":  # namedtuple's code setting __module__ of an old class
            fake_namedtuple(type=lambda *a: Old if len(a) == 3 else type(*a))
        if mode == "fake_namedtuple_eval":  # ... and the defaults of a function it did not make
            fake_namedtuple(eval=lambda *a: _noop)
        if mode == "currentframe":  # a frame asked for by the standard library on its behalf
            logging.currentframe()
        if mode == "kill":
            os.kill(os.getpid(), 0)
        if mode == "connect":
            s = socket.socket()
            try:
                s.connect(("127.0.0.1", 9))
            except OSError:
                pass
            s.close()
        if mode == "open":
            open(__file__).close()
        if mode == "import_harness":
            try:
                import harnesslab.no_such_module  # noqa: F401
            except ImportError:
                pass
        if mode == "import_other":
            try:
                import no_such_module_at_all  # noqa: F401
            except ImportError:
                pass
        if mode == "thread":
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        if mode == "ended_thread":  # gone before the call returns: only its start is seen
            t = threading.Thread(target=int)
            t.start()
            t.join()
            time.sleep(0.2)
        if mode == "os_thread":  # a thread no Python hook sees: libc's sleep(30) as its body
            libc = ctypes.CDLL(None)
            tid = ctypes.c_ulong()
            body = ctypes.cast(libc.sleep, ctypes.c_void_p)
            libc.pthread_create(ctypes.byref(tid), None, body, ctypes.c_void_p(30))
        if mode == "foreign":
            y = torch.empty_like(x)
            foreign.run(x, y)
            return y
        if mode.startswith("patch:"):
            obj, name = WATCHED[mode[6:]]
            original = ORIGINAL[mode[6:]]
            setattr(obj, name, lambda *a, **k: original(*a, **k))
        if mode == "restore":
            for key, (obj, name) in WATCHED.items():
                setattr(obj, name, ORIGINAL[key])
        return double(x) if scale == 1 else double(double(x))
    """
)


FOREIGN = textwrap.dedent(
    """
    import triton
    import triton.language as tl


    @triton.jit
    def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)


    def run(x, y):
        _copy[(1,)](x, y, x.numel(), BLOCK=64)
    """
)


@dataclass
class Proc:
    pid: int
    requests: int
    replies: int
    stderr: Path

    def send(self, msg: Any) -> None:
        wire.send(self.requests, msg)

    def ask(self, msg: Any) -> Any:
        self.send(msg)
        return wire.recv(self.replies, timeout_s=60)

    def end(self) -> int:
        """Close its stdin, read what is left, and its exit status (100 + what child_main
        returned if it returned instead of exiting)."""
        if self.requests >= 0:
            os.close(self.requests)
            self.requests = -1
        rest = []
        while True:
            try:
                rest.append(wire.recv(self.replies, timeout_s=60))
            except wire.WireError:
                break
        os.close(self.replies)
        code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        self.rest = rest
        return code


def start(
    tmp: Path,
    make: Callable[[dict[str, Any], int], Any] = gc.Child,
    before: Callable[[], None] = lambda: None,
    entry: Callable[[], int] | None = None,
) -> Proc:
    """A fork running child_main(make, before) (or `entry()`) with stdin and stdout pipes and
    stderr a file, sys.stdout and sys.stderr on descriptors 1 and 2 as in a process of its own.
    The fork runs torch on one thread: in a worker whose earlier tests started torch's OpenMP
    pool, the fork's first parallel op hung (the pool's threads are not forked), as it did in
    the whole suite."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    err = tmp / "stderr"
    err_fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            torch.set_num_threads(1)
            os.dup2(req_r, 0)
            os.dup2(rep_w, 1)
            os.dup2(err_fd, 2)
            for fd in (req_r, req_w, rep_r, rep_w, err_fd):
                os.close(fd)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
            code = 100 + (entry() if entry else gc.child_main(make, before))
        except BaseException:
            os.write(2, traceback.format_exc().encode())
        os._exit(code)
    for fd in (req_r, rep_w, err_fd):
        os.close(fd)
    return Proc(pid, req_w, rep_r, err)


PATCHED = ["perf_counter", "perf_counter_ns", "time", "monotonic", "numpy", "tolist",
           "__array__", "item", "start_new_thread", "threading_start", "grid_call"]  # fmt: skip
F32 = {"dtype": "float32", "shape": [4]}
X = [1.0, 2.0, 3.0, 4.0]
IN, SLOT = 0, 256  # the arena's input and output offsets


@dataclass
class Session:
    replies: dict[str, Any]
    arena: mmap.mmap
    slots: dict[str, list[float]]
    stderr: str
    status: int
    atexit_ran: bool


def call(proc: Proc, arena: mmap.mmap, mode: str, **extra: Any) -> Any:
    arena[SLOT : SLOT + 16] = b"\xff" * 16  # NaN: what the reply did not copy stays NaN
    msg = {"op": "call", "args": [{"tensor": {"offset": IN, **F32}}, {"value": mode}],
           "kwargs": {}, "slot": {"offset": SLOT, **F32}}  # fmt: skip
    msg.update(extra)
    return proc.ask(msg)


def slot(arena: mmap.mmap) -> list[float]:
    return torch.frombuffer(arena, dtype=torch.float32, count=4, offset=SLOT).tolist()


MODES = ["double", "alias", "torch", "raise", "tuple", "wrong_shape", "float64", "item",
         "tolist", "numpy", "__array__",
         "getframe", "tb_frame", "code_attr", "exec", "exec_code", "compile", "set_attr",
         "big_fill", "namedtuple", "namedtuple_defaults", "NamedTuple", "NamedTuple_call",
         "dataclass", "dataclass_old", "patch_old", "patch_torch", "new_torch_class",
         "fake_namedtuple_type", "fake_namedtuple_eval", "currentframe", "kill", "connect", "open",
         "import_harness", "import_other", "foreign", "ended_thread", "double",
         *(x for key in PATCHED for x in (f"patch:{key}", "restore"))]  # fmt: skip


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One candidate's process, the CPU path: load, arena, then a call per behaviour of the
    candidate above (the ones that leave a trace for later calls last), end_case, exit."""
    tmp = tmp_path_factory.mktemp("guard_child")
    (tmp / "cand").mkdir()
    (tmp / "cand" / "kernel.py").write_text(KERNEL)
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    mp.setenv("HL_TEST_ATEXIT", str(tmp / "atexit-ran"))
    (tmp / "foreign.py").write_text(FOREIGN)
    mp.setenv("HL_TEST_FOREIGN", str(tmp / "foreign.py"))
    memfd = os.memfd_create("hl-test-arena")
    os.ftruncate(memfd, 4096)
    arena = mmap.mmap(memfd, 4096)
    arena[IN : IN + 16] = torch.tensor(X).numpy().tobytes()
    cfg = {"device": "cpu", "candidate_dir": str(tmp / "cand"), "entry": "kernel.py:fn",
           "module": None, "memfd": memfd}  # fmt: skip
    proc = start(tmp)
    mp.undo()
    replies: dict[str, Any] = {}
    slots: dict[str, list[float]] = {}
    try:
        proc.send(cfg)
        replies["load"] = proc.ask({"op": "load"})
        replies["arena"] = proc.ask({"op": "arena", "size": 4096})
        # first after the import, with no mark: the import's window is closed, so a class it
        # made is no class of this call's
        replies["patch_first"] = call(proc, arena, "patch_first")
        for i, mode in enumerate(MODES):
            replies[mode if mode not in replies else f"{mode}#{i}"] = call(proc, arena, mode)
            slots[mode] = slot(arena)
        no_kwargs = {"op": "call", "args": [{"tensor": {"offset": IN, **F32}}],
                     "slot": {"offset": SLOT, **F32}}  # fmt: skip
        replies["no_kwargs"] = proc.ask(no_kwargs)
        replies["kwargs"] = call(proc, arena, "double", kwargs={"scale": 2})
        slots["kwargs"] = slot(arena)
        empty = {"dtype": "float64", "shape": [0]}  # not the default dtype
        replies["empty"] = proc.ask({"op": "call", "args": [{"tensor": {"offset": IN, **empty}}],
                                     "kwargs": {}, "slot": {"offset": SLOT, **empty}})  # fmt: skip
        replies["kept1"] = call(proc, arena, "kept")
        replies["kept2"] = call(proc, arena, "kept")
        replies["end_case"] = proc.ask({"op": "end_case"})
        replies["kept3"] = call(proc, arena, "kept")
        for label in ("unmarked", "marked"):  # the parent marks before each call; a call
            replies[f"make_class/{label}"] = call(proc, arena, "make_class")  # unmarked walks
            if label == "marked":
                replies["mark"] = proc.ask({"op": "mark"})
            replies[f"patch_made/{label}"] = call(proc, arena, "patch_made")
        replies["os_thread"] = call(proc, arena, "os_thread")
        replies["thread"] = call(proc, arena, "thread")
        replies["after_thread"] = call(proc, arena, "double")
        proc.send({"op": "exit"})
        replies["after_exit"] = None
        status = proc.end()
        replies["after_exit"] = proc.rest
    finally:
        if proc.requests >= 0:
            os.kill(proc.pid, 9)
            proc.end()
    yield Session(replies, arena, slots, proc.stderr.read_text(), status,
                  (tmp / "atexit-ran").exists())  # fmt: skip
    arena.close()
    os.close(memfd)


HONEST = {"error": "", "plain": True, "shape": [4], "dtype": "float32", "aliases_input": False,
          "reused_output": False, "own_launches": 1, "copied": True, "codes": []}  # fmt: skip


def test_an_honest_kernel_loads_and_its_output_is_copied_into_the_parents_slot(session) -> None:
    assert session.replies["load"] == {"ok": True, "error": "", "codes": []}
    assert session.replies["arena"] == {"ok": True}
    assert session.replies["double"] == HONEST
    assert session.slots["double"] == [2.0, 4.0, 6.0, 8.0]


def test_a_call_passes_the_kwargs_sent_and_none_when_none_are_sent(session) -> None:
    assert session.replies["no_kwargs"] == HONEST
    assert session.replies["kwargs"] == {**HONEST, "own_launches": 2}
    assert session.slots["kwargs"] == [4.0, 8.0, 12.0, 16.0]  # scale=2 reached the entry


def test_an_output_that_is_an_input_is_reported_as_aliasing_it(session) -> None:
    assert session.replies["alias"] == {**HONEST, "aliases_input": True, "own_launches": 0}


def test_an_output_kept_from_an_earlier_call_is_reported_until_end_case(session) -> None:
    r = session.replies
    assert (r["kept1"]["reused_output"], r["kept2"]["reused_output"]) == (False, True)
    assert r["end_case"] == {"ok": True}
    assert r["kept3"]["reused_output"] is False  # end_case forgot the case's outputs


def test_only_a_plain_tensor_of_the_slots_shape_and_dtype_is_copied(session) -> None:
    r, nan = session.replies, session.slots
    assert r["raise"] == {"error": "ValueError", "plain": False, "own_launches": 0, "codes": []}
    assert r["tuple"] == {"error": "", "plain": False, "own_launches": 1, "codes": []}
    wrong_shape = {k: v for k, v in HONEST.items() if k != "copied"}
    assert r["wrong_shape"] == {**wrong_shape, "shape": [1]}
    assert r["float64"] == {**wrong_shape, "dtype": "float64"}
    for mode in ("raise", "tuple", "wrong_shape", "float64"):
        assert all(v != v for v in nan[mode]), mode  # the slot was left as it was (NaN)


def test_an_empty_output_is_copied_without_reading_the_arena(session) -> None:
    assert session.replies["empty"] == {**HONEST, "shape": [0], "dtype": "float64",
                                        "own_launches": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "codes"),
    [("torch", ["torch_compute"]), ("getframe", ["introspection"]),
     ("tb_frame", ["introspection"]), ("code_attr", []), ("exec", ["dynamic_code"]),
     ("exec_code", ["dynamic_code"]), ("compile", ["dynamic_code"]),
     ("set_attr", ["monkey_patch"]), ("big_fill", []), ("currentframe", ["introspection"]),
     ("dataclass_old", ["monkey_patch"]), ("patch_old", ["monkey_patch"]),
     ("patch_torch", ["monkey_patch"]), ("new_torch_class", ["monkey_patch"]),
     ("fake_namedtuple_type", ["monkey_patch"]), ("fake_namedtuple_eval", ["monkey_patch"]),
     ("kill", ["subprocess"]), ("connect", ["exfiltration"]), ("open", []),
     ("import_harness", ["harness_access"]), ("import_other", []),
     ("foreign", ["foreign_kernel"]), ("ended_thread", ["background_thread"]),
     (f"double#{MODES.index('double', 1)}", [])],
)  # fmt: skip
def test_what_the_candidate_did_in_a_call_is_that_calls_reason_codes(
    session, mode: str, codes: list[str]
) -> None:
    """Each call's codes are its own (the calls run in this order: a call with none follows a
    call with some)."""
    assert session.replies[mode]["codes"] == codes


@pytest.mark.parametrize("mode", ["item", "tolist", "numpy", "__array__"])
def test_a_host_read_is_host_compute_and_gives_the_candidate_the_value(session, mode) -> None:
    assert "host_compute" in session.replies[mode]["codes"]
    assert session.slots[mode] == [2.0, 4.0, 6.0, 8.0]  # scale read as 1: one doubling


@pytest.mark.parametrize("label", ["unmarked", "marked"])
def test_a_class_made_in_one_call_is_not_the_next_calls_own(session, label) -> None:
    """Setting attributes of a class is a patch unless the same call made it: a class made in
    one call and changed in the next carries state across calls, with or without a mark
    (the class snapshot the parent asks for between calls) before the second."""
    assert session.replies[f"make_class/{label}"]["codes"] == []
    assert session.replies[f"patch_made/{label}"]["codes"] == ["monkey_patch"]
    assert session.replies["patch_first"]["codes"] == ["monkey_patch"]  # right after load
    assert session.replies["mark"] == {"ok": True}


def test_a_library_exec_is_not_dynamic_code(session) -> None:
    assert "dynamic_code" not in session.replies["namedtuple"]["codes"]  # collections' exec


@pytest.mark.parametrize(
    "mode", ["namedtuple", "namedtuple_defaults", "NamedTuple", "NamedTuple_call", "dataclass"]
)
def test_a_class_the_call_builds_with_the_standard_library_is_not_a_patch(session, mode) -> None:
    """dataclasses, collections and typing set attributes of the class they make (and typing and
    collections read the caller's module name from its frame): an honest call's own class."""
    assert session.replies[mode] == HONEST


def test_a_foreign_kernel_is_not_counted_as_the_candidates_launch(session) -> None:
    assert session.replies["foreign"]["own_launches"] == 0
    assert session.replies["double"]["own_launches"] == 1


@pytest.mark.parametrize("key", PATCHED)
def test_a_replaced_timer_host_read_thread_start_or_launch_hook_is_monkey_patch(
    session, key: str
) -> None:
    assert "monkey_patch" in session.replies[f"patch:{key}"]["codes"]
    restored = MODES.index(f"patch:{key}") + 1
    assert session.replies[f"restore#{restored}" if restored > MODES.index("restore")
                           else "restore"]["codes"] == []  # fmt: skip


def test_a_thread_outside_python_or_still_running_is_reported_on_every_later_call(
    session,
) -> None:
    assert "background_thread" in session.replies["os_thread"]["codes"]  # (ctypes: introspection)
    assert session.replies["thread"]["codes"] == ["background_thread"]
    assert session.replies["after_thread"]["codes"] == ["background_thread"]


def test_exit_ends_the_process_without_a_reply_and_without_the_candidates_atexit(
    session,
) -> None:
    assert session.replies["after_exit"] == []
    assert session.status == 0
    assert not session.atexit_ran


def test_the_candidates_prints_go_to_stderr_never_into_the_protocol(session) -> None:
    calls = len(MODES) + 14  # and patch_first, no_kwargs, kwargs, empty, kept (3), make/patch (4),
    # os_thread, thread, after
    assert session.stderr == "imported-" + "called-" * calls


def load_reply(tmp: Path, source: str, entry: str = "kernel.py:fn") -> dict[str, Any]:
    """A fresh candidate's process's answer to load, for the candidate `source`."""
    (tmp / "cand").mkdir()
    (tmp / "cand" / "kernel.py").write_text(source)
    proc = start(tmp)
    try:
        proc.send({"device": "cpu", "candidate_dir": str(tmp / "cand"), "entry": entry,
                   "module": None, "memfd": None})  # fmt: skip
        return proc.ask({"op": "load"})
    finally:
        assert proc.end() == 0


def test_an_import_that_fails_is_a_load_reply_with_its_exception_and_codes(
    tmp_path: Path,
) -> None:
    source = 'exec("1")\nraise ValueError("text the candidate chose")\n'
    assert load_reply(tmp_path, source) == {
        "ok": False, "error": "ValueError", "codes": ["dynamic_code"]
    }  # fmt: skip


def test_an_entry_that_is_not_callable_is_no_entry(tmp_path: Path) -> None:
    assert load_reply(tmp_path, "fn = 3\n") == {"ok": False, "error": "no_entry", "codes": []}


def test_without_a_cfg_the_process_returns_2_after_before_cfg_ran(tmp_path: Path) -> None:
    proc = start(tmp_path, before=lambda: os.write(2, b"before-cfg"))
    assert proc.end() == 102  # child_main returned 2 (the fork adds 100)
    assert proc.rest == []
    assert proc.stderr.read_text() == "before-cfg"


def test_a_process_that_fails_to_start_sends_a_fatal_frame_with_the_exception_type_only(
    tmp_path: Path,
) -> None:
    def make(cfg: dict[str, Any], out: int) -> Any:
        print("tail-without-newline", end="")  # flushed before the process ends
        raise KeyError(cfg["secret"])

    proc = start(tmp_path, make=make)
    proc.send({"secret": "x"})
    assert proc.end() == 0
    assert proc.rest == [{"fatal": "KeyError"}]
    assert proc.stderr.read_text() == "tail-without-newline"


class ForeignError(Exception):
    pass


class Spoof(Exception):
    pass


Spoof.__module__, Spoof.__name__ = "builtins", "ValueError"  # claims to be a builtin


def test_an_exception_is_named_by_its_builtin_torch_or_triton_type_else_a_fixed_word() -> None:
    from triton.compiler.errors import CompilationError

    assert gc.exception_kind(ValueError("x")) == "ValueError"
    assert gc.exception_kind(torch.cuda.OutOfMemoryError()) == "torch.OutOfMemoryError"
    assert gc.exception_kind(CompilationError.__new__(CompilationError)) == (
        "triton.CompilationError"
    )
    assert gc.exception_kind(ForeignError()) == "CandidateDefinedError"
    assert gc.exception_kind(Spoof()) == "CandidateDefinedError"
    long = type("E" * 100, (Exception,), {"__module__": "torch.x"})
    assert gc.exception_kind(long()) == ("torch." + "E" * 100)[:80]
    nobuiltin = type("NoSuchBuiltin", (Exception,), {"__module__": "builtins"})
    assert gc.exception_kind(nobuiltin()) == "CandidateDefinedError"


def frames(*requests: Any, raw: bytes = b"") -> int:
    r, w = os.pipe()
    for req in requests:
        wire.send(w, req)
    os.write(w, raw)
    os.close(w)
    return r


def test_serve_ops_answers_until_eof_an_unknown_op_or_a_frame_that_is_not_a_request() -> None:
    seen: list[Any] = []
    handlers = {"a": seen.append}
    gc.serve_ops(frames({"op": "a", "n": 1}, {"op": "a", "n": 2}), handlers)  # then EOF
    assert seen == [{"op": "a", "n": 1}, {"op": "a", "n": 2}]
    for stop in ({"op": "b"}, ["op", "a"], {"op": ["a"]}, {"no": "op"}):
        seen.clear()
        gc.serve_ops(frames({"op": "a"}, stop, {"op": "a"}), handlers)
        assert seen == [{"op": "a"}], stop


def test_a_candidate_class_put_into_builtins_under_its_name_is_still_candidate_defined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    monkeypatch.setattr(builtins, "ForeignError", ForeignError, raising=False)
    assert gc.exception_kind(ForeignError()) == "CandidateDefinedError"


def test_an_entry_with_more_than_one_colon_names_no_function(tmp_path: Path) -> None:
    reply = load_reply(tmp_path, "def fn(x):\n    return x\n", entry="kernel.py:fn:x")
    assert reply == {"ok": False, "error": "no_entry", "codes": []}


def test_the_cfg_is_awaited_a_bounded_time_and_main_returns_2_without_it(tmp_path: Path) -> None:
    def before() -> None:  # in the fork: how long child_main waits for its cfg
        real = gc.wire.recv

        def recv(fd: int, timeout_s: float | None = None, **kw: Any) -> Any:
            os.write(2, f"timeout_s={timeout_s}".encode())
            return real(fd, timeout_s, **kw)

        gc.wire.recv = recv  # type: ignore[assignment]

    proc = start(tmp_path, before=before)
    assert proc.end() == 102
    assert proc.stderr.read_text() == "timeout_s=60"
    main = start(tmp_path, entry=gc.main)
    assert main.end() == 102  # main returns child_main's 2 (exit status 2 as a script)


MODULE_KERNEL = textwrap.dedent(
    """
    import torch


    class ModelNew(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(n))

        def forward(self, x):
            return self.w.detach()  # the parameter bound to the caller's last input
    """
)


def test_a_modelnew_class_is_built_with_its_init_and_called_with_the_inputs_bound(
    tmp_path: Path,
) -> None:
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / "kernel.py").write_text(MODULE_KERNEL)
    memfd = os.memfd_create("hl-test-arena")
    os.ftruncate(memfd, 4096)
    arena = mmap.mmap(memfd, 4096)
    arena[IN : IN + 16] = torch.tensor(X).numpy().tobytes()
    arena[64:80] = torch.tensor([5.0, 6.0, 7.0, 8.0]).numpy().tobytes()
    proc = start(tmp_path)
    try:
        proc.send({"device": "cpu", "candidate_dir": str(tmp_path / "cand"), "entry": "kernel.py:fn",
                   "module": {"params": ["w"], "init": ["n"]}, "memfd": memfd})  # fmt: skip
        assert proc.ask({"op": "load"}) == {"ok": True, "error": "", "codes": []}
        assert proc.ask({"op": "arena", "size": 4096}) == {"ok": True}
        reply = proc.ask({"op": "call", "args": [{"tensor": {"offset": IN, **F32}},
                                                 {"tensor": {"offset": 64, **F32}}],
                          "kwargs": {"n": 4}, "slot": {"offset": SLOT, **F32}})  # fmt: skip
    finally:
        assert proc.end() == 0
    assert reply == {**HONEST, "aliases_input": True, "own_launches": 0}
    assert slot(arena) == [5.0, 6.0, 7.0, 8.0]
    arena.close()
    os.close(memfd)


# -- the observer's frame walks and launches, in this process (nothing installed) ----------------
def chain(tmp: Path, files: list[str], walk: Callable[[], bool]) -> bool:
    """walk() as the observer calls it (from its hook or its torch mode, itself called for code
    in the last of `files`), through functions defined in `files` (outermost first), called
    from this test: the walk starts at the last file's frame."""
    scope: dict[str, Any] = {"walk": walk}
    exec(compile("def relay():\n    return walk()\n", "<relay>", "exec"), scope)
    call: Callable[[], bool] = scope["relay"]
    for name in reversed(files):
        path = name if name.startswith("<") or os.path.isabs(name) else str(tmp / name)
        scope = {"inner": call}
        exec(compile("def f():\n    return inner()\n", path, "exec"), scope)
        call = scope["f"]
    return call()


@pytest.fixture
def obs(tmp_path: Path) -> Any:
    (tmp_path / "cand").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "cand")
    return go.Observer(torch, str(tmp_path / "link"))  # the folder's real path is kept


def test_a_host_read_inside_a_launch_is_the_launchs_not_host_compute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interpreter reads scalars to the host while it runs a kernel (on a GPU build, the
    launch's own reads): only a read outside a launch, while recording, is the candidate's. A
    stand-in tensor class takes the hooks (the real one's reads are not made to order here)."""

    class Tensor:
        def item(self) -> int:
            return 7

        def tolist(self) -> list[int]:
            return [7]

        def numpy(self) -> str:
            return "array"

        def __array__(self) -> str:
            return self.numpy()  # as torch's does

    for mod, name in gc.THREAD_STARTS:  # the hooks replace these too: put back after the test
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, getattr(mod, name))
    watch = gc.Observer(SimpleNamespace(Tensor=Tensor), str(tmp_path))
    watch.install_host_hooks()
    t = Tensor()
    reads = [t.item, t.tolist, t.numpy, t.__array__]
    watch.recording, watch.in_launch = True, 1
    assert [r() for r in reads] == [7, [7], "array", "array"] and watch.codes == set()
    watch.recording, watch.in_launch = False, 0
    assert [r() for r in reads] == [7, [7], "array", "array"] and watch.codes == set()
    for read in reads:
        watch.codes.clear()
        watch.recording = True
        read()
        assert watch.codes == {"host_compute"}, read


def test_the_culprit_is_the_first_frame_outside_the_standard_library_and_this_module(
    tmp_path: Path, obs: Any
) -> None:
    walk = obs.culprit
    assert chain(tmp_path, ["cand/k.py"], walk) is True
    assert chain(tmp_path, ["link/k.py"], walk) is True
    assert chain(tmp_path, ["lib/k.py"], walk) is False
    assert chain(tmp_path, ["cand/k.py", "lib/k.py"], walk) is False  # a library's own work
    for skipped in ("<frozen>", os.path.join(go.STDLIB, "fake.py"), gc.__file__, go.__file__):
        assert chain(tmp_path, ["cand/k.py", skipped], walk) is True, skipped
        assert chain(tmp_path, ["lib/k.py", skipped], walk) is False, skipped


def test_a_torch_call_is_the_candidates_when_the_nearest_frame_outside_libraries_is(
    tmp_path: Path, obs: Any
) -> None:
    walk = obs.called_from_candidate
    assert chain(tmp_path, ["cand/k.py"], walk) is True
    assert chain(tmp_path, ["lib/k.py"], walk) is False
    assert chain(tmp_path, ["cand/k.py", "lib/k.py"], walk) is False
    libs = os.path.join(go.LIBS[0], "site", "fake.py")
    for skipped in ("<frozen>", gc.__file__, go.__file__, libs, "a/torch/f.py", "a/triton/f.py"):
        assert chain(tmp_path, ["cand/k.py", skipped], walk) is True, skipped
        assert chain(tmp_path, ["lib/k.py", skipped], walk) is False, skipped


def test_a_walk_that_finds_only_library_frames_blames_nobody(obs: Any) -> None:
    """In a thread whose every frame is the standard library's or unnamed."""
    import threading

    found: list[bool] = []
    for walk in (obs.culprit, obs.called_from_candidate):
        scope: dict[str, Any] = {"walk": walk, "found": found}
        exec(compile("def target():\n    found.append(walk())\n", "<t>", "exec"), scope)
        t = threading.Thread(target=scope["target"])
        t.start()
        t.join()
    assert found == [False, False]


def test_a_launch_of_the_candidates_kernel_counts_and_one_on_another_stream_is_side_stream(
    tmp_path: Path, obs: Any
) -> None:
    kernel = str(tmp_path / "cand" / "k.py")
    obs.launch_at(kernel, None)
    obs.launch_at(kernel, 5)  # outside a call (no stream watched): any stream
    assert (obs.own_launches, obs.codes) == (2, set())
    obs.reset()
    obs.stream = 7
    obs.launch_at(kernel, 7)
    assert (obs.own_launches, obs.codes) == (1, set())
    obs.launch_at(kernel, 8)
    assert obs.codes == {"side_stream"}
    obs.reset()
    obs.launch_at(str(tmp_path / "lib.cu"), 7)
    assert (obs.own_launches, obs.codes) == (0, {"foreign_kernel"})


# -- a class the candidate makes versus one it patches, in this process (nothing installed) -------
@pytest.mark.parametrize(
    ("module", "own"),
    [("_hl_candidate", True), ("collections", True), ("torchvision", True), (5, True),
     ("torch", False), ("torch.fake", False), ("triton.language", False),
     ("harnesslab.tools.gpu.wire", False), ("__main__", False), ("guard_record", False),
     ("replay", False)],
)  # fmt: skip
def test_a_class_made_in_the_window_is_the_candidates_unless_torch_triton_or_the_harness(
    obs: Any, module: Any, own: bool
) -> None:
    """torch and triton make classes on first use, inside a call: those stay theirs, as do the
    harness's (its staged modules are this module's siblings); a `__module__` that is no string
    is no package's."""
    obs.open()
    made = type("Made", (), {"__module__": module})
    assert obs.made_here(made, sys._getframe()) is own


def test_a_class_alive_when_the_window_opened_is_never_the_candidates(obs: Any) -> None:
    older = type("Older", (), {"__module__": "_hl_candidate"})
    deeper = type("Deeper", (older,), {"__module__": "_hl_candidate"})
    meta = type("Meta", (type,), {"__module__": "_hl_candidate"})
    obs.open()
    for cls in (older, deeper, meta, object, type, torch.Tensor, torch.nn.Identity):
        assert not obs.made_here(cls, sys._getframe()), cls
    newer = type("Newer", (deeper,), {"__module__": "_hl_candidate"})
    assert obs.made_here(newer, None)
    obs.close()
    obs.open()  # the next call: what the last one made is old now
    assert not obs.made_here(newer, None)


def test_judging_a_class_runs_none_of_its_metaclass_code(obs: Any) -> None:
    """A metaclass property named __module__ (or __class__) would run the candidate's code
    inside the audit hook, where its own introspection goes unseen."""

    def trap(cls: Any) -> Any:
        raise AssertionError("the candidate's code ran")

    meta = type("Meta", (type,), {"__module__": property(trap), "__class__": property(trap)})
    obs.open()
    assert obs.made_here(meta("Made", (), {"__module__": "_hl_candidate"}), None)
    assert not obs.made_here(meta("Made", (), {"__module__": "torch"}), None)


def test_only_the_new_that_namedtuple_compiled_in_that_frame_may_get_its_defaults(
    obs: Any,
) -> None:
    namespace: dict[str, Any] = {}
    new = eval("lambda a, b: 0", namespace)
    at = SimpleNamespace(f_code=go.NAMEDTUPLE, f_locals={"namespace": namespace})
    obs.open()
    assert obs.made_here(new, at)
    assert not obs.made_here(eval("lambda a, b: 0", {}), at)  # a function it did not compile
    assert not obs.made_here(SimpleNamespace(__globals__=namespace), at)  # not a function
    elsewhere = SimpleNamespace(f_code=(lambda: 0).__code__, f_locals={"namespace": namespace})
    assert not obs.made_here(new, elsewhere)


def test_only_the_standard_librarys_own_module_name_readers_may_ask_for_a_frame() -> None:
    import collections
    import typing

    readers = (collections.namedtuple.__code__, typing._caller.__code__)  # type: ignore[attr-defined]
    for code in readers:
        assert gc.Observer.reads_module_name(SimpleNamespace(f_code=code))
        twin = code.replace(co_filename="/candidate/k.py")  # equal, as code objects compare
        assert twin == code and not gc.Observer.reads_module_name(SimpleNamespace(f_code=twin))
    assert not gc.Observer.reads_module_name(SimpleNamespace(f_code=(lambda: 0).__code__))


def test_outside_a_window_no_class_is_the_candidates_own(obs: Any) -> None:
    """made_here with no mark (before a window opens, after it closes): every class set is a
    patch, never an error in the audit hook."""
    new = type("New", (), {"__module__": "_hl_candidate"})
    assert obs.before is None
    assert obs.made_here(new, None) is False
    obs.open()
    obs.close()
    assert obs.made_here(new, None) is False


def test_a_mark_request_takes_the_snapshot_and_answers_ok() -> None:
    """The parent's mark (before each timed CPU call) is the observer's mark, answered."""
    seen: list[Any] = []
    child = gc.Child.__new__(gc.Child)
    child.obs = SimpleNamespace(mark=lambda: seen.append("mark"))
    child.reply = lambda **msg: seen.append(msg)
    child.mark({"op": "mark"})
    assert seen == ["mark", {"ok": True}]
