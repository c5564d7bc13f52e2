"""A recorded decode step (step_record.py, from the candidate's process) checked before the replay
runs it (step_guard.py, trusted side): every operator an ATen operator outside DENIED, every
argument of a kind the replay can express, every tensor named by a storage the step had at that
point ("arena", "tokens", or one an earlier call made) inside that storage's bounds where they
are known, every launch as guard_schema checks the kernel verify's, the result a tensor. What
breaks this is `forged_recording`; what the recorder says it could not record is `unreplayable`,
in the harness's words (UNREPLAYABLE). Nothing in a recording is believed before this check, and
passing it proves nothing: the replay's logits are compared with the reference on other tokens.

Which library calls a step may make (task.md says the same): any ATen operator, run again by the
replay process's own torch on the replay's tensors (cuBLAS for matmuls, torch's kernels for the
rest), except those in DENIED (a host read, a storage swap, stream bookkeeping). Kernels of
the step's own (Triton, harnesslab_cuda) are replayed from their recorded binaries.

Staged beside step_guard.py; standard library only.
"""

from __future__ import annotations

import base64
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .guard_schema import DTYPES, UNREPLAYABLE, Bad, clean_kernels, clean_launch
else:
    from guard_schema import DTYPES, UNREPLAYABLE, Bad, clean_kernels, clean_launch

MAX_OPS = 20000  # operator calls in one recorded step (step_record.py stops recording past it)
CONST_BYTES = 1 << 16  # the largest tensor from host data a recording keeps by value
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2,
            "int32": 4, "int64": 8, "uint8": 1, "bool": 1}  # fmt: skip
OP_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,80}\.[A-Za-z_][A-Za-z0-9_]{0,40}$")
# ATen operators the replay refuses: a host read, a swap of a tensor's storage, a resize in
# place, stream bookkeeping, an assertion that syncs.
DENIED = {"_local_scalar_dense", "item", "set_", "resize_", "resize_as_", "record_stream",
          "_assert_async", "_assert_scalar", "_print", "_nested_tensor_from_mask"}  # fmt: skip
STEP_UNREPLAYABLE = {
    **UNREPLAYABLE,
    "foreign_memory": "a launch used memory the step did not get from the State or make itself",
    "foreign_tensor": "the step used a tensor made before it (kept in state.scratch or a "
    "module), or one over 64 KiB from host data (torch.tensor): make it inside the step",
    "host_tensor": "the step used a tensor in host memory",
    "host_read": "the step read a tensor on the host (.item(), .tolist(), .cpu())",
    "graph_replay": "the step replayed a CUDA graph while it was recorded (it gets a fresh "
    "state.scratch then: run the work)",
    "interpreted_launch": "a Triton kernel ran in the interpreter (the replay runs compiled "
    "GPU kernels and ATen operators only)",
    "custom_op": "the step called an operator outside ATen",
    "argument": "an operator argument the replay cannot express",
    "too_many_ops": f"more than {MAX_OPS} operator calls in one step",
}
LAYOUTS = {"strided"}
MEMORY_FORMATS = {"contiguous_format", "preserve_format", "channels_last"}


def _int(x: Any, lo: int, hi: int, what: str) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise Bad("forged_recording", f"{what} is not an integer in {lo}..{hi}")
    return x


class _Check:
    def __init__(self, device: str, sizes: dict[str, int | None]) -> None:
        self.device, self.sizes = device, sizes

    def tensor(self, ref: dict[str, Any]) -> dict[str, Any]:
        if ref.get("d") not in DTYPES:
            raise Bad("forged_recording", "a tensor's dtype is not one the replay knows")
        if "const" in ref:
            return self.const(ref)
        if "empty" in ref:
            sizes = ref["empty"] if isinstance(ref["empty"], list) else [1]
            empty = [_int(n, 0, 1 << 31, "a tensor's size") for n in sizes[:8]]
            if 0 not in empty:
                raise Bad("forged_recording", "an empty tensor with no zero size")
            return {"empty": empty, "d": ref["d"]}
        if ref.get("t") not in self.sizes:
            raise Bad("forged_recording", "a tensor names no storage of the step")
        shape = ref.get("s")
        stride = ref.get("st")
        if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) > 8 or (
                len(shape) != len(stride)):  # fmt: skip
            raise Bad("forged_recording", "a tensor's shape and strides do not match")
        return {"t": ref["t"], "o": _int(ref.get("o"), 0, 1 << 40, "a storage offset"),
                "s": [_int(n, 0, 1 << 31, "a tensor's size") for n in shape],
                "st": [_int(n, 0, 1 << 40, "a tensor's stride") for n in stride],
                "d": ref["d"]}  # fmt: skip

    def const(self, ref: dict[str, Any]) -> dict[str, Any]:
        """A small tensor recorded by value (at most CONST_BYTES): its bytes match its
        shape and dtype."""
        raw, shape = ref["const"], ref.get("s")
        if not isinstance(raw, str) or len(raw) > 2 * CONST_BYTES or not isinstance(shape, list):
            raise Bad("forged_recording", "a tensor recorded by value is malformed")
        try:
            nbytes = len(base64.b64decode(raw, validate=True))
        except ValueError:
            raise Bad("forged_recording", "a tensor recorded by value is malformed") from None
        shape = [_int(n, 0, CONST_BYTES, "a tensor's size") for n in shape[:8]]
        if nbytes > CONST_BYTES or nbytes != math.prod(shape) * ITEMSIZE[ref["d"]]:
            raise Bad("forged_recording", "a tensor recorded by value has the wrong size")
        return {"const": raw, "s": shape, "d": ref["d"]}

    def value(self, v: Any, depth: int = 0) -> Any:
        if depth > 4:
            raise Bad("forged_recording", "an argument nests too deep")
        if v is None or type(v) in (bool, int):
            return v
        if isinstance(v, str):
            if len(v) > 64:
                raise Bad("forged_recording", "a string argument is too long")
            return v
        if isinstance(v, list):
            if len(v) > 4096:
                raise Bad("forged_recording", "a list argument is too long")
            return [self.value(x, depth + 1) for x in v]
        if not isinstance(v, dict) or len(v) == 0:
            raise Bad("forged_recording", "an argument of no known kind")
        if "f" in v and len(v) == 1 and isinstance(v["f"], str):
            try:
                float.fromhex(v["f"])
            except (ValueError, OverflowError):
                raise Bad("forged_recording", "a float argument is malformed") from None
            return v
        if "dtype" in v and len(v) == 1:
            if v["dtype"] not in DTYPES:
                raise Bad("unreplayable", STEP_UNREPLAYABLE["argument"])
            return v
        if "device" in v and len(v) == 1:
            if v["device"] != self.device:
                raise Bad("unreplayable", STEP_UNREPLAYABLE["host_tensor"])
            return v
        if "layout" in v and len(v) == 1:
            if v["layout"] not in LAYOUTS:
                raise Bad("unreplayable", STEP_UNREPLAYABLE["argument"])
            return v
        if "memory_format" in v and len(v) == 1:
            if v["memory_format"] not in MEMORY_FORMATS:
                raise Bad("unreplayable", STEP_UNREPLAYABLE["argument"])
            return v
        return self.tensor(v)


