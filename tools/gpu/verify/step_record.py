"""One decode step's work, recorded in the candidate's process for the step verify's replay
(step_child.py's "record" op; step_schema.py checks the recording, step_replay.py runs it).

A recording is what the step asked of torch and of the GPU, in order:
- every ATen operator call that reached torch's dispatcher (a TorchDispatchMode: matmuls through
  cuBLAS, elementwise math, indexing, allocations, copies), with its arguments; a tensor argument
  is named by its storage ("arena": the State the parent owns, "tokens": this step's tokens,
  "v<n>": a storage an earlier call of the step made) and its offset, shape, strides and dtype;
- on a GPU, every Triton or harnesslab_cuda launch, recorded at the launcher as the kernel
  verify records it (guard_record.Recorder: kernel binary, grid, scalar arguments), each pointer
  named by the storage it points into and its byte offset;
- which tensor the step returned.
A tensor the step makes from host data (torch.tensor(state.host_lengths): ATen's lift_fresh) is
recorded by value when it is small (CONST_BYTES): each step has its own recording, replayed for
the same step of the timed pass (the same lengths, other tokens and prompts), so what the step
derived from the host's lengths holds there too. Nothing else is replayed: Python the step ran
on the host, a tensor it made before the step (kept in state.scratch or a module), a host read
(.item(), .tolist()), a CUDA graph it replays, a kernel the interpreter ran. What the recorder
noticed of those goes into `unsupported` (for a clear reason); what it did not notice simply is
not in the recording, and the replay's logits, checked by the parent on other tokens, come out
wrong. While recording, the step gets a fresh `state.scratch` holding {"recording": True}, and
capturing a CUDA graph raises.

Runs in the candidate's process (hostile): nothing in a recording is evidence until the trusted
side has checked it (step_schema.py) and the replay's outputs have been compared with the
reference. Standard library, torch (and triton on a GPU: guard_record.py).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import guard_record
    from .step_schema import CONST_BYTES, MAX_OPS
else:
    import guard_record
    from step_schema import CONST_BYTES, MAX_OPS


class _Quiet:
    """guard_record.Recorder's observer, where nothing is observed (the step verify's replay
    needs no reason codes from the candidate's process)."""

    def launch(self, fn: Any) -> None:
        pass

    def launch_at(self, path: str, stream: Any) -> None:
        pass


class _Launches(guard_record.Recorder):  # type: ignore[misc]
    """Triton's and harnesslab_cuda's launches, each pointer named by a storage of the step."""

    def __init__(self, owner: StepRecorder) -> None:
        super().__init__(_Quiet())
        self.owner = owner

    def ref(self, value: Any) -> dict[str, Any]:
        return self.owner.pointer(value)


