"""The candidate's process in the guarded verify: the only process that imports agent Python.

Runs sandboxed (sandbox.py: Landlock, namespaces, seccomp; started by guard.py with nothing
secret in its environment or arguments); standard library, torch and triton only. Nothing it
says is evidence. Everything it sends back is a claim the trusted parent checks:
- on the Triton CPU interpreter ("call"): the parent's inputs arrive in a shared memory arena
  (a memfd the parent made); this process calls the candidate and copies the output into the
  parent's slot; the parent compares it with expected values that never existed here;
- on a GPU ("record"): this process calls the candidate on inputs of its own (random, of the
  requested shapes and the exact scalar arguments) once to warm up, then records the next call
  (guard_record.py): every Triton or harnesslab_cuda launch (kernel binary, grid, block,
  scalar arguments, which input or allocation each pointer names), every allocation and fill,
  and which allocation the output lives in. The
  replay process (replay.py) launches exactly that on the parent's fresh inputs; nothing the
  wrapper computes in Python or torch is replayed, so a result that needed it comes out wrong.
Observations (torch math, foreign kernels, host transfers, threads, audit events) are reported
as reason codes only: they can reject a candidate, never pass one, and no text written here
reaches a verdict.
"""

from __future__ import annotations

import builtins
import importlib.util
import mmap
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its siblings

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import modelnew, wire
    from . import guard_record
    from .guard_observer import THREAD_STARTS, Observer
else:
    import guard_record
    import modelnew
    import wire
    from guard_observer import THREAD_STARTS, Observer

    # Out of sys.modules: a candidate's `import guard_observer` is then an import the audit hook
    # sees (harness_access) and gets a fresh copy, never the live Observer's globals.
    del sys.modules["guard_observer"]

# torch functions and Tensor methods a host wrapper may call: allocation, metadata, views,
# copies, casts. Anything else (mul, rsqrt, mean, silu, matmul, ...) is math done in torch.
ALLOWED_FUNCS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
    "zeros_like", "zero_", "fill_", "full", "full_like", "new_zeros", "new_full", "ones_like",
    "ones", "new_ones", "view", "view_as", "reshape", "as_strided", "t", "transpose", "permute",
    "expand", "contiguous", "clone", "copy_", "to", "float", "half", "bfloat16", "type",
    "detach", "select", "unsqueeze", "squeeze", "split", "chunk", "narrow", "flatten",
    "unflatten", "unbind", "__getitem__", "__setitem__", "__get__", "__len__", "__format__",
    "__repr__", "__index__", "__int__", "__float__", "__bool__", "__hash__", "size", "stride",
    "dim", "numel", "nelement", "element_size", "data_ptr", "is_contiguous", "storage_offset",
    "untyped_storage", "is_floating_point", "is_complex", "get_device", "ndimension",
    "record_stream", "is_pinned", "is_shared", "__reduce_ex__", "__deepcopy__",
    "__eq__", "__ne__",
}  # fmt: skip
# Functions that make a new allocation the replay must make too: name -> fill kind.
ALLOCATORS = {
    "empty": "poison", "empty_like": "poison", "empty_strided": "poison",
    "new_empty": "poison", "new_empty_strided": "poison", "zeros": 0, "zeros_like": 0,
    "new_zeros": 0, "ones": 1, "ones_like": 1, "new_ones": 1, "full": "arg", "full_like": "arg",
    "new_full": "arg",
}  # fmt: skip
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "bool")  # fmt: skip


def exception_kind(exc: BaseException) -> str:
    """The exception's type name when it is a builtin or torch/triton class; else a fixed word
    (a candidate-defined class name is text the candidate chose)."""
    cls = type(exc)
    mod = getattr(cls, "__module__", "")
    if mod == "builtins" and getattr(builtins, cls.__name__, None) is cls:
        return cls.__name__
    if mod.split(".")[0] in ("torch", "triton"):
        return f"{mod.split('.')[0]}.{cls.__name__}"[:80]
    return "CandidateDefinedError"


