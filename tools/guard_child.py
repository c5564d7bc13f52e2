"""Child side of the guarded verify: the only process that imports candidate code.

Started by guard.py before any input or expected value exists (on a GPU with "spawn", a fresh
interpreter; on the CPU interpreter forked, with the runner's protocol stream closed first), so
expected values never exist here. Standard library, torch and triton only. The
parent shares input buffers and output slots with this process (CPU shared memory or CUDA IPC)
and sends requests; this side calls the candidate, copies each output into its slot and answers
with JSON facts. It never decides a verdict: the parent compares the slots with the expected
values it computed before the candidate ran.

Observers are installed BEFORE the candidate is imported, and cannot be removed silently:
- an audit hook (PEP 578 hooks cannot be removed) attributes file reads of protected paths,
  frame/gc/ctypes introspection, class attribute patches, subprocesses and dynamic code to the
  candidate's own file;
- Triton launches are recorded through the interpreter's GridExecutor or JITFunction.run on a
  GPU (with the stream current at launch), so "the candidate's @triton.jit function ran" is an
  observation, not a claim;
- a TorchFunctionMode around each call lists torch calls outside Triton launches (the
  reference's math done in torch shows as mul, rsqrt, silu, ...);
- identities of the timers, synchronize, the launch hooks and Tensor.numpy are snapshotted and
  re-checked after every call; the timers used here are bound before the import, so a patched
  time.perf_counter never measures anything.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

STDLIB = os.path.dirname(os.__file__)
SPIN_S = 0.02  # busy-wait for the next request before blocking (keeps wake-ups out of timing)
# torch functions and Tensor methods a host wrapper may call: allocation, metadata, views,
# copies, casts. Anything else (mul, rsqrt, mean, silu, matmul, ...) is the math done in torch.
ALLOWED_FUNCS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "zero_", "fill_", "full", "full_like", "new_zeros", "new_full", "ones_like",
    "view", "view_as", "reshape", "as_strided", "t", "transpose", "permute", "expand",
    "contiguous", "clone", "copy_", "to", "float", "half", "bfloat16", "type", "detach",
    "select", "unsqueeze", "squeeze", "split", "chunk", "narrow", "flatten", "unflatten",
    "unbind", "__getitem__", "__setitem__", "__get__", "__len__", "__format__", "__repr__",
    "__index__", "__int__", "__float__", "__bool__", "__hash__", "size", "stride", "dim",
    "numel", "nelement", "element_size", "data_ptr", "is_contiguous", "storage_offset",
    "untyped_storage", "is_floating_point", "is_complex", "get_device", "item", "tolist",
    "numpy", "__array__", "cpu", "cuda", "record_stream", "ndimension", "__reduce_ex__",
    "__deepcopy__", "is_pinned", "is_shared", "share_memory_", "tensor", "as_tensor",
}  # fmt: skip
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "__globals__"}
INTROSPECTION = {
    "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.string_at",
    "ctypes.cdata", "sys.settrace", "sys.setprofile", "sys._getframemodulename",
}  # fmt: skip
SPAWNS = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.fork", "os.kill",
          "os.spawn", "pty.spawn"}  # fmt: skip
READS = {"open", "os.listdir", "os.scandir", "os.walk", "glob.glob", "shutil.copyfile"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND
WATCHED = (
    INTROSPECTION
    | SPAWNS
    | READS
    | {
        "object.__getattr__",
        "object.__setattr__",
        "object.__delattr__",
        "exec",
        "compile",
        "import",
        "socket.connect",  # the exfiltration check below needs it: unwatched events return early
    }
)
IMPORT_CODES = {"threading": "background_thread", "_thread": "background_thread",
                "multiprocessing": "background_thread", "concurrent": "background_thread",
                "ctypes": "introspection", "gc": "introspection", "inspect": "introspection",
                "numpy": "host_compute", "subprocess": "subprocess"}  # fmt: skip


class Observer:
    """Everything seen while candidate code runs (its import, then each call)."""

    def __init__(self, torch, cand_dir: str, protected: list[str]) -> None:
        self.torch = torch
        self.cand_dir = os.path.realpath(cand_dir) + os.sep
        self.protected = [os.path.realpath(p) for p in protected if p]
        self.recording = False
        self.stream: int | None = None
        self.in_launch = 0
        self.busy = False
        self.launches: list[list[Any]] = []
        self.ops: set[str] = set()
        self.host: set[str] = set()
        self.audit: list[list[str]] = []

    def reset(self) -> None:
        self.launches, self.ops, self.host, self.audit = [], set(), set(), []

    # -- launches --------------------------------------------------------------------------------
    def launch(self, fn: Any, name: str) -> None:
        code = getattr(fn, "__code__", None)
        path = os.path.realpath(code.co_filename) if code is not None else "?"
        stream_ok = True
        if self.stream is not None:  # the stream current when the harness called the entry
            stream_ok = self.torch.cuda.current_stream().cuda_stream == self.stream
        self.launches.append([name, path.startswith(self.cand_dir), stream_ok])

    def install_launch_hooks(self) -> list[tuple[Any, str]]:
        """Record every Triton launch: the interpreter's GridExecutor, or JITFunction.run."""
        if os.environ.get("TRITON_INTERPRET") == "1":
            from triton.runtime.interpreter import GridExecutor as cls

            attr = "__call__"
        else:
            from triton.runtime.jit import JITFunction as cls  # type: ignore[assignment]

            attr = "run"
        run = getattr(cls, attr)

        def launched(obj, *args, **kwargs):
            self.launch(obj.fn, getattr(obj.fn, "__name__", "?"))
            self.in_launch += 1
            try:
                return run(obj, *args, **kwargs)
            finally:
                self.in_launch -= 1

        setattr(cls, attr, launched)
        watched: list[tuple[Any, str]] = [(cls, attr)]
        tensor = self.torch.Tensor
        for name in ("numpy", "tolist", "__array__"):
            original = getattr(tensor, name)

            def host_call(t, *a, _name=name, _orig=original, **k):
                if self.recording and not self.in_launch:
                    self.host.add(_name)
                return _orig(t, *a, **k)

            host_call.__name__ = name

            setattr(tensor, name, host_call)
            watched.append((tensor, name))
        return watched

    # -- audit -----------------------------------------------------------------------------------
    def culprit(self) -> str | None:
        """file:line of the candidate frame behind the current event, if the first frame outside
        the standard library is the candidate's (a library doing its own work is not)."""
        f: Any = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            if name.startswith("<") or name.startswith(STDLIB) or name == __file__:
                f = f.f_back
                continue
            if os.path.realpath(name).startswith(self.cand_dir):
                return f"{os.path.basename(name)}:{f.f_lineno}"
            return None
        return None

    def protected_path(self, path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        if real.startswith(self.cand_dir):
            return False
        if real.startswith("/proc/") and not real.startswith(
            ("/proc/self", f"/proc/{os.getpid()}")
        ):
            return real.split("/")[2].isdigit()
        return any(real == p or real.startswith(p + os.sep) for p in self.protected)

    def hook(self, event: str, args: tuple) -> None:
        if not self.recording or self.busy or event not in WATCHED:
            return
        if event == "object.__getattr__" and (len(args) < 2 or args[1] not in FRAME_ATTRS):
            return
        self.busy = True
        try:
            if event in READS and args and self.protected_path(args[0]):
                self.audit.append(["reads_verifier_files", f"{event} {os.fsdecode(args[0])}"])
                return
            who = self.culprit()
            if who is None:
                return
            if event == "socket.connect" or (event == "open" and _writes(args, self.cand_dir)):
                self.audit.append(["exfiltration", f"{who}: {event} {str(args[:2])[:200]}"])
            if event in INTROSPECTION or event == "object.__getattr__":
                self.audit.append(["introspection", f"{who}: {event} {args[1:2]}"])
            elif event in SPAWNS:
                self.audit.append(["subprocess", f"{who}: {event}"])
            elif event.startswith("object."):
                self.audit.append(["monkey_patch", f"{who}: sets {args[1]!r} on {args[0]!r}"])
            elif event in ("exec", "compile"):
                self.audit.append(["dynamic_code", f"{who}: {event}"])
            elif event == "import" and args:
                root = str(args[0]).split(".")[0]
                if root in IMPORT_CODES:
                    self.audit.append([IMPORT_CODES[root], f"{who}: imports {args[0]}"])
        finally:
            self.busy = False


def _writes(args: tuple, cand_dir: str) -> bool:
    """An `open` audit event that writes outside the candidate's folder (a channel out)."""
    path, mode, flags = (*args, None, None, None)[:3]
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and flags & WRITE_FLAGS
    )
    if not writing or isinstance(path, int) or path is None:
        return False
    real = os.path.realpath(os.fsdecode(path))
    return not real.startswith(cand_dir) and real != os.devnull


