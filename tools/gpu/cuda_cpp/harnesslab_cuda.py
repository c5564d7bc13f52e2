"""harnesslab_cuda: compile and launch CUDA C++ kernels from a candidate's kernel.py.

    from harnesslab_cuda import load
    k = load("kernel.cu", "rms_gate", defines={"VEC": 8})  # NVRTC, for this GPU's architecture
    k[grid, block, shared_bytes](x, gate, weight, out, dim, eps)

Staged beside runner.py, importable by agent code in the sandboxed candidate process (the
runner, guard_child.py); standard library, torch and the staged nvrtc.py, cuda_source.py and
cudadrv.py. Candidate side of the trust boundary: nothing here is evidence.

It is the one place a CUDA launch happens. Every launch is checked here (grid and block limits,
argument count, each argument against the kernel's declared parameter type) and built as a
`Launch`, then handed to the module-level `_launch`: the guarded verify's recorder replaces that
name with a wrapper that records the launch (`record_launch` is the format: cubin, function
name, grid, block, dynamic shared memory, each pointer as the buffer it names, each scalar as
its exact bits) and then calls the original. A launch made any other way is not recorded, so the
replay does not run it and the output it wrote never reaches the checked result.

Parameter types come from the kernel's declaration in the source (`extern "C" __global__ void
f(const __half* x, int n)`, or a template named with its arguments, `f<__half, 8>`): the source
is the one truth, and on a GPU the driver's own parameter sizes (cuFuncGetParamInfo) are checked
against it at load. `signature=` overrides the parsed types where the declaration hides them.

Without a GPU (or with CPU tensors, the Triton interpreter's path), load() compiles (for sm_90
unless told) and a launch checks everything above, then raises GpuRequired: running needs a GPU.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # the sibling import rule (tools/gpu/runner.py's docstring)
    from . import cuda_source, nvrtc
else:  # staged flat: the candidate imports this module, and it its siblings, by plain name
    import cuda_source
    import nvrtc

DEFAULT_ARCH = "sm_90"  # the lent GPU hosts' H100/H200, when no GPU is here to ask
MAX_SOURCE_BYTES = 1 << 20
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = ((1 << 31) - 1, 65535, 65535)
# Dynamic shared memory a block may opt in to, by architecture (the device's own attribute is
# used on a GPU); bytes.
SMEM_OPTIN = {"sm_75": 65536, "sm_80": 166912, "sm_86": 101376, "sm_87": 166912,
              "sm_89": 101376, "sm_90": 232448, "sm_100": 232448, "sm_120": 101376}  # fmt: skip
_INT_CTYPES = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "u8": ctypes.c_uint8,
               "i16": ctypes.c_int16, "u16": ctypes.c_uint16, "i32": ctypes.c_int32,
               "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64}  # fmt: skip
_SETTINGS: dict[str, Any] = {"cache_dir": None, "arch": None}
_COMPILED: dict[str, nvrtc.Compiled] = {}
_DRIVERS: dict[int, Any] = {}


class LaunchError(ValueError):
    """A launch or a load that is not well-formed; the message says which argument and why."""


class KernelPolicyError(ValueError):
    """The compiled kernel does what the guarded verify refuses (timers, device globals, ...);
    `code` is the reason code (tools/integrity/reasons.py)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class GpuRequired(RuntimeError):
    """Running a CUDA kernel needs a GPU; this call's tensors are on the CPU."""


def configure(*, cache_dir: str | None = None, arch: str | None = None) -> None:
    """Where compiled kernels are cached, and the architecture to compile for (default: this
    GPU's, else sm_90). The runner calls this; a candidate has no reason to."""
    if cache_dir is not None:
        _SETTINGS["cache_dir"] = cache_dir
    if arch is not None:
        _SETTINGS["arch"] = arch


def cache_dir() -> str:
    env = os.environ.get("HARNESSLAB_CUDA_CACHE") or ""
    triton = os.environ.get("TRITON_CACHE_DIR") or ""
    return (
        _SETTINGS["cache_dir"]
        or env
        or (os.path.join(triton, "nvrtc") if triton else "")
        or os.path.join(os.path.expanduser("~"), ".cache", "harnesslab", "nvrtc")
    )


def _torch() -> Any:
    import torch

    return torch