def _function_mode(torch: Any, obs: Observer, child: Child):
    """A TorchFunctionMode: torch calls outside Triton launches (observation), and what the
    recording needs (allocations and fills)."""
    from torch.overrides import TorchFunctionMode

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name not in ALLOWED_FUNCS and (not obs.in_launch or obs.called_from_candidate()):
                obs.codes.add("torch_compute")  # in a launch: the kernel body's own torch call
            out = func(*args, **kwargs)
            rec = child.recorder
            if rec is not None and rec.active and not obs.in_launch:
                if name in ALLOCATORS and type(out) is torch.Tensor and out.is_cuda:
                    fill = ALLOCATORS[name]
                    if fill == "arg":
                        fill = (
                            args[-1]
                            if name.startswith("new_") or name == "full_like"
                            else (args[1] if len(args) > 1 else kwargs.get("fill_value"))
                        )
                    rec.on_alloc(out, fill, out.dtype)
                elif name in ("zero_", "fill_") and args and type(args[0]) is torch.Tensor:
                    rec.on_fill(args[0], 0 if name == "zero_" else args[1])
                elif name in ("copy_", "clone", "contiguous", "to") and out is not args[0]:
                    rec.unsupported.add("copy")
            return out

    return Watch


# The parent's requests (guard.py and guard_gpu.py send them; one frame each, one reply frame).
class LoadRequest(TypedDict):
    op: Literal["load"]


class ArenaRequest(TypedDict):  # CPU path: map the parent's memfd arena
    op: Literal["arena"]
    size: int


class CallRequest(TypedDict):  # CPU path: inputs are views of the arena, the output a slot
    op: Literal["call"]
    args: list[dict[str, Any]]  # {"tensor": arena spec} or {"value": a plain argument}
    kwargs: dict[str, Any]
    slot: dict[str, Any]


class RecordRequest(TypedDict):  # GPU path: record the launches on inputs of our own
    op: Literal["record"]
    args: list[dict[str, Any]]  # {"tensor": spec} or {"value": a plain argument}
    kwargs: dict[str, Any]
    seed: NotRequired[int]


class EndCaseRequest(TypedDict):
    op: Literal["end_case"]


class MarkRequest(TypedDict):  # CPU path: before each timed call (Observer.mark)
    op: Literal["mark"]


class ExitRequest(TypedDict):
    op: Literal["exit"]


Request = (
    LoadRequest | ArenaRequest | CallRequest | RecordRequest | EndCaseRequest | MarkRequest
    | ExitRequest
)  # fmt: skip


