"""A candidate's recording checked against the replay's schema (the guarded verify's trusted
side, guard_gpu.py step 1): every field typed and bounded, every kernel named and its binary
present, every pointer naming an input or an allocation of the same recording, the output
inside its buffer. What breaks the schema is `forged_recording`; what the replay cannot
express is `unreplayable`. The recording comes from the candidate's process, so nothing in it
is believed before this check.

Staged beside guard_gpu.py; standard library only.
"""

from __future__ import annotations

import re
from typing import Any

KERNEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.]{0,255}$")
SCALAR_TYPES = {"i1", "i8", "u1", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "fp16",
                "bf16", "fp32", "f32", "fp64"}  # fmt: skip
DTYPES = {"float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "bool"}  # fmt: skip
# What the candidate's recorder says it could not record (guard_record.py), in the harness's words.
UNREPLAYABLE = {
    "foreign_memory": "a launch used memory allocated before the call",
    "copy": "the wrapper copied or cast tensors with torch between launches",
    "fill": "a fill the replay cannot express (non-contiguous or 8-byte elements)",
    "unknown_kernel": "a kernel was launched outside Triton's launcher",
    "unrecorded_launch": "the CUDA driver was called around harnesslab_cuda's launcher",
    "no_binary": "a launched kernel has no CUDA binary",
    "pointer_object": "a pointer argument is not a tensor",
    "scalar": "a scalar argument is not a number",
}


class Bad(Exception):
    """A recording that breaks the schema or asks for what the replay cannot do."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


def _int(x: Any, lo: int, hi: int, what: str) -> int:
    if type(x) is not int or not lo <= x <= hi:
        raise Bad("forged_recording", f"{what} is not an integer in {lo}..{hi}")
    return x


def validate(rec: Any, n_inputs: int) -> dict[str, Any]:
    """The recording as this process will use it, or Bad. Names and binaries are kept only to
    be handed to the replayer; none of them ever appears in a reason."""
    if not isinstance(rec, dict):
        raise Bad("forged_recording", "the recording is not an object")
    unsupported = rec.get("unsupported") or []
    if not isinstance(unsupported, list):
        raise Bad("forged_recording", "bad 'unsupported' list")
    known = [UNREPLAYABLE[u] for u in unsupported if isinstance(u, str) and u in UNREPLAYABLE]
    if known:
        raise Bad("unreplayable", "; ".join(sorted(set(known))))
    kernels = clean_kernels(rec)
    allocs = rec.get("allocs") or []
    if not isinstance(allocs, list) or len(allocs) > 64:
        raise Bad("forged_recording", "bad allocation list")
    sizes: dict[str, int | None] = {f"in{i}": None for i in range(n_inputs)}
    for i, a in enumerate(allocs):
        if not isinstance(a, dict):
            raise Bad("forged_recording", "bad allocation")
        sizes[f"a{i}"] = _int(a.get("nbytes"), 1, 1 << 36, "allocation size")
    steps = rec.get("steps") or []
    if not isinstance(steps, list) or len(steps) > 512:
        raise Bad("forged_recording", "bad step list")
    clean_steps = []
    for n, s in enumerate(steps):
        if not isinstance(s, dict):
            raise Bad("forged_recording", "bad step")
        if s.get("op") == "memset":
            pointer(s, sizes)
            clean_steps.append({
                "op": "memset", "buf": s["buf"], "offset": s["offset"],
                "width": _int(s.get("width"), 1, 4, "fill width"),
                "value": _int(s.get("value"), 0, (1 << 32) - 1, "fill value"),
                "count": _int(s.get("count"), 0, 1 << 36, "fill count"),
            })  # fmt: skip
            if clean_steps[-1]["width"] == 3:
                raise Bad("forged_recording", "fill width 3")
            continue
        clean_steps.append(clean_launch(n, s, kernels, sizes))
    out = rec.get("output")
    if isinstance(out, dict) and out.get("empty") is True:
        shape = [_int(x, 0, 1 << 31, "output size") for x in out.get("shape") or []]
        if 0 not in shape or out.get("dtype") not in DTYPES:
            raise Bad("forged_recording", "bad empty output")
        out = {"empty": True, "shape": shape, "dtype": out["dtype"]}
    elif out is not None:
        if not isinstance(out, dict):
            raise Bad("forged_recording", "bad output")
        pointer(out, sizes)
        if out.get("dtype") not in DTYPES:
            raise Bad("forged_recording", "bad output dtype")
        shape = [_int(x, 0, 1 << 31, "output size") for x in out.get("shape") or []]
        strides = [_int(x, 0, 1 << 40, "output stride") for x in out.get("strides") or []]
        if len(shape) != len(strides):
            raise Bad("forged_recording", "output rank mismatch")
        out = {"buf": out["buf"], "offset": out["offset"], "shape": shape, "strides": strides,
               "dtype": out["dtype"]}  # fmt: skip
    return {"kernels": kernels, "sizes": sizes, "steps": clean_steps, "output": out}


def clean_kernels(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A recording's kernel entries, typed and bounded (id -> entry), or Bad."""
    kernels: dict[str, dict[str, Any]] = {}
    for k in rec.get("kernels") or []:
        if not isinstance(k, dict) or not isinstance(k.get("id"), str) or len(k["id"]) > 160:
            raise Bad("forged_recording", "a kernel entry is malformed")
        if not isinstance(k.get("name"), str) or not KERNEL_NAME.match(k["name"]):
            raise Bad("forged_recording", "a kernel name is malformed")
        cubin = k.get("cubin")
        if not isinstance(cubin, str) or len(cubin) > (48 << 20):
            raise Bad("forged_recording", "a kernel binary is missing or too large")
        kernels[k["id"]] = {
            "id": k["id"],
            "name": k["name"],
            "cubin": cubin,
            "shared": _int(k.get("shared"), 0, 1 << 20, "shared memory"),
            "num_warps": _int(k.get("num_warps"), 1, 32, "num_warps"),
            "num_ctas": _int(k.get("num_ctas", 1), 1, 16, "num_ctas"),
            "coop": bool(k.get("coop")),
            "pdl": bool(k.get("pdl")),
            "lang": "cuda" if k.get("lang") == "cuda" else "triton",
        }
    if len(kernels) > 64:
        raise Bad("forged_recording", "more than 64 kernels")
    return kernels


def pointer(p: dict[str, Any], sizes: dict[str, int | None]) -> None:
    """A pointer that names a buffer of `sizes` at a bounded offset (or is null), or Bad."""
    if p.get("null") is True:
        return
    if p.get("buf") not in sizes:
        raise Bad("forged_recording", "a pointer names no buffer of the call")
    _int(p.get("offset"), 0, 1 << 40, "pointer offset")


def clean_launch(n: int, s: dict[str, Any], kernels: dict[str, dict[str, Any]],
                 sizes: dict[str, int | None]) -> dict[str, Any]:  # fmt: skip
    """Recorded launch `n` as the replay takes it: its kernel known, its grid and parameters
    typed and bounded, every pointer naming a buffer of `sizes` (its scratch buffers are added
    there as s<n>_global / s<n>_profile), or Bad."""
    if s.get("op") != "launch" or s.get("kernel") not in kernels:
        raise Bad("forged_recording", "a launch names no recorded kernel")
    grid = s.get("grid")
    if not isinstance(grid, list) or len(grid) != 3:
        raise Bad("forged_recording", "bad grid")
    grid = [_int(g, 0, (1 << 31) - 1, "grid size") for g in grid]
    params = []
    for p in s.get("params") or []:
        if not isinstance(p, dict):
            raise Bad("forged_recording", "bad parameter")
        kind = p.get("k")
        if kind == "ptr":
            pointer(p, sizes)
            params.append({"k": "ptr", **({"null": True} if p.get("null") is True else
                           {"buf": p["buf"], "offset": p["offset"]})})  # fmt: skip
        elif kind == "scalar":
            if p.get("type") not in SCALAR_TYPES or type(p.get("value")) not in (int, float, bool):
                raise Bad("forged_recording", "bad scalar parameter")
            params.append({"k": "scalar", "type": p["type"], "value": p["value"]})
        elif kind == "scratch":
            nbytes = _int(p.get("nbytes", 0), 0, 1 << 34, "scratch size")
            name = f"s{n}_{'global' if p.get('which') == 'global' else 'profile'}"
            if nbytes:
                sizes[name] = nbytes
            params.append({"k": "scratch", "buf": name if nbytes else None})
        elif kind == "tma":
            pointer(p, sizes)
            shape = p.get("shape")
            if not isinstance(shape, list) or not 1 <= len(shape) <= 5:
                raise Bad("forged_recording", "bad tensor descriptor")
            params.append({
                "k": "tma", "buf": p["buf"], "offset": p["offset"],
                "elem_type": _int(p.get("elem_type"), 0, 32, "tma type"),
                "elem_size": _int(p.get("elem_size"), 1, 16, "tma element size"),
                "swizzle": _int(p.get("swizzle"), 0, 8, "tma swizzle"),
                "block": [_int(b, 1, 256, "tma box") for b in p.get("block") or []],
                "shape": [_int(x, 1, 1 << 31, "tma shape") for x in shape],
                "strides": [_int(x, 0, 1 << 40, "tma stride") for x in p.get("strides") or []],
                "nan": bool(p.get("nan")),
            })  # fmt: skip
        else:
            raise Bad("forged_recording", "unknown parameter kind")
    if len(params) > 1024:
        raise Bad("forged_recording", "too many parameters")
    step = {"op": "launch", "kernel": s["kernel"], "grid": grid, "params": params}
    if kernels[s["kernel"]]["lang"] == "cuda":  # harnesslab_cuda: block and shared per launch
        step.update(_cuda_launch(s))
    return step


def _cuda_launch(s: dict[str, Any]) -> dict[str, Any]:
    """A CUDA C++ launch's own block and dynamic shared memory (a Triton launch takes both from
    its kernel)."""
    block = s.get("block")
    if not isinstance(block, list) or len(block) != 3:
        raise Bad("forged_recording", "bad block")
    block = [_int(b, 1, 1024, "block size") for b in block]
    if block[0] * block[1] * block[2] > 1024 or block[2] > 64:
        raise Bad("forged_recording", "more than 1024 threads in a block")
    return {"block": block, "shared": _int(s.get("shared"), 0, 1 << 20, "shared memory")}


__all__ = [
    "DTYPES",
    "KERNEL_NAME",
    "SCALAR_TYPES",
    "UNREPLAYABLE",
    "Bad",
    "clean_kernels",
    "clean_launch",
    "pointer",
    "validate",
]