def _has_gpu() -> bool:
    return bool(_torch().cuda.is_available())


def target_arch() -> str:
    if _SETTINGS["arch"]:
        return str(_SETTINGS["arch"])
    if _has_gpu():
        major, minor = _torch().cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return DEFAULT_ARCH


def _compiler() -> nvrtc.Nvrtc:
    cuda = getattr(_torch().version, "cuda", None) or ""
    return nvrtc.get(prefer_major=int(cuda.split(".")[0]) if cuda[:1].isdigit() else None)


# ----------------------------------------------------------------------------------------------
# load


def load(
    source: str | os.PathLike[str],
    kernel: str | Sequence[str],
    *,
    defines: Mapping[str, Any] | None = None,
    options: Sequence[str] = (),
    signature: str | None = None,
    arch: str | None = None,
) -> Any:
    """Compile `source` (a .cu file beside the calling file) with NVRTC and return the kernel
    `kernel` names (a tuple of kernels for a list of names: one compile for all of them).

    `defines` become `-DNAME=value` (ints, floats, bools, one-line strings: kernel_config.json's
    launch knobs fit); `options` are NVRTC options from nvrtc.ALLOWED_*; `signature` overrides
    the parameter types read from the declaration (`"ptr, ptr, i32, fp32"` or C types)."""
    caller = sys._getframe(1).f_globals.get("__file__")
    folder = os.path.dirname(os.path.realpath(caller)) if caller else os.getcwd()
    path = _source_path(source, folder)
    text = _read(path)
    headers = _local_headers(text, os.path.dirname(path), os.path.basename(path))
    exprs = [kernel] if isinstance(kernel, str) else list(kernel)
    if not exprs or not all(isinstance(e, str) and e.strip() for e in exprs):
        raise LaunchError("load(): name the kernel, e.g. load('kernel.cu', 'rms_gate')")
    name = os.path.basename(path)
    compiled = _compile(text, name, arch or target_arch(), defines, options, exprs, headers)
    findings = nvrtc.ptx_findings(compiled.ptx, debug=True)
    if findings:
        raise KernelPolicyError(
            f"{name}: {findings[0][1]}: not allowed in a kernel (the guarded verify refuses it; "
            "README 'CUDA kernels' says what a kernel may use)",
            findings[0][0],
        )
    out = []
    for expr in exprs:
        try:
            params = (
                cuda_source.parse_signature_text(signature)
                if signature
                else cuda_source.signature(text, expr, defines, file=name)
            )
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        out.append(Kernel(compiled, expr, name, params, dict(defines or {}), path))
    return out[0] if isinstance(kernel, str) else tuple(out)


def aligned(*tensors: Any, to: int = 16) -> bool:
    """Whether every tensor's first element sits at a multiple of `to` bytes: the check before
    a kernel's vector path (a view into the middle of a buffer may not be)."""
    return all(int(t.data_ptr()) % to == 0 for t in tensors)


def _source_path(source: str | os.PathLike[str], folder: str) -> str:
    path = os.fspath(source)
    full = path if os.path.isabs(path) else os.path.join(folder, path)
    real = os.path.realpath(full)
    if not real.startswith(os.path.realpath(folder) + os.sep):
        raise LaunchError(f"{path}: the CUDA source must be a file beside the calling kernel.py")
    if not real.endswith((".cu", ".cuh")) or os.path.islink(full) or not os.path.isfile(real):
        raise LaunchError(f"{path}: not a regular .cu/.cuh file beside kernel.py")
    return real


