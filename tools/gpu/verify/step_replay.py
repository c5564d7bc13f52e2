"""The replay process of a step task's guarded verify: it runs the candidate's recorded steps
(step_record.py, checked by step_schema.py) on the candidate's State, for the parent to check
and time. No agent Python runs here.

Runs sandboxed (started by step_guard.py through guard_kid.Kid, like step_child.py, over the
same arena: step_arena.py); standard library, torch and cudadrv.py. It speaks step_child.py's
protocol ("arena", "trace", "step", "timed_step", so step_timed.TimedPass times it as it timed
the child) plus:
- "program": one recorded step (the parent's key: its index in the trace) and the kernels it
  launches that this process has not loaded yet, or `same_as` an earlier step's key (the
  parent found the same recording: one program, one graph for both);
- "prepare": on a GPU, each named program captured as a CUDA graph of this process's own
  (an untimed run first, once per process, as torch.cuda.graph asks), so a timed step is one
  graph replay; on the CPU nothing (a step runs the program's calls one by one);
- "drop": programs and graphs freed (a segment's, once it is checked).
A step (its `program` named in the request) runs the recorded calls in order on this
process's tensors: each ATen operator by this process's torch (cuBLAS for matmuls), each launch
from its recorded binary (replay.launch_args, on torch's current stream), a tensor argument
rebuilt over the storage the recording names (the arena, a clone of the arena's tokens made at
the step's start, or what an earlier call made) and checked to lie inside it; then the result
copied into the arena's logits slot. The candidate's kernels run in this process's context and
can write anywhere in it, so nothing here decides: the parent compares the logits and the cache
with its reference and takes the time with its own clock.
"""

from __future__ import annotations

import base64
import math
import os
import sys
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its siblings

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .devmem import driver
    from .guard_child import child_main, exception_kind, serve_ops
    from .replay import enqueue_launch, launch_args, load_kernel
    from .step_child import StepChild
else:
    from devmem import driver
    from guard_child import child_main, exception_kind, serve_ops
    from replay import enqueue_launch, launch_args, load_kernel
    from step_child import StepChild