class Child:
    def __init__(self, cfg: dict[str, Any], fd_out: int) -> None:
        import torch
        import triton  # noqa: F401 - imported before the candidate: the hooks go in below

        self.torch, self.cfg, self.fd_out = torch, cfg, fd_out
        self.cuda = cfg["device"] == "cuda"
        self.obs = Observer(torch, cfg["candidate_dir"])
        self.recorder: guard_record.Recorder | None = None
        if self.cuda:
            self.recorder = guard_record.Recorder(self.obs)
        else:
            self.obs.install_interpreter_hook()
        self.obs.install_host_hooks()
        self.Watch = _function_mode(torch, self.obs, self)
        # Wake torch's thread pools (and CUDA's) now, so that every OS thread seen later that
        # is not in this baseline was started by the candidate (a raw _thread included).
        (torch.randn(1 << 16) * 2).sum()
        torch.randn(64, 64) @ torch.randn(64, 64)
        if self.cuda:
            (torch.ones(1 << 16, device="cuda") * 2).sum().item()
        self.threads = set(threading.enumerate())
        self.os_threads = len(os.listdir("/proc/self/task"))
        watched: list[tuple[Any, str]] = [(time, n) for n in ("perf_counter", "perf_counter_ns",
                                                               "time", "monotonic")]  # fmt: skip
        watched += [(torch.Tensor, n) for n in ("numpy", "tolist", "__array__", "item")]
        watched += [(m, n) for m, n in THREAD_STARTS if hasattr(m, n)]
        if self.cuda:
            watched += [(torch.cuda, "synchronize"), (torch.cuda.Event, "elapsed_time"),
                        (torch.cuda.Event, "record"), (torch.cuda.CUDAGraph, "replay")]  # fmt: skip
            if self.recorder is not None and self.recorder.cuda is not None:
                watched += [(self.recorder.cuda, "_launch"), (sys.modules["cudadrv"].Driver, "fn")]
        else:
            from triton.runtime.interpreter import GridExecutor

            watched.append((GridExecutor, "__call__"))
        self.watched = [(o, n, getattr(o, n)) for o, n in watched]
        sys.addaudithook(self.obs.hook)
        self.fn: Any = None
        self.module_entry: Any = None  # a ModelNew class: built and bound outside the recording
        self.arena: mmap.mmap | None = None
        self.held: list[Any] = []

    def reply(self, **msg: Any) -> None:
        wire.send(self.fd_out, msg)

    def tampered(self) -> bool:
        """Timers, synchronize and the launch hooks are the objects they were at start."""
        return any(getattr(o, n, None) is not f for o, n, f in self.watched)

    def codes(self) -> list[str]:
        codes = set(self.obs.codes)
        if self.tampered():
            codes.add("monkey_patch")
        if [t for t in threading.enumerate() if t not in self.threads and t.is_alive()]:
            codes.add("background_thread")
        if len(os.listdir("/proc/self/task")) > self.os_threads:
            codes.add("background_thread")
        return sorted(codes)

    def load(self) -> None:
        cfg = self.cfg
        file_name, func = cfg["entry"].split(":", 1)
        self.obs.open()
        error = ""
        try:
            spec = importlib.util.spec_from_file_location(
                "_hl_candidate", os.path.join(cfg["candidate_dir"], file_name)
            )
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules["_hl_candidate"] = mod
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            self.fn = modelnew.resolve(mod, func, cfg.get("module"))
            if not callable(self.fn):
                error = "no_entry"
            elif modelnew.is_module_class(self.fn):
                self.module_entry = modelnew.ModuleEntry(self.fn, cfg.get("module"))
        except BaseException as exc:  # the candidate's import failing is a result, not a crash
            error = exception_kind(exc)
        finally:
            self.obs.close()
        self.reply(ok=not error, error=error, codes=self.codes())
        self.obs.reset()

    # -- arguments -------------------------------------------------------------------------------
    def tensor_from_arena(self, spec: dict[str, Any]) -> Any:
        torch = self.torch
        dtype = getattr(torch, spec["dtype"])
        numel = 1
        for s in spec["shape"]:
            numel *= int(s)
        if not numel:
            return torch.empty([int(s) for s in spec["shape"]], dtype=dtype)
        assert self.arena is not None
        t = torch.frombuffer(self.arena, dtype=dtype, count=numel, offset=int(spec["offset"]))
        return t.view(*spec["shape"]) if spec["shape"] else t.view(())

    def random_tensor(self, spec: dict[str, Any], gen: Any) -> Any:
        torch = self.torch
        dtype = getattr(torch, spec["dtype"])
        shape = [int(s) for s in spec["shape"]]
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen, device="cuda").to(dtype)
        return torch.randint(0, 2, shape, generator=gen, device="cuda").to(dtype)

    # -- requests --------------------------------------------------------------------------------
    def map_arena(self, msg: ArenaRequest) -> None:
        """CPU: map the parent's arena (the memfd it passed at start), for the whole verify."""
        self.arena = mmap.mmap(int(self.cfg["memfd"]), int(msg["size"]))
        self.held = []
        self.reply(ok=True)

    def mark(self, msg: MarkRequest) -> None:
        """Before a timed call (CPU): the class snapshot, outside the parent's clock."""
        self.obs.mark()
        self.reply(ok=True)

    def end_case(self, msg: EndCaseRequest) -> None:
        self.held = []
        if self.cuda:
            self.torch.cuda.empty_cache()
        self.reply(ok=True)

    def call(self, msg: CallRequest) -> None:
        """CPU: the parent's inputs from the arena, the output copied into the parent's slot."""
        args = [self.tensor_from_arena(a["tensor"]) if "tensor" in a else a["value"]
                for a in msg["args"]]  # fmt: skip
        facts = self._invoke(args, msg.get("kwargs") or {})
        out = facts.pop("out")
        slot = msg["slot"]
        if facts["plain"] and facts["shape"] == slot["shape"] and facts["dtype"] == slot["dtype"]:
            if out.numel():
                self.tensor_from_arena(slot).copy_(out)
            facts["copied"] = True
        self.reply(**facts, codes=self.codes())
        self.obs.reset()

    def record(self, msg: RecordRequest) -> None:
        """GPU: warm-up call, then the recorded call, on inputs of our own."""
        torch = self.torch
        gen = torch.Generator(device="cuda")
        gen.manual_seed(int(msg.get("seed", 0)))
        kwargs = msg.get("kwargs") or {}
        results = []
        for phase in ("warmup", "record"):
            args = [self.random_tensor(a["tensor"], gen) if "tensor" in a else a["value"]
                    for a in msg["args"]]  # fmt: skip
            tensors = [a for a in args if type(a) is torch.Tensor]
            assert self.recorder is not None
            if phase == "record":
                self.recorder.begin(tensors)
            facts = self._invoke(args, kwargs)
            out = facts.pop("out")
            recording = self.recorder.finish(out) if phase == "record" else None
            results.append((facts, recording))
            del out
        facts, recording = results[1]
        self.reply(**facts, recording=recording, codes=self.codes())
        self.obs.reset()

    def _invoke(self, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        self.obs.reset()
        if self.cuda:
            self.obs.stream = torch.cuda.current_stream().cuda_stream
        self.obs.open()
        error, out = "", None
        try:
            fn, call_args, call_kwargs = self.fn, args, kwargs
            if self.module_entry is not None:
                # ModelNew(*init) is built on the first (warm-up) call and the parameters bound
                # without a copy, both outside the watched call: construction is not math on
                # the inputs, and the recording sees the bound inputs, not memory of its own.
                fn, call_args = self.module_entry.bind(args, kwargs)
                call_kwargs = {}
            with self.Watch():
                out = fn(*call_args, **call_kwargs)
            if self.cuda:
                torch.cuda.synchronize()
        except BaseException as exc:
            error = exception_kind(exc)
        finally:
            self.obs.close()
        facts: dict[str, Any] = {"error": error, "plain": type(out) is torch.Tensor, "out": out}
        if out is not None and facts["plain"]:
            facts["shape"] = list(out.shape)
            facts["dtype"] = str(out.dtype).removeprefix("torch.")
            base = out.untyped_storage().data_ptr()
            facts["aliases_input"] = any(
                type(a) is torch.Tensor and a.untyped_storage().data_ptr() == base and a.numel()
                for a in args
            )
            facts["reused_output"] = any(h.untyped_storage().data_ptr() == base for h in self.held)
            if not self.cuda:
                self.held.append(out)
        facts["own_launches"] = self.obs.own_launches
        return facts

    def serve(self, fd_in: int) -> None:
        serve_ops(fd_in, {
            "load": lambda msg: self.load(),
            "arena": self.map_arena,
            "call": self.call,
            "record": self.record,
            "end_case": self.end_case,
            "mark": self.mark,
        })  # fmt: skip


def serve_ops(fd_in: int, handlers: Mapping[str, Callable[[Any], None]]) -> None:
    """Answer the parent's requests until it says exit (or sends an op not in the table)."""
    while True:
        try:
            msg = wire.recv(fd_in)
        except wire.WireError:
            return
        op = msg.get("op") if isinstance(msg, dict) else None
        handler = handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            return
        handler(msg)


def child_main(make: Callable[[dict[str, Any], int], Any],
               before_cfg: Callable[[], None] = lambda: None) -> int:  # fmt: skip
    """A candidate's process (this one's and step_child's): the protocol on a copy of stdout
    (the candidate's prints go to stderr), `before_cfg()`, its cfg, then
    `make(cfg, out).serve(0)`; a failure becomes a fatal frame with the exception's type only."""
    out = os.dup(1)
    os.dup2(2, 1)  # candidate prints go to stderr, never into the protocol
    before_cfg()
    try:
        cfg = wire.recv(0, timeout_s=60)
    except wire.WireError:
        return 2
    try:
        make(cfg, out).serve(0)
    except Exception as exc:  # the parent sees EOF or this and says why in its own words
        try:
            wire.send(out, {"fatal": exception_kind(exc)})
        except OSError:
            pass
    finally:
        sys.stdout.flush()
        time.sleep(0)
    os._exit(0)  # skip atexit handlers the candidate may have registered


def _imports() -> None:
    import torch  # noqa: F401 - while the parent gets ready (guard_spawn.prespawn): then the cfg
    import triton  # noqa: F401


def main() -> int:
    return child_main(Child, _imports)


if __name__ == "__main__":
    sys.exit(main())