class StepRecorder:
    """Records one step at a time (record()); built before the candidate's module is imported,
    so that on a GPU its kernels' handles are seen as Triton loads them."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch, self.device = torch, device
        self.active = False
        self.ops: list[dict[str, Any]] = []
        self.unsupported: set[str] = set()
        self.storages: dict[int, tuple[str, int]] = {}  # storage base -> (key, nbytes)
        self.keep: list[Any] = []  # every tensor the step made: no address is reused mid-step
        self.sent: set[str] = set()  # kernel ids already sent to the parent
        self.launches = _Launches(self) if device == "cuda" else None
        self._hooks()

    # -- what is watched -------------------------------------------------------------------------
    def _hooks(self) -> None:
        torch, rec = self.torch, self
        graph = torch.cuda.CUDAGraph
        begin, replay = graph.capture_begin, graph.replay

        def capture_begin(g: Any, *a: Any, **k: Any) -> Any:
            if rec.active:
                raise RuntimeError("CUDA graph capture is off while the verify records a step")
            return begin(g, *a, **k)

        def graph_replay(g: Any, *a: Any, **k: Any) -> Any:
            if rec.active:
                rec.unsupported.add("graph_replay")
            return replay(g, *a, **k)

        graph.capture_begin, graph.replay = capture_begin, graph_replay
        if self.device != "cuda":
            try:
                from triton.runtime.interpreter import GridExecutor
            except ImportError:
                return
            run = GridExecutor.__call__

            def interpreted(ex: Any, *a: Any, **k: Any) -> Any:
                if rec.active:
                    rec.unsupported.add("interpreted_launch")
                return run(ex, *a, **k)

            GridExecutor.__call__ = interpreted

    # -- naming tensors and pointers -------------------------------------------------------------
    def register(self, tensor: Any, key: str) -> None:
        st = tensor.untyped_storage()
        if st.nbytes():
            self.storages[st.data_ptr()] = (key, st.nbytes())

    def tensor_ref(self, t: Any, const_ok: bool = False) -> dict[str, Any]:
        """How the recording names tensor `t`: its storage, offset, shape, strides and dtype;
        with `const_ok` (torch.tensor(data) inside the step: ATen's lift_fresh) a tensor of no
        known storage is recorded by value, if it is small (CONST_BYTES)."""
        dtype = str(t.dtype).removeprefix("torch.")
        if t.device.type != self.device:
            self.unsupported.add("host_tensor")
            return {"empty": [0], "d": dtype}
        st = t.untyped_storage()
        if not st.nbytes():
            return {"empty": list(t.shape), "d": dtype}
        known = self.storages.get(st.data_ptr())
        if known is None and const_ok and t.numel() * t.element_size() <= CONST_BYTES:
            raw = bytes(t.detach().contiguous().cpu().view(self.torch.uint8).tolist())
            return {"const": base64.b64encode(raw).decode(), "s": list(t.shape), "d": dtype}
        if known is None:
            self.unsupported.add("foreign_tensor")
            return {"empty": [0], "d": dtype}
        return {"t": known[0], "o": int(t.storage_offset()), "s": list(t.shape),
                "st": list(t.stride()), "d": dtype}  # fmt: skip

    def pointer(self, value: Any) -> dict[str, Any]:
        """Which storage of the step a launch's pointer argument points into, and where."""
        if value is None:
            return {"null": True}
        try:
            ptr = value if isinstance(value, int) else int(value.data_ptr())
        except Exception:
            self.unsupported.add("pointer_object")
            return {"null": True}
        if ptr == 0:
            return {"null": True}
        for base, (key, nbytes) in self.storages.items():
            if base <= ptr < base + nbytes:
                return {"buf": key, "offset": ptr - base}
        self.unsupported.add("foreign_memory")
        return {"null": True}

    def encode(self, v: Any, const_ok: bool = False) -> Any:
        torch = self.torch
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, float):
            return {"f": v.hex()}
        if isinstance(v, list | tuple):
            return [self.encode(x) for x in v]
        if isinstance(v, torch.Tensor):
            return self.tensor_ref(v, const_ok)
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"device": v.type}
        if isinstance(v, torch.layout):
            return {"layout": str(v).removeprefix("torch.")}
        if isinstance(v, torch.memory_format):
            return {"memory_format": str(v).removeprefix("torch.")}
        self.unsupported.add("argument")
        return None

    # -- one operator call -----------------------------------------------------------------------
    def on_op(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        if func.namespace != "aten":
            self.unsupported.add("custom_op")
            return None
        if len(self.ops) >= MAX_OPS:
            self.unsupported.add("too_many_ops")
            return None
        name = f"{func._schema.name.split('::', 1)[1]}.{func._overloadname}"
        lift = name.split(".")[0] in ("lift_fresh", "lift_fresh_copy")  # torch.tensor(data)
        entry = {"op": "aten", "fn": name, "args": [self.encode(a, lift) for a in args],
                 "kwargs": {k: self.encode(v) for k, v in kwargs.items()}, "new": []}  # fmt: skip
        self.ops.append(entry)
        return entry

    def on_result(self, entry: dict[str, Any] | None, out: Any) -> None:
        flat = list(out) if isinstance(out, list | tuple) else [out]
        for i, t in enumerate(flat):
            if not isinstance(t, self.torch.Tensor):
                continue
            self.keep.append(t)
            st = t.untyped_storage()
            if t.device.type != self.device:
                self.unsupported.add("host_read")
            elif st.nbytes() and st.data_ptr() not in self.storages:
                key = f"v{len(self.storages)}"
                self.register(t, key)
                if entry is not None:
                    entry["new"].append([i, key])

    def mode(self) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                entry = rec.on_op(func, args, kwargs) if rec.active else None
                if func.__name__.startswith("_local_scalar_dense") and rec.active:
                    rec.unsupported.add("host_read")
                out = func(*args, **kwargs)
                if rec.active:
                    rec.on_result(entry, out)
                return out

        return Record()

    # -- a step ----------------------------------------------------------------------------------
    def record(self, fn: Any, state: Any, tokens: Any, arena: Any) -> tuple[Any, dict[str, Any]]:
        """fn(state, tokens) under the recorder: (its result, the recording). `arena` is any
        tensor over the arena's storage (the State's), `tokens` this step's tokens."""
        self.ops, self.unsupported, self.storages, self.keep = [], set(), {}, []
        self.register(arena, "arena")
        self.register(tokens, "tokens")
        launches = self.launches
        if launches is not None:
            launches.steps, launches.unsupported = self.ops, set()
            launches.active = True
        saved = state.scratch
        state.scratch = {"recording": True}
        self.active = True
        try:
            with self.mode():
                out = fn(state, tokens)
        finally:
            self.active = False
            if launches is not None:
                launches.active = False
            state.scratch = saved
        return out, self.finish(out)

    def finish(self, out: Any) -> dict[str, Any]:
        # the result first: naming it may add a reason (a tensor made before the step)
        output = self.tensor_ref(out) if isinstance(out, self.torch.Tensor) else None
        unsupported = set(self.unsupported)
        kernels: list[dict[str, Any]] = []
        if self.launches is not None:
            unsupported |= self.launches.unsupported
            used = {s["kernel"] for s in self.ops if s["op"] == "launch"}
            for kid in sorted(used - self.sent):
                k = self.launches.kernels[kid]
                kernels.append({n: v for n, v in k.items() if n != "_cubin"})
                self.sent.add(kid)
        self.keep = []
        return {"ops": self.ops, "kernels": kernels, "output": output,
                "unsupported": sorted(unsupported)}  # fmt: skip


__all__ = ["StepRecorder"]