class StepReplay(StepChild):
    def __init__(self, cfg: dict[str, Any], out: int) -> None:
        super().__init__(cfg, out)
        self.dev = "cuda" if self.cuda else "cpu"
        self.drv: Any = None
        if self.cuda:
            self.drv = driver()
        self.kernels: dict[str, dict[str, Any]] = {}
        self.programs: dict[int, dict[str, Any]] = {}
        self.graphs: dict[int, tuple[Any, bool]] = {}  # key -> (graph, result copied)
        self.alias: dict[int, int] = {}  # a step's key -> the key its program came with
        self.warm = False

    # -- requests --------------------------------------------------------------------------------
    def trace(self, msg: dict[str, Any]) -> None:
        self.views = self.arena.views(msg["layout"])
        self.drop({"keys": list(self.alias)})
        self.reply(ok=True)

    def program(self, msg: dict[str, Any]) -> None:
        error = ""
        try:
            for k in msg.get("kernels") or []:
                if k["id"] not in self.kernels:
                    self.kernels[k["id"]] = load_kernel(self.drv, k)
            key = int(msg["key"])
            if "same_as" in msg:  # the same recording as an earlier step's
                self.alias[key] = self.alias[int(msg["same_as"])]
                self.reply(error="")
                return
            prog = msg["program"]
            for op in prog["ops"]:
                if op["op"] == "aten":
                    name, overload = op["fn"].split(".", 1)
                    op["call"] = getattr(getattr(self.torch.ops.aten, name), overload)
                    if not isinstance(op["call"], self.torch._ops.OpOverload):
                        raise ValueError("not an ATen operator")
                    for arg in op["args"]:
                        if isinstance(arg, dict) and "const" in arg:
                            arg["tensor"] = self.const(arg)
            self.programs[key] = prog
            self.alias[key] = key
        except BaseException as exc:
            error = exception_kind(exc)
        self.reply(error=error)

    def prepare(self, msg: dict[str, Any]) -> None:
        """Each program of msg["keys"] captured as a CUDA graph (on a GPU)."""
        torch, error = self.torch, ""
        try:
            for key in dict.fromkeys(self.alias[int(k)] for k in msg["keys"]):
                if not self.cuda or key in self.graphs:
                    continue
                prog = self.programs[key]
                if not self.warm:  # one untimed run on a side stream before the first capture
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        self.execute(prog)
                    torch.cuda.current_stream().wait_stream(side)
                    torch.cuda.synchronize()
                    self.warm = True
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    copied = self.execute(prog)
                self.graphs[key] = (graph, copied)
            if self.cuda:
                torch.cuda.synchronize()
        except BaseException as exc:
            error = exception_kind(exc)
        self.reply(error=error)

    def drop(self, msg: dict[str, Any], reply: bool = False) -> None:
        """The steps `keys` forgotten, and each program (and graph) no step names any more."""
        for key in msg["keys"]:
            self.alias.pop(int(key), None)
        named = set(self.alias.values())
        for key in [k for k in self.programs if k not in named]:
            self.programs.pop(key)
            self.graphs.pop(key, None)
        if reply:
            self.reply(error="")

    def run_step(self, msg: dict[str, Any]) -> tuple[str, bool]:
        try:
            key = self.alias[int(msg.get("program", -1))]
            if key in self.graphs:
                graph, copied = self.graphs[key]
                graph.replay()
                return "", copied
            return "", self.execute(self.programs[key])
        except BaseException as exc:
            return exception_kind(exc), False

    # -- one recorded step -----------------------------------------------------------------------
    def execute(self, prog: dict[str, Any]) -> bool:
        """The program's calls in order; its result copied into the logits slot when it is a
        tensor of the slot's shape and dtype (whether it was)."""
        tokens = self.views["tokens"].clone()
        storages: dict[str, Any] = {"arena": self.views["logits"].untyped_storage(),
                                    "tokens": tokens.untyped_storage()}  # fmt: skip
        for n, op in enumerate(prog["ops"]):
            if op["op"] == "launch":
                self.launch(n, op, storages)
                continue
            args = [self.value(a, storages) for a in op["args"]]
            kwargs = {k: self.value(v, storages) for k, v in op["kwargs"].items()}
            out = op["call"](*args, **kwargs)
            flat = list(out) if isinstance(out, list | tuple) else [out]
            for t in flat:  # on the CPU a call's work would run once, at capture, not replayed
                if isinstance(t, self.torch.Tensor) and t.device.type != self.dev:
                    raise ValueError("a tensor on another device")
            for i, key in op["new"]:
                storages[key] = flat[i].untyped_storage()
        out = self.tensor(prog["output"], storages)
        slot = self.views["logits"]
        if out.shape != slot.shape or out.dtype != slot.dtype:
            return False
        slot.copy_(out)
        return True

    def launch(self, n: int, op: dict[str, Any], storages: dict[str, Any]) -> None:
        torch = self.torch
        scratch: dict[str, Any] = {}
        for p in op["params"]:
            if p["k"] == "scratch" and p.get("buf"):  # the launcher's scratch: fresh, as Triton's
                size = int(op["scratch"][p["buf"]])
                scratch[p["buf"]] = torch.empty(size, dtype=torch.uint8, device="cuda")

        def addr(buf: str, offset: int) -> int:
            st = scratch[buf].untyped_storage() if buf in scratch else storages[buf]
            if not 0 <= offset <= st.nbytes():
                raise ValueError("a pointer past its storage")
            return int(st.data_ptr()) + offset

        args = launch_args(self.drv, self.kernels[op["kernel"]], op, addr)
        enqueue_launch(self.drv, args, torch.cuda.current_stream().cuda_stream)

    def value(self, v: Any, storages: dict[str, Any]) -> Any:
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, list):
            return [self.value(x, storages) for x in v]
        if "f" in v:
            return float.fromhex(v["f"])
        if "dtype" in v:
            return getattr(self.torch, v["dtype"])
        if "device" in v:
            return self.torch.device(self.dev)
        if "layout" in v:
            return self.torch.strided
        if "memory_format" in v:
            return getattr(self.torch, v["memory_format"])
        if "const" in v:  # made on the device when the program came (program()): a fresh copy
            return v["tensor"].clone()
        return self.tensor(v, storages)

    def const(self, ref: dict[str, Any]) -> Any:
        """A tensor the recording kept by value, on this process's device."""
        torch = self.torch
        raw = bytearray(base64.b64decode(ref["const"]))
        flat = (
            torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        dtype = getattr(torch, ref["d"])
        return flat.view(dtype).reshape(ref["s"]).to(self.dev, copy=True)

    def tensor(self, ref: dict[str, Any], storages: dict[str, Any]) -> Any:
        """The tensor a recording names, over this step's storage of that name, checked to lie
        inside it."""
        torch = self.torch
        dtype = getattr(torch, ref["d"])
        if "empty" in ref:
            return torch.empty(ref["empty"], dtype=dtype, device=self.dev)
        st = storages[ref["t"]]
        shape, stride, off = ref["s"], ref["st"], ref["o"]
        if math.prod(shape):
            last = off + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
            if (last + 1) * dtype.itemsize > st.nbytes():
                raise ValueError("a tensor past its storage")
        return torch.empty(0, dtype=dtype, device=self.dev).set_(st, off, shape, stride)

    def serve(self, fd_in: int) -> None:
        self.fd_in = fd_in
        serve_ops(fd_in, {"arena": self.map_arena, "trace": self.trace,
                          "program": self.program, "prepare": self.prepare,
                          "drop": lambda msg: self.drop(msg, reply=True),
                          "step": self.step, "timed_step": self.timed_step})  # fmt: skip


def main() -> int:
    return child_main(StepReplay)


if __name__ == "__main__":
    sys.exit(main())
