"""CUDA C++ reference solution for swiglu (cuda_swiglu.cu, launched through harnesslab_cuda):
the tensors as one flat array, 256 threads each moving 4 packs of 8 elements (16 bytes) per
tensor with all loads in flight before the math; 2-byte accesses when a pointer is not 16-byte
aligned.

Same contract as the workspace's kernel.py. benchmarks/cuda_gpu.py times it beside the Triton
solution on a GPU host (BENCHMARKS.md; NVRTC compiles it anywhere, running needs a GPU).
"""

from __future__ import annotations

import torch
from harnesslab_cuda import aligned, load

CTYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
THREADS, ITEMS = 256, 4
_KERNELS: dict[tuple, object] = {}


def kernel(dtype: torch.dtype, vec: int):
    key = (dtype, vec)
    if key not in _KERNELS:
        _KERNELS[key] = load("cuda_swiglu.cu", f"swiglu_flat<{CTYPES[dtype]}, {vec}, {ITEMS}>")
    return _KERNELS[key]


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    if n == 0:
        return out
    vec = 8 if aligned(a, b, out) else 1
    blocks = -(-(n // vec) // (ITEMS * THREADS)) or 1  # n < vec: one block does the tail
    kernel(a.dtype, vec)[blocks, THREADS](a, b, out, n)
    return out
