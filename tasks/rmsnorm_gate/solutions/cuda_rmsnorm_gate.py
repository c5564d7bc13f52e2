"""CUDA C++ reference solution for rmsnorm_gate (cuda_rmsnorm_gate.cu, launched through
harnesslab_cuda): the row in registers, 16-byte loads where dim and the pointers allow, one warp
per row for rows under 1024 fp16/bf16 elements, one block per row from 1024 on.

Same contract as the workspace's kernel.py. benchmarks/cuda_gpu.py times it beside the Triton
solution on a GPU host (BENCHMARKS.md; NVRTC compiles it anywhere, running needs a GPU).
"""

from __future__ import annotations

import torch
from harnesslab_cuda import aligned, load

CTYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
WARP_ROWS = 4  # rows per block of the warp-per-row variant (4 warps)
_KERNELS: dict[tuple, object] = {}


def plan(dim: int, vec: int) -> tuple[str, int, tuple[int, int, int]]:
    """(variant, packs per thread, block) for a row of `dim` elements moved `vec` at a time;
    packs per thread 0 means the row does not fit registers (read twice)."""
    npack = dim // vec
    # A warp per row below 128 packs (1024 elements): at 1024x1024 fp16 a 128-thread block per
    # row took 3.73 us against 4.91 us for four warp-rows a block (H100, BENCHMARKS.md, seventh
    # session); narrower rows were not measured.
    if vec == 8 and npack < 128:
        chunks = 1
        while chunks * 32 < npack:
            chunks *= 2
        return "warp", chunks, (32, WARP_ROWS, 1)
    # Up to 1024 threads a block, one pack each up to 8192 elements: with 512 threads and two
    # packs each, 4096x8192 bf16 ran at 48% warps active (92% in fp16) and took 72.7 us against
    # 65.5 us with 1024 on an H100 (BENCHMARKS.md, seventh session).
    max_threads = 1024
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
            "cuda_rmsnorm_gate.cu", f"rmsnorm_gate_{variant}<{CTYPES[dtype]}, {vec}, {chunks}>"
        )
    return _KERNELS[key]


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    assert x.shape == gate.shape and x.is_contiguous() and gate.is_contiguous()
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows == 0:
        return out
    vec = 8 if dim % 8 == 0 and aligned(x, gate, weight, out) else 1
    variant, chunks, block = plan(dim, vec)
    grid = -(-rows // block[1])
    kernel(x.dtype, vec, variant, chunks)[grid, block](x, gate, weight, out, rows, dim, eps)
    return out
