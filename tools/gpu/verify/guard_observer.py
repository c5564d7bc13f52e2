"""What the candidate's code does while it runs, seen from inside its own process (guard_child.py):
the Observer. An audit hook (imports, exec and compile, introspection, spawns, sockets, setting
or deleting attributes), the Triton interpreter's launch hook, host reads of tensors and thread
starts become reason codes; a class the candidate made in the same window is its own to set
attributes on (every_class, taken by mark between windows). Standard library only; nothing here
runs the candidate's code.
"""

from __future__ import annotations

import _thread
import collections
import os
import sys
import threading
import types
import typing
from typing import Any

STDLIB = os.path.dirname(os.__file__)
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "__globals__"}
INTROSPECTION = {
    "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.string_at",
    "ctypes.cdata", "sys.settrace", "sys.setprofile", "sys._getframemodulename",
}  # fmt: skip
SPAWNS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.fork", "os.kill",
          "os.spawn", "pty.spawn", "os.killpg", "signal.pthread_kill"}  # fmt: skip
WATCHED = INTROSPECTION | SPAWNS | {
    "object.__getattr__", "object.__setattr__", "object.__delattr__", "exec", "compile",
    "import", "socket.connect", "open",
}  # fmt: skip
IMPORT_CODES = {"threading": "background_thread", "_thread": "background_thread",
                "multiprocessing": "background_thread", "concurrent": "background_thread",
                "ctypes": "introspection", "gc": "introspection", "inspect": "introspection",
                "numpy": "host_compute", "subprocess": "subprocess",
                **{m: "harness_access" for m in (
                    "guard", "guard_child", "guard_observer", "guard_gpu", "guard_cpu",
                    "guard_spawn", "guard_kid", "guard_schema", "guard_record", "phase_lock",
                    "step_guard", "step_child", "step_timed", "step_arena", "step_record",
                    "step_schema", "step_replay", "devmem", "runner",
                    "replay", "wire", "sandbox", "cudadrv", "harnesslab")}}  # fmt: skip
THREAD_STARTS = ((_thread, "start_new_thread"), (_thread, "start_joinable_thread"),
                 (threading, "_start_new_thread"), (threading, "_start_joinable_thread"))  # fmt: skip
LIBS = (os.path.dirname(STDLIB) + os.sep,)  # the interpreter's lib folder
# Whose classes stay theirs even when first made while the candidate runs (torch and triton make
# some on first use): torch, triton and the harness (its staged modules sit beside this one).
HERE = os.path.dirname(os.path.abspath(__file__))
SIBLINGS = (n[:-3] for n in os.listdir(HERE) if n.endswith(".py"))
PROTECTED = frozenset({"torch", "triton", "harnesslab", "__main__", *SIBLINGS})
# Standard library code that reads its caller's module name from a frame and keeps nothing else
# of it (collections.namedtuple, typing's functional NamedTuple): not the candidate's introspection.
NAMEDTUPLE = collections.namedtuple.__code__  # taken before any candidate code runs
MODULE_NAME_READERS = (NAMEDTUPLE, getattr(getattr(typing, "_caller", None), "__code__", None))
TYPE_MODULE = type.__dict__["__module__"].__get__  # a class's own __module__, past its metaclass
FUNCTION = types.FunctionType  # held: the candidate may rebind the module's name, not this
# The candidate's process's own code (this file and guard_child.py, whose hooks and wrappers
# sit between the candidate's frames): never the culprit, looked past.
OWN_FILES = frozenset({__file__, os.path.join(HERE, "guard_child.py")})


# An object's address, rotated (CPython's default hash, one to one): id() without the builtins.id
# audit event, which costs a call of the hook each (5,000 classes: 8 ms a window instead of 1.5),
# and no __hash__ of the candidate's metaclass.
address = object.__hash__


def every_class() -> dict[int, type]:
    """Every class alive now, by address (held, so none is reused while the map lives)."""
    seen: dict[int, type] = {}
    todo: list[type] = [object]
    while todo:
        cls = todo.pop()
        if address(cls) not in seen:
            seen[address(cls)] = cls
            todo += type.__subclasses__(cls)
    return seen


