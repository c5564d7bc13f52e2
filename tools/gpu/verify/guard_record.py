"""Kernel launches on a GPU, recorded at the launcher for the guarded verify (guard_child.py's
"record" op): every launch's kernel binary, grid, scalar arguments and which input or
allocation each pointer names, every allocation and fill, and where the output lives. The
replay (replay.py) launches exactly that on the parent's inputs; guard_gpu.py validates it.

Two launchers, one recording: Triton's (its CudaLauncher) and harnesslab_cuda's (`_launch`,
CUDA C++ compiled by NVRTC; `record_launch` is its step, with the block and dynamic shared
memory a Triton step takes from its kernel). The CUDA driver binding the launcher uses
(cudadrv.Driver) is watched too: a driver call made while recording from anywhere but the
launcher's hook (a launch around the recorder) is `unrecorded_launch`, refused as
unreplayable; whatever such a launch wrote never reaches the replayed result anyway.

Runs in the candidate's process (hostile, like guard_child.py): nothing it records is evidence
until the trusted side has checked it. Standard library, torch and triton only.
"""

from __future__ import annotations

import base64
import struct
from typing import Any


class Recorder:
    """Kernel launches on a GPU, recorded at the launcher (what the driver would be asked)."""

    def __init__(self, obs: Any) -> None:  # guard_child.Observer
        import torch
        from triton.backends.nvidia.driver import CudaLauncher
        from triton.compiler.compiler import CompiledKernel

        self.torch, self.obs = torch, obs
        self.active = False
        self.by_function: dict[int, Any] = {}
        self.kernels: dict[str, dict[str, Any]] = {}
        self.steps: list[dict[str, Any]] = []
        self.allocs: list[dict[str, Any]] = []
        self.inputs: list[tuple[int, int]] = []  # (storage base, nbytes) per tensor argument
        self.unsupported: set[str] = set()
        self.cuda_depth = 0  # inside harnesslab_cuda's launch hook (its driver calls are its own)
        self.cuda: Any = None  # the harnesslab_cuda module, once wrapped
        rec = self
        init_handles = CompiledKernel._init_handles

        def _init_handles(ck):
            init_handles(ck)
            if getattr(ck, "function", None):
                rec.by_function[int(ck.function)] = ck

        CompiledKernel._init_handles = _init_handles
        call = CudaLauncher.__call__

        def launcher_call(launcher, gx, gy, gz, stream, function, *args):
            if rec.active:
                rec.on_launch(launcher, (gx, gy, gz), stream, function, args)
            return call(launcher, gx, gy, gz, stream, function, *args)

        CudaLauncher.__call__ = launcher_call
        self.wrap_cuda()

    def wrap_cuda(self) -> None:
        """harnesslab_cuda's one launch hook, recorded; its driver binding, watched. Imported
        here, before the candidate's code, so both are wrapped before anything can hold the
        originals (guard_child checks that they stay wrapped)."""
        try:
            import cudadrv
            import harnesslab_cuda
        except ImportError:  # not staged (an older stage): no CUDA candidate can import it
            return
        rec = self
        launch = harnesslab_cuda._launch

        def cuda_launch(ln):
            if rec.active:
                rec.on_cuda_launch(ln)
            rec.cuda_depth += 1
            try:
                return launch(ln)
            finally:
                rec.cuda_depth -= 1

        harnesslab_cuda._launch = cuda_launch
        fn = cudadrv.Driver.fn

        def driver_fn(drv, name):
            if rec.active and not rec.cuda_depth:
                rec.unsupported.add("unrecorded_launch")
            return fn(drv, name)

        cudadrv.Driver.fn = driver_fn
        self.cuda = harnesslab_cuda

    def begin(self, tensors: list[Any]) -> None:
        self.steps, self.allocs, self.unsupported = [], [], set()
        self.inputs = [
            (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors
        ]
        self.active = True

    # -- pointers --------------------------------------------------------------------------------
    def ref(self, value: Any) -> dict[str, Any]:
        """Which buffer a pointer argument names: an input, an allocation of this call, or
        something else (memory that existed before the call: not replayable)."""
        if value is None:
            return {"null": True}
        if isinstance(value, int):
            ptr = value
        else:
            try:
                ptr = int(value.data_ptr())
            except Exception:
                self.unsupported.add("pointer_object")
                return {"null": True}
        if ptr == 0:
            return {"null": True}
        for i, (base, n) in enumerate(self.inputs):
            if base <= ptr < base + max(n, 1):
                return {"buf": f"in{i}", "offset": ptr - base}
        for k, a in enumerate(self.allocs):
            if a["base"] <= ptr < a["base"] + max(a["nbytes"], 1):
                return {"buf": f"a{k}", "offset": ptr - a["base"]}
        self.unsupported.add("foreign_memory")
        return {"null": True}

    def on_alloc(self, tensor: Any, fill: Any, dtype: Any) -> None:
        st = tensor.untyped_storage()
        base, nbytes = st.data_ptr(), st.nbytes()
        if any(a["base"] == base for a in self.allocs) or not nbytes:
            return
        entry = {"base": base, "nbytes": nbytes}
        self.allocs.append(entry)
        if fill != "poison":
            self.on_fill(tensor, fill)

    def on_fill(self, tensor: Any, value: Any) -> None:
        """A fill of a contiguous tensor of 1, 2 or 4-byte elements, as a memset step."""
        ref = self.ref(tensor)
        if "buf" not in ref:
            return
        if not tensor.is_contiguous() or tensor.element_size() not in (1, 2, 4):
            self.unsupported.add("fill")
            return
        width = tensor.element_size()
        bits = _bits(self.torch, value, tensor.dtype)
        if bits is None:
            self.unsupported.add("fill")
            return
        self.steps.append({"op": "memset", "buf": ref["buf"], "offset": ref["offset"],
                           "width": width, "value": bits, "count": tensor.numel()})  # fmt: skip

    # -- launches --------------------------------------------------------------------------------
    def on_launch(self, launcher: Any, grid, stream, function, args: tuple) -> None:
        ck = self.by_function.get(int(function))
        if ck is None:
            self.unsupported.add("unknown_kernel")
            return
        src = getattr(ck, "src", None)
        fn = getattr(src, "fn", None)
        self.obs.launch(getattr(fn, "fn", fn))
        meta = ck.metadata
        cubin = ck.asm.get("cubin") if hasattr(ck, "asm") else None
        if not isinstance(cubin, bytes | bytearray):
            self.unsupported.add("no_binary")
            return
        kid = f"k{len(self.kernels)}_{meta.name}"[:120]
        for existing, k in self.kernels.items():
            if k["_cubin"] is cubin:
                kid = existing
                break
        else:
            self.kernels[kid] = {
                "id": kid,
                "name": meta.name,
                "cubin": base64.b64encode(bytes(cubin)).decode(),
                "_cubin": cubin,
                "shared": int(meta.shared),
                "num_warps": int(meta.num_warps),
                "num_ctas": int(getattr(meta, "num_ctas", 1)),
                "coop": bool(getattr(launcher, "launch_cooperative_grid", False)),
                "pdl": bool(getattr(launcher, "launch_pdl", False)),
            }
        values = list(args[4:])  # after packed metadata, launch metadata and the two hooks
        types = list(getattr(src, "signature", {}).values())
        params = self.params(types, values, getattr(meta, "tensordesc_meta", None))
        for which, size, align in (
            ("global", getattr(launcher, "global_scratch_size", 0), getattr(launcher, "global_scratch_align", 1)),
            ("profile", getattr(launcher, "profile_scratch_size", 0), getattr(launcher, "profile_scratch_align", 1)),
        ):  # fmt: skip
            n = int(size or 0) * grid[0] * grid[1] * grid[2] * int(getattr(launcher, "num_ctas", 1))
            params.append({"k": "scratch", "which": which, "nbytes": n, "align": int(align or 1)})
        self.steps.append({"op": "launch", "kernel": kid, "grid": list(grid), "params": params})

    def on_cuda_launch(self, ln: Any) -> None:  # harnesslab_cuda.Launch
        self.obs.launch_at(ln.kernel.path, ln.stream)
        self.steps.append(self.cuda.record_launch(ln, self.kernels, self.ref))

    def params(self, types: list[Any], values: list[Any], tdmeta: Any) -> list[dict[str, Any]]:
        flat_t: list[Any] = []
        flat_v: list[Any] = []
        _flatten(types, values, flat_t, flat_v)
        out: list[dict[str, Any]] = []
        td_index = 0
        for ty, v in zip(flat_t, flat_v, strict=False):
            ty = str(ty)
            if ty == "constexpr":
                continue
            if ty.startswith("*"):
                out.append({"k": "ptr", **self.ref(v)})
            elif ty.startswith("tensordesc"):
                meta = tdmeta[td_index] if tdmeta else None
                td_index += 1
                out += self.tensordesc(v, meta)
            else:
                value = v.item() if hasattr(v, "item") and not isinstance(v, int | float) else v
                if not isinstance(value, int | float | bool):
                    self.unsupported.add("scalar")
                    value = 0
                out.append({"k": "scalar", "type": ty, "value": value})
        return out

    def tensordesc(self, desc: Any, meta: Any) -> list[dict[str, Any]]:
        """A host TensorDescriptor as Triton's launcher expands it (driver.make_tensordesc_arg)."""
        shape, strides = [int(s) for s in desc.shape], [int(s) for s in desc.strides]
        scalars = [{"k": "scalar", "type": "i32", "value": s} for s in shape]
        scalars += [{"k": "scalar", "type": "i64", "value": s} for s in strides]
        if meta is None:
            out = [{"k": "ptr", **self.ref(desc.base)}]
            out += [{"k": "scalar", "type": "i64", "value": s} for s in shape + strides]
            out.append({"k": "scalar", "type": "i1", "value": desc.padding == "nan"})
            return out + scalars
        if meta.get("fp4_padded"):
            shape = [*shape[:-1], shape[-1] * 2]
            scalars[len(shape) - 1]["value"] = shape[-1]
        to_host = {8: 10, 9: 8, 10: 9}  # Triton's TMA_DTYPE_DEVICE_TO_HOST
        elem_type = int(meta["elem_type"])
        tma = {
            "k": "tma",
            **self.ref(desc.base),
            "elem_type": to_host.get(elem_type, elem_type),
            "elem_size": int(meta["elem_size"]),
            "swizzle": int(meta["swizzle"]),
            "block": [int(b) for b in meta["block_size"]],
            "shape": shape,
            "strides": strides,
            "nan": desc.padding == "nan",
        }
        return [tma, *scalars]

    def finish(self, out: Any) -> dict[str, Any]:
        self.active = False
        kernels = [
            {k: v for k, v in kern.items() if k != "_cubin"} for kern in self.kernels.values()
        ]
        used = {s["kernel"] for s in self.steps if s["op"] == "launch"}
        output: dict[str, Any] | None = None
        if type(out) is self.torch.Tensor and not out.numel():
            output = {"empty": True, "shape": list(out.shape), "strides": list(out.stride()),
                      "dtype": str(out.dtype).removeprefix("torch.")}  # fmt: skip
        elif type(out) is self.torch.Tensor:
            ref = self.ref(out)
            if "buf" in ref:
                output = {
                    **ref,
                    "shape": list(out.shape),
                    "strides": list(out.stride()),
                    "dtype": str(out.dtype).removeprefix("torch."),
                    "offset": ref["offset"],
                }
        return {
            "kernels": [k for k in kernels if k["id"] in used],
            "allocs": [{"nbytes": a["nbytes"]} for a in self.allocs],
            "steps": self.steps,
            "output": output,
            "unsupported": sorted(self.unsupported),
        }


def _flatten(types: Any, values: Any, ft: list[Any], fv: list[Any]) -> None:
    for t, v in zip(types, values, strict=False):
        if isinstance(t, tuple):
            _flatten(list(t), list(v) if isinstance(v, list | tuple) else [v] * len(t), ft, fv)
        else:
            ft.append(t)
            fv.append(v)


def _bits(torch: Any, value: Any, dtype: Any) -> int | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    if dtype == torch.float16:
        return struct.unpack("<H", struct.pack("<e", v))[0]
    if dtype == torch.bfloat16:
        return struct.unpack("<I", struct.pack("<f", v))[0] >> 16
    if dtype == torch.float32:
        return struct.unpack("<I", struct.pack("<f", v))[0]
    if dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        size = torch.tensor([], dtype=dtype).element_size()
        return int(v) & ((1 << (8 * size)) - 1)
    return None


__all__ = ["Recorder"]