def _function_recorder(torch, obs: Observer):
    """A TorchFunctionMode listing torch calls outside Triton launches. (A TorchDispatchMode
    would see aten ops, but its first use imports torch._dynamo: 2 s per verify on a CPU.)"""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not obs.in_launch:
                name = getattr(func, "__name__", str(func))
                if name not in ALLOWED_FUNCS:
                    obs.ops.add(name)
            return func(*args, **(kwargs or {}))

    return Recorder


class Child:
    """The request loop. Replies are JSON: the parent never unpickles anything from here."""

    def __init__(self, conn, cfg: dict[str, Any]) -> None:
        import torch
        import triton  # noqa: F401 - imported before the candidate, hooks go in below

        self.conn, self.torch, self.cfg = conn, torch, cfg
        self.perf = time.perf_counter  # bound before the candidate can replace the module's
        self.cuda = cfg["device"] == "cuda"
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.obs = Observer(torch, cfg["candidate_dir"], cfg.get("protected", []))
        watched = self.obs.install_launch_hooks()
        watched += [(time, n) for n in ("perf_counter", "perf_counter_ns", "time", "monotonic")]
        if self.cuda:
            cuda = torch.cuda
            watched += [(cuda, "synchronize"), (cuda, "Event"), (cuda.CUDAGraph, "replay")]
            watched += [(cuda.Event, "elapsed_time"), (cuda.Event, "record")]
        self.watched = [(o, n, getattr(o, n)) for o, n in watched]
        self.module = sys.modules[__name__]
        self.own = dict(vars(self.module))  # this module's globals, as imported
        self.Recorder = _function_recorder(torch, self.obs)
        self.threads = set(threading.enumerate())
        sys.addaudithook(self.obs.hook)
        self.sets: list[Any] = []
        self.slots: Any = None
        self.held: list[Any] = []  # this case's outputs, kept alive (reuse detection)
        self.graph = None
        self.outs: list[Any] = []

    def reply(self, **msg: Any) -> None:
        self.conn.send_bytes(json.dumps(msg, default=str).encode())

    def tampered(self) -> list[str]:
        """Watched functions and this module's globals that are not what they were."""
        bad = [
            f"{getattr(o, '__name__', o)}.{n}" for o, n, f in self.watched if getattr(o, n) is not f
        ]
        now = vars(self.module)
        bad += [f"guard_child.{k}" for k in {*now, *self.own} if now.get(k) is not self.own.get(k)]
        if self.torch._C._len_torch_dispatch_stack() or self.torch._C._len_torch_function_stack():
            bad.append("a torch dispatch/function mode left active")
        return bad

    def observed(self, **facts: Any) -> None:
        """Reply with facts plus what the observers saw since the last reset."""
        obs = self.obs
        threads = [t.name for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        facts.update(launches=obs.launches, torch_ops=sorted(obs.ops), host=sorted(obs.host))
        facts.update(audit=obs.audit, tampered=self.tampered(), threads=sorted(threads))
        self.reply(os_threads=len(os.listdir("/proc/self/task")), **facts)
        obs.reset()

    def load(self, candidate_dir: str, entry: str) -> None:
        import importlib.util

        file_name, func = entry.split(":", 1)
        path = os.path.join(candidate_dir, file_name)
        self.obs.recording = True
        try:
            spec = importlib.util.spec_from_file_location("_hl_candidate", path)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules["_hl_candidate"] = mod
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            self.fn = getattr(mod, func)
            error = "" if callable(self.fn) else f"{file_name} defines no {func}()"
        except BaseException as exc:  # the candidate's import failing is a result, not a crash
            error = f"import failed: {type(exc).__name__}: {str(exc)[:300]}"
        finally:
            self.obs.recording = False
        self.observed(ok=not error, error=error)

    def poison(self, nbytes: int) -> None:
        """Hand the caching allocator a NaN-filled block so that unwritten output shows up."""
        if nbytes > 0:
            device = "cuda" if self.cuda else "cpu"
            junk = self.torch.empty(nbytes // 2 + 1, dtype=self.torch.float16, device=device)
            junk.fill_(float("nan"))
            del junk

    def call(self, set_idx: int, slot_idx: int, profile: bool = False) -> None:
        args, kwargs = self.sets[set_idx]
        self.poison(self.slots[slot_idx].numel() * self.slots[slot_idx].element_size())
        self.obs.reset()
        self.obs.recording = True
        error, out, kernels = "", None, None
        prof = None
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as profiler

            prof = profiler(activities=[ProfilerActivity.CUDA])
            prof.__enter__()
        if self.cuda:
            self.obs.stream = self.torch.cuda.current_stream().cuda_stream
        t0 = self.perf()
        try:
            with self.Recorder():
                out = self.fn(*args, **kwargs)
            self.sync()
        except BaseException as exc:
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        wall_us = (self.perf() - t0) * 1e6
        self.obs.recording, self.obs.stream = False, None
        if prof is not None:
            prof.__exit__(None, None, None)
            cuda = self.torch.autograd.DeviceType.CUDA
            kernels = [
                [e.name, int(getattr(e, "device_resource_id", 0) or 0), e.device_time]
                for e in prof.events()
                if e.device_type == cuda
            ]
        facts = self.describe(out, args, slot_idx)
        if out is not None:
            self.held.append(out)
        self.observed(error=error, wall_us=wall_us, kernels=kernels, **facts)

    def describe(self, out: Any, args: tuple, slot_idx: int) -> dict[str, Any]:
        torch = self.torch
        facts: dict[str, Any] = {"type": type(out).__name__, "plain": type(out) is torch.Tensor}
        if not facts["plain"]:
            return facts  # not a tensor, or a subclass: touching it would run its code
        dtype = str(out.dtype).removeprefix("torch.")
        facts.update(shape=list(out.shape), dtype=dtype, device=out.device.type)
        base = out.untyped_storage().data_ptr()
        facts["aliases_input"] = any(
            isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == base for a in args
        )
        facts["reused_output"] = any(h.untyped_storage().data_ptr() == base for h in self.held)
        slot = self.slots[slot_idx]
        if list(out.shape) == list(slot.shape) and out.dtype == slot.dtype:
            slot.copy_(out)
            self.sync()
            facts["copied"] = True
        return facts

    # -- GPU timing: the one protocol of runner.py, with this process's bound timers -------------
    def window(self, work) -> float:
        """Microseconds for `work`, whole device synchronised inside the window."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        self.sync()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    def capture(self, calls: int, n_sets: int) -> None:
        torch = self.torch
        self.outs, self.graph, method, error = [], None, "cuda_graph", ""
        self.calls, self.n_sets = calls, n_sets
        self.obs.reset()
        self.obs.recording = True
        try:
            side = torch.cuda.Stream()  # warm-up on a side stream, as graph capture requires
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for i in range(n_sets):
                    self.fn(*self.sets[i][0], **self.sets[i][1])
            torch.cuda.current_stream().wait_stream(side)
            self.sync()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(calls):
                    args, kwargs = self.sets[i % n_sets]
                    self.outs.append(self.fn(*args, **kwargs))
            self.graph = graph
        except Exception as exc:
            method, error, self.outs = "eager_back_to_back", f"{type(exc).__name__}: {exc}", []
        self.sync()
        self.obs.recording = False
        self.poison_outs()
        self.observed(method=method, error=error[:300])

    def poison_outs(self) -> None:
        """NaN into every output the next sample writes (graph), or into the allocator (eager)."""
        if self.graph is not None:
            for o in self.outs:
                if type(o) is self.torch.Tensor:
                    o.fill_(float("nan"))
        else:
            self.outs = []
            self.poison(self.slots[0].numel() * self.slots.element_size() * 4)
        self.sync()

    def replay(self, empty: bool = False) -> None:
        """One timed sample and nothing else: the parent's wall clock brackets this request.
        `empty` times an empty window: the parent's measure of this request's own overhead."""
        if empty:
            us = self.window(lambda: None)
        elif self.graph is not None:
            us = self.window(self.graph.replay)
        else:
            outs: list[Any] = []

            def work() -> None:
                for i in range(self.calls):
                    args, kwargs = self.sets[i % self.n_sets]
                    outs.append(self.fn(*args, **kwargs))

            self.obs.recording = True
            us = self.window(work)
            self.obs.recording = False
            self.outs = outs
        self.reply(us=us)

    def collect(self) -> None:
        """Copy the sample's outputs into the parent's slots, then poison for the next one."""
        plain = [o for o in self.outs if type(o) is self.torch.Tensor]
        copied = 0
        for k, o in enumerate(self.outs):
            if type(o) is self.torch.Tensor and o.shape == self.slots[k].shape:
                self.slots[k].copy_(o)
                copied += 1
        distinct = len({o.untyped_storage().data_ptr() for o in plain})
        self.sync()
        self.poison_outs()
        self.observed(copied=copied, distinct=distinct)

    def serve(self) -> None:
        while True:
            try:
                # Spin briefly before blocking: the parent's next request (a timed sample
                # after its wake-up request) then finds this process awake.
                spin_until = self.perf() + (SPIN_S if self.cuda else 0.0)
                while not self.conn.poll(0) and self.perf() < spin_until:
                    pass
                msg = self.conn.recv()
            except EOFError:
                return
            op = msg[0]
            if op in ("load", "call", "capture", "replay", "collect"):
                getattr(self, op)(*msg[1:])
            elif op in ("case", "end_case"):  # a case's shared buffers and slots, or none
                self.sets, self.slots = (msg[1], msg[2]) if op == "case" else ([], None)
                self.held, self.graph, self.outs = [], None, []
                if self.cuda and op == "end_case":
                    self.torch.cuda.empty_cache()
                self.reply(ok=True)
            elif op == "slots":
                self.slots = msg[1]
                self.reply(ok=True)
            elif op == "ping":
                self.reply(ok=True)
            else:
                return


def main(conn, cfg: dict[str, Any]) -> None:
    """Entry point of the child process (multiprocessing target)."""
    for fd in cfg.get("close_fds", []):  # a forked child: the runner's protocol stream
        try:
            os.close(fd)
        except OSError:
            pass
    child = Child(conn, cfg)
    try:
        child.serve()
    except Exception as exc:  # anything here ends the child; the parent sees EOF and says why
        try:
            child.reply(fatal=f"{type(exc).__name__}: {str(exc)[:300]}")
        except Exception:
            pass
    finally:
        sys.stdout.flush()
        os._exit(0)  # skip atexit handlers the candidate may have registered