class Observer:
    """What the candidate's code did while it ran (its import, then each call)."""

    def __init__(self, torch: Any, cand_dir: str) -> None:
        self.torch = torch
        self.cand_dir = os.path.realpath(cand_dir) + os.sep
        self.recording = False
        self.busy = False
        self.in_launch = 0
        self.stream: int | None = None
        self.codes: set[str] = set()
        self.own_launches = 0
        self.before: dict[int, type] | None = None

    def reset(self) -> None:
        self.codes, self.own_launches = set(), 0

    def mark(self) -> None:
        """No class alive now is the candidate's own (made_here) in the next window. Taken
        between windows (the parent's mark request), since walking every class costs 1.5-5 ms
        that would otherwise fall inside the parent's clock around a call."""
        self.before = every_class()

    def open(self) -> None:
        """The candidate's code runs from now on (its import, a call), judged against the last
        mark, taken now when none was since the last window closed."""
        if self.before is None:
            self.mark()
        self.recording = True

    def close(self) -> None:
        """The window is over: its mark is spent (a class the candidate made in it is not its
        own in the next one, where patching it could carry state across calls)."""
        self.recording, self.stream, self.before = False, None, None

    @staticmethod
    def reads_module_name(frame: Any) -> bool:
        """Whether `frame` runs one of MODULE_NAME_READERS (by identity: an equal code object of
        the candidate's is not one), whose only introspection is asking for its caller's frame."""
        return any(frame.f_code is reader for reader in MODULE_NAME_READERS)

    def made_here(self, target: Any, frame: Any) -> bool:
        """Whether `frame` setting or deleting an attribute of `target` is the candidate building
        a class of its own (a dataclass, a namedtuple: the standard library sets attributes of
        the class it makes), not a patch: a class that did not exist when this import or call
        began and is not torch's, triton's or the harness's; or the `__new__` that
        collections.namedtuple compiled in `frame` (its defaults). Nothing here runs the
        candidate's code (no metaclass, property or __class__ of its own is consulted)."""
        if issubclass(type(target), type):
            module = TYPE_MODULE(target)
            root = module.split(".")[0] if type(module) is str else ""
            before = self.before  # None outside a window: nothing is its own
            return before is not None and address(target) not in before and root not in PROTECTED
        return (
            frame.f_code is NAMEDTUPLE
            and type(target) is FUNCTION
            and target.__globals__ is frame.f_locals.get("namespace")
        )

    def culprit(self) -> bool:
        """Whether the first frame outside the standard library behind this event is the
        candidate's (a library doing its own work is not)."""
        f: Any = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<") or name.startswith(STDLIB) or name in OWN_FILES:
                f = f.f_back
                continue
            return os.path.realpath(name).startswith(self.cand_dir)
        return False

    def called_from_candidate(self) -> bool:
        """Whether the nearest frame outside torch, triton and the standard library is the
        candidate's (the interpreter's own torch calls inside a launch are not)."""
        f: Any = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if (
                name.startswith("<")
                or name in OWN_FILES
                or name.startswith(LIBS)
                or "/torch/" in name
                or "/triton/" in name
            ):
                f = f.f_back
                continue
            return os.path.realpath(name).startswith(self.cand_dir)
        return False

    def hook(self, event: str, args: tuple) -> None:
        if not self.recording or self.busy or event not in WATCHED:
            return
        if event == "object.__getattr__" and (len(args) < 2 or args[1] not in FRAME_ATTRS):
            return
        self.busy = True
        try:
            frame = sys._getframe(1)  # the frame that raised the event
            if event in ("exec", "compile"):
                # Only the candidate's own exec/compile: the standard library's dataclasses and
                # namedtuples compile code for an honest kernel too.
                if os.path.realpath(frame.f_code.co_filename).startswith(self.cand_dir):
                    self.codes.add("dynamic_code")
                return
            if not self.culprit():
                return
            if event == "open":
                return  # the sandbox decides what can be opened
            if event == "socket.connect":
                self.codes.add("exfiltration")
            elif event in INTROSPECTION or event == "object.__getattr__":
                if not self.reads_module_name(frame):
                    self.codes.add("introspection")
            elif event in SPAWNS:
                self.codes.add("subprocess")
            elif event.startswith("object.") and not self.made_here(args[0], frame):
                self.codes.add("monkey_patch")
            elif event == "import" and args:
                root = str(args[0]).split(".")[0]
                if root in IMPORT_CODES:
                    self.codes.add(IMPORT_CODES[root])
        finally:
            self.busy = False

    def launch(self, fn: Any) -> None:
        code = getattr(fn, "__code__", None)
        stream = self.torch.cuda.current_stream().cuda_stream if self.stream is not None else None
        self.launch_at(code.co_filename if code is not None else "?", stream)

    def launch_at(self, source: str, stream: int | None) -> None:
        """A launch of a kernel defined in `source` (a Triton function's file, a CUDA kernel's
        .cu) on `stream`."""
        if os.path.realpath(source).startswith(self.cand_dir):
            self.own_launches += 1
        else:
            self.codes.add("foreign_kernel")
        if self.stream is not None and stream != self.stream:
            self.codes.add("side_stream")

    def install_interpreter_hook(self) -> None:
        from triton.runtime.interpreter import GridExecutor

        run = GridExecutor.__call__
        obs = self

        def launched(ex, *args, **kwargs):
            obs.launch(ex.fn)
            obs.in_launch += 1
            try:
                return run(ex, *args, **kwargs)
            finally:
                obs.in_launch -= 1

        GridExecutor.__call__ = launched

    def install_host_hooks(self) -> None:
        tensor = self.torch.Tensor
        for name in ("numpy", "tolist", "__array__", "item"):
            original = getattr(tensor, name)

            def host_call(t, *a, _orig=original, **k):
                if self.recording and not self.in_launch:
                    self.codes.add("host_compute")
                return _orig(t, *a, **k)

            host_call.__name__ = name
            setattr(tensor, name, host_call)
        # Every Python thread starts through _thread (threading keeps its own alias). Counting
        # threads after a call races with a thread that has already ended, so a start is the
        # observation; nothing the guard does starts one after this point.
        for mod, name in THREAD_STARTS:
            original = getattr(mod, name, None)
            if original is None:
                continue

            def start(*a, _orig=original, **k):
                self.codes.add("background_thread")
                return _orig(*a, **k)

            start.__name__ = name
            setattr(mod, name, start)
