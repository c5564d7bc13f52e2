"""CUDA C++ reference solution for softmax (cuda_softmax.cu, launched through harnesslab_cuda):
the row in registers up to 65536 elements (16-byte packs, 1024 threads), an online two-pass
path above, one warp per row for rows of at most 1024 fp16/bf16 elements.

Same contract as the workspace's kernel.py. benchmarks/cuda_gpu.py times it beside the Triton
solution on a GPU host (BENCHMARKS.md; NVRTC compiles it anywhere, running needs a GPU).
"""

from __future__ import annotations

import torch
from harnesslab_cuda import aligned, load

CTYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
WARP_ROWS = 4
_KERNELS: dict[tuple, object] = {}


def plan(dim: int, vec: int) -> tuple[str, int, tuple[int, int, int]]:
    """(variant, packs per thread, block); packs per thread 0: the online two-pass path."""
    npack = dim // vec
    if vec == 8 and npack <= 128:
        chunks = 1
        while chunks * 32 < npack:
            chunks *= 2
        return "warp", chunks, (32, WARP_ROWS, 1)
    max_threads = 512 if npack <= 4096 else 1024
    chunks = 1
    while chunks < 8 and npack > chunks * max_threads:
        chunks *= 2
    if npack > chunks * max_threads:
        return "block", 0, (1024, 1, 1)
    threads = -(-npack // chunks)
    return "block", chunks, (-(-threads // 32) * 32, 1, 1)


def kernel(dtype: torch.dtype, vec: int, variant: str, chunks: int):
    key = (dtype, vec, variant, chunks)
    if key not in _KERNELS:
        _KERNELS[key] = load(
            "cuda_softmax.cu", f"softmax_{variant}<{CTYPES[dtype]}, {vec}, {chunks}>"
        )
    return _KERNELS[key]


def softmax(x: torch.Tensor) -> torch.Tensor:
    assert x.is_contiguous()
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows == 0:
        return out
    vec = 8 if dim % 8 == 0 and aligned(x, out) else 1
    variant, chunks, block = plan(dim, vec)
    kernel(x.dtype, vec, variant, chunks)[-(-rows // block[1]), block](x, out, rows, dim)
    return out