def _read(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise LaunchError(f"{os.path.basename(path)} is larger than {MAX_SOURCE_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _local_headers(text: str, folder: str, file: str) -> dict[str, str]:
    """Every `#include "x.cuh"` (recursively): files beside the source, handed to NVRTC from
    memory so that it never opens a file the launcher did not check."""
    out: dict[str, str] = {}
    todo = [(file, text)]
    while todo:
        name, body = todo.pop()
        for line, target, kind in cuda_source.includes(body):
            if kind != "quote" or target in out:
                continue
            if os.sep in target or "/" in target or not target.endswith(".cuh"):
                raise LaunchError(
                    f'{name}:{line}: #include "{target}": a local include is a .cuh file beside '
                    "the source, named without a folder"
                )
            out[target] = _read(_source_path(target, folder))
            todo.append((target, out[target]))
            if len(out) > 32:
                raise LaunchError(f"{file}: more than 32 local headers")
    return out


def _compile(
    text: str,
    name: str,
    arch: str,
    defines: Mapping[str, Any] | None,
    options: Sequence[str],
    exprs: list[str],
    headers: dict[str, str],
) -> nvrtc.Compiled:
    key = hashlib.sha256(
        json.dumps([text, name, arch, sorted((defines or {}).items(), key=lambda kv: kv[0]),
                    list(options), exprs, sorted(headers.items())], default=repr).encode()
    ).hexdigest()  # fmt: skip
    hit = _COMPILED.get(key)
    if hit is None:
        try:
            hit = _compiler().compile(
                text, name=name, arch=arch, defines=defines, options=options,
                name_expressions=exprs, headers=headers, cache_dir=cache_dir(),
            )  # fmt: skip
        except nvrtc.OptionError as exc:
            raise LaunchError(str(exc)) from None
        _COMPILED[key] = hit
    return hit


# ----------------------------------------------------------------------------------------------
# kernels and launches


@dataclass(frozen=True)
class Arg:
    kind: str  # "ptr" or "scalar"
    type: str  # "ptr", or the integer type whose bits the kernel receives (floats as bits)
    value: int  # the device address, or the integer / the float's exact bits
    obj: Any  # what the caller passed (a tensor, None, a number)
    c_type: str


@dataclass(frozen=True)
class Launch:
    """One checked launch: what `_launch` runs and what the recorder records."""

    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    stream: int
    args: tuple[Arg, ...]
    device: str  # "cuda", or "cpu" (checked only: running needs a GPU)

    def describe(self) -> str:
        c = self.kernel.compiled
        return (
            f"compiled for {c.arch} by NVRTC {c.nvrtc_version[0]}.{c.nvrtc_version[1]}; grid "
            f"{self.grid}, block {self.block}, {self.shared} B shared memory, "
            f"{len(self.args)} arguments"
        )


@dataclass
class Kernel:
    compiled: nvrtc.Compiled
    expression: str
    source_name: str
    params: list[cuda_source.Param]
    defines: dict[str, Any]
    path: str = ""  # the source file (the recorder's own-or-foreign check)
    _functions: dict[int, tuple[int, int, int]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        """The function's name in the cubin (the lowered name of `expression`)."""
        return self.compiled.lowered[self.expression]

    def __getitem__(self, config: Any) -> _Configured:
        cfg = tuple(config) if isinstance(config, tuple) else (config,)
        if len(cfg) not in (2, 3):
            raise LaunchError(f"{self.expression}[grid, block] or [grid, block, shared_bytes]")
        return _Configured(self, cfg[0], cfg[1], cfg[2] if len(cfg) == 3 else 0)

    def launch(self, grid: Any, block: Any, *args: Any, shared: int = 0) -> None:
        _Configured(self, grid, block, shared)(*args)

    def _function(self, ordinal: int) -> tuple[int, int, int]:
        """(module, function, opted-in dynamic shared memory) in this device's context."""
        got = self._functions.get(ordinal)
        if got is None:
            drv = _driver(ordinal)
            mod, fn = drv.load_function(self.compiled.image, self.name, 0)
            sizes = drv.param_sizes(fn)
            expected = [p.nbytes for p in self.params]
            if sizes is not None and sizes != expected:
                raise LaunchError(
                    f"{self.source_name}:{self.expression}: the compiled kernel's parameter "
                    f"sizes are {sizes}, the declaration read gives {expected}: give "
                    "load(..., signature=...)"
                )
            got = self._functions[ordinal] = (mod, fn, 48 << 10)
        return got


@dataclass(frozen=True)
class _Configured:
    kernel: Kernel
    grid: Any
    block: Any
    shared: Any

    def __call__(self, *args: Any) -> None:
        k = self.kernel
        grid = _dims(self.grid, "grid", MAX_GRID, 0)
        block = _dims(self.block, "block", MAX_BLOCK, 1)
        if math.prod(block) > 1024:
            raise LaunchError(f"block {block}: {math.prod(block)} threads, at most 1024")
        if type(self.shared) is not int or not 0 <= self.shared <= SMEM_OPTIN.get(
            k.compiled.arch.rstrip("a"), 232448
        ):
            raise LaunchError(f"dynamic shared memory {self.shared!r}: bytes, 0..the device's "
                              "opt-in limit (227 KiB on an H100)")  # fmt: skip
        if len(args) != len(k.params):
            raise LaunchError(
                f"{k.source_name}:{k.expression} takes {len(k.params)} arguments "
                f"({', '.join(p.c_type for p in k.params)}), got {len(args)}"
            )
        converted = tuple(_convert(p, a, k) for p, a in zip(k.params, args, strict=True))
        devices = {"cuda" if a.obj.is_cuda else "cpu" for a in converted if _is_tensor(a.obj)}
        if len(devices) > 1:
            raise LaunchError(f"{k.expression}: some tensors are on the GPU, some on the CPU")
        device = devices.pop() if devices else ("cuda" if _has_gpu() else "cpu")
        if device == "cuda":
            here = int(_torch().cuda.current_device())
            if any(_is_tensor(a.obj) and a.obj.device.index != here for a in converted):
                raise LaunchError(f"{k.expression}: a tensor is not on cuda:{here}, the current "
                                  "device (launches run there)")  # fmt: skip
        if 0 in grid:
            return  # nothing to run (rows = 0): no launch, nothing recorded
        stream = _torch().cuda.current_stream().cuda_stream if device == "cuda" else 0
        _launch(Launch(k, grid, block, self.shared, int(stream), converted, device))


def _dims(value: Any, what: str, limit: tuple[int, ...], low: int) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, tuple | list) else (value,)
    if not 1 <= len(dims) <= 3 or any(type(d) is not int for d in dims):
        raise LaunchError(f"{what} {value!r}: an int or a tuple of up to 3 ints")
    full = (*dims, *([1] * (3 - len(dims))))
    for d, hi, axis in zip(full, limit, "xyz", strict=True):
        if not low <= d <= hi:
            raise LaunchError(f"{what}.{axis} = {d}: must be in {low}..{hi}")
    return full[0], full[1], full[2]


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _convert(p: cuda_source.Param, value: Any, k: Kernel) -> Arg:
    where = f"{k.expression} {p.label()}"
    if p.type == "ptr":
        if value is None:
            return Arg("ptr", "ptr", 0, None, p.c_type)
        if not _is_tensor(value):
            raise LaunchError(f"{where}: pass a torch tensor (or None for a null pointer), got "
                              f"{type(value).__name__}")  # fmt: skip
        want = cuda_source.POINTEE_DTYPES.get(p.pointee)
        if want and str(value.dtype) != f"torch.{want}":
            raise LaunchError(f"{where}: a {str(value.dtype)[6:]} tensor for a {p.c_type}")
        return Arg("ptr", "ptr", int(value.data_ptr()), value, p.c_type)
    if _is_tensor(value):
        raise LaunchError(f"{where}: pass a Python number, not a tensor (.item() would sync)")
    if p.type in ("fp32", "fp64", "fp16", "bf16"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LaunchError(f"{where}: pass a float, got {type(value).__name__}")
        try:
            bits_type, bits = _float_bits(p.type, float(value))
        except (OverflowError, struct.error):
            raise LaunchError(f"{where}: {value!r} does not fit {p.c_type}") from None
        return Arg("scalar", bits_type, bits, value, p.c_type)
    if not isinstance(value, int):
        raise LaunchError(f"{where}: pass an int, got {type(value).__name__}")
    size = cuda_source.SCALAR_BYTES[p.type] * 8
    lo, hi = (0, 1) if p.type == "i1" else (
        (-(1 << (size - 1)), (1 << (size - 1)) - 1) if p.type.startswith("i") else (0, (1 << size) - 1)
    )  # fmt: skip
    if not lo <= int(value) <= hi:
        raise LaunchError(f"{where}: {value} does not fit {p.c_type} ({lo}..{hi})")
    return Arg("scalar", p.type, int(value), value, p.c_type)


def _float_bits(ty: str, f: float) -> tuple[str, int]:
    """(integer type, bits): a float parameter's exact bytes, so the replay passes the same."""
    if ty == "fp64":
        return "u64", struct.unpack("<Q", struct.pack("<d", f))[0]
    if ty == "fp32":
        return "u32", struct.unpack("<I", struct.pack("<f", f))[0]
    if ty == "fp16":
        return "u16", struct.unpack("<H", struct.pack("<e", f))[0]
    u = struct.unpack("<I", struct.pack("<f", f))[0]  # bf16: round to nearest even
    if f != f:
        return "u16", 0x7FC0
    return "u16", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


# ----------------------------------------------------------------------------------------------
# the one launch


def _driver(ordinal: int) -> Any:
    drv = _DRIVERS.get(ordinal)
    if drv is None:
        from cudadrv import Driver

        drv = Driver()
        drv.init_primary(ordinal)  # the primary context: the one torch uses
        _DRIVERS[ordinal] = drv
    return drv


def _launch(launch: Launch) -> None:
    """Run one checked launch on the current torch stream. The recorder wraps this name; call
    kernels (`k[grid, block](...)`), never this."""
    if launch.device != "cuda":
        raise GpuRequired(
            f"running {launch.kernel.source_name}:{launch.kernel.expression} needs a CUDA GPU "
            f"(this call's tensors are on the CPU). Checked: {launch.describe()}. Results and "
            "timings come from a GPU host (an SSH or Slurm executor)"
        )
    ordinal = int(_torch().cuda.current_device())
    drv = _driver(ordinal)
    mod, fn, optin = launch.kernel._function(ordinal)
    if launch.shared > optin:  # the replay (replay.py) opts in the same way
        drv.allow_shared(fn, launch.shared)
        launch.kernel._functions[ordinal] = (mod, fn, launch.shared)
    values = [ctypes.c_uint64(a.value) if a.kind == "ptr" else _INT_CTYPES[a.type](a.value)
              for a in launch.args]  # fmt: skip
    params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    drv.launch(fn, launch.grid, launch.block, launch.shared, launch.stream, params)


def record_launch(launch: Launch, kernels: dict[str, dict[str, Any]], ref: Any) -> dict[str, Any]:
    """The recorder's step for `launch` (guard_record.Recorder's format, CUDA's fields added):

        kernel entry (in `kernels`, once per cubin and function): {"id", "name" (in the
          cubin), "cubin" (base64), "shared" (the largest dynamic shared memory of its
          launches: the opt-in the replay sets), "block", "num_warps", "num_ctas": 1,
          "coop": false, "pdl": false, "lang": "cuda", "nvrtc": {"source", "expression",
          "arch", "options"} (what the trusted side recompiles to check the cubin)}
        step: {"op": "launch", "kernel", "grid": [x, y, z], "block": [x, y, z], "shared",
          "params": [{"k": "ptr", **ref(tensor or None)} | {"k": "scalar", "type", "value"}]}

    A float scalar is recorded as its exact bits with the integer type of its width (fp32 ->
    u32), so the replay passes the same bytes. `ref` is the recorder's pointer resolver."""
    k = launch.kernel
    image = k.compiled.image
    kid = next((i for i, e in kernels.items() if e.get("_cubin") is image and e["name"] == k.name),
               None)  # fmt: skip
    if kid is None:
        kid = f"cu{len(kernels)}_{k.name}"[:120]
        threads = math.prod(launch.block)
        kernels[kid] = {
            "id": kid, "name": k.name, "cubin": base64.b64encode(image).decode(), "_cubin": image,
            "shared": 0, "block": list(launch.block), "num_warps": max(1, min(32, -(-threads // 32))),
            "num_ctas": 1, "coop": False, "pdl": False, "lang": "cuda",
            "nvrtc": {"source": k.source_name, "expression": k.expression, "arch": k.compiled.arch,
                      "options": [o for o in k.compiled.options
                                  if not o.startswith(("--gpu-architecture=", "--include-path="))]},
        }  # fmt: skip
    kernels[kid]["shared"] = max(kernels[kid]["shared"], launch.shared)
    params = [{"k": "ptr", **ref(a.obj)} if a.kind == "ptr"
              else {"k": "scalar", "type": a.type, "value": a.value} for a in launch.args]  # fmt: skip
    return {"op": "launch", "kernel": kid, "grid": list(launch.grid), "block": list(launch.block),
            "shared": launch.shared, "params": params}  # fmt: skip


__all__ = [
    "GpuRequired",
    "Kernel",
    "KernelPolicyError",
    "Launch",
    "LaunchError",
    "aligned",
    "configure",
    "load",
    "record_launch",
]