def validate(rec: Any, device: str, kernels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The recording as the replay takes it ({"ops", "output", "uses": the kernel ids its
    launches name}), or Bad. `kernels`: the role's kernels from its earlier recordings (the
    recorder sends a kernel once per process); this recording's new ones are added to it."""
    if not isinstance(rec, dict):
        raise Bad("forged_recording", "the recording is not an object")
    unsupported = rec.get("unsupported") or []
    if not isinstance(unsupported, list):
        raise Bad("forged_recording", "bad 'unsupported' list")
    known = [STEP_UNREPLAYABLE[u] for u in unsupported
             if isinstance(u, str) and u in STEP_UNREPLAYABLE]  # fmt: skip
    if known:
        raise Bad("unreplayable", "; ".join(sorted(set(known))))
    new = clean_kernels(rec)
    if device != "cuda" and new:
        raise Bad("forged_recording", "kernel binaries in a recording on the CPU")
    kernels.update(new)
    ops = rec.get("ops")
    if not isinstance(ops, list) or len(ops) > MAX_OPS:
        raise Bad("forged_recording", "bad operator list")
    sizes: dict[str, int | None] = {"arena": None, "tokens": None}
    check = _Check(device, sizes)
    clean: list[dict[str, Any]] = []
    for n, op in enumerate(ops):
        if not isinstance(op, dict):
            raise Bad("forged_recording", "bad operator call")
        if op.get("op") == "launch":
            if device != "cuda":
                raise Bad("forged_recording", "a kernel launch in a recording on the CPU")
            launch = clean_launch(n, op, kernels, sizes)
            launch["scratch"] = {p["buf"]: sizes[p["buf"]] for p in launch["params"]
                                 if p["k"] == "scratch" and p.get("buf")}  # fmt: skip
            clean.append(launch)
            continue
        fn = op.get("fn")
        if op.get("op") != "aten" or not isinstance(fn, str) or not OP_NAME.match(fn):
            raise Bad("forged_recording", "an operator call names no ATen operator")
        if fn.split(".", 1)[0] in DENIED:
            raise Bad("unreplayable", f"the step called {fn.split('.', 1)[0]}, which the "
                      "replay does not run")  # fmt: skip
        args, kwargs = op.get("args"), op.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict) or len(kwargs) > 32:
            raise Bad("forged_recording", "an operator call's arguments are malformed")
        entry = {"op": "aten", "fn": fn, "args": check.value(args),
                 "kwargs": {str(k)[:64]: check.value(v) for k, v in kwargs.items()},
                 "new": []}  # fmt: skip
        for made in op.get("new") or []:
            if not (isinstance(made, list) and len(made) == 2 and isinstance(made[1], str)
                    and re.fullmatch(r"v[0-9]{1,6}", made[1]) and made[1] not in sizes):  # fmt: skip
                raise Bad("forged_recording", "a storage made by an operator is malformed")
            entry["new"].append([_int(made[0], 0, 64, "an output index"), made[1]])
            sizes[made[1]] = None
        clean.append(entry)
    out = rec.get("output")
    if not isinstance(out, dict) or "t" not in out:
        raise Bad("forged_recording", "the step's result is not a tensor of its storages")
    uses = sorted({o["kernel"] for o in clean if o["op"] == "launch"})
    return {"ops": clean, "output": check.tensor(out), "uses": uses}


__all__ = ["CONST_BYTES", "DENIED", "ITEMSIZE", "MAX_OPS", "STEP_UNREPLAYABLE", "validate"]
