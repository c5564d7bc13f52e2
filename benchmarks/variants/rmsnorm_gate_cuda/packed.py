"""The CUDA rmsnorm_gate solution's wrapper (before __fdividef) over packed.cu (paired conversions):
`rmsnorm_gate` as shipped otherwise, `rmsnorm_gate_fastdiv` with silu's division as __fdividef,
`rmsnorm_gate_fastdiv_only` with that division and the shipped scalar conversions.
Timed beside the shipped solution by `benchmarks/cuda_gpu.py --extra` (issue 31)."""

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
    if vec == 8 and npack <= 128:
        chunks = 1
        while chunks * 32 < npack:
            chunks *= 2
        return "warp", chunks, (32, WARP_ROWS, 1)
    max_threads = 512 if vec == 8 else 1024
    chunks = 1
    while chunks < 8 and npack > chunks * max_threads:
        chunks *= 2
    if npack > chunks * max_threads:
        return "block", 0, (1024, 1, 1)
    threads = -(-npack // chunks)
    return "block", chunks, (-(-threads // 32) * 32, 1, 1)


def kernel(dtype: torch.dtype, vec: int, variant: str, chunks: int, fastdiv: bool, packed: bool):
    key = (dtype, vec, variant, chunks, fastdiv, packed)
    if key not in _KERNELS:
        _KERNELS[key] = load(
            "packed.cu",
            f"rmsnorm_gate_{variant}<{CTYPES[dtype]}, {vec}, {chunks}>",
            defines={"HL_FASTDIV": int(fastdiv), "HL_PACKED": int(packed)},
        )
    return _KERNELS[key]


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    return _run(x, gate, weight, eps, fastdiv=False)


def rmsnorm_gate_fastdiv_only(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    return _run(x, gate, weight, eps, fastdiv=True, packed=False)


def rmsnorm_gate_fastdiv(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    return _run(x, gate, weight, eps, fastdiv=True)


def _run(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    fastdiv: bool,
    packed: bool = True,
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
    kernel(x.dtype, vec, variant, chunks, fastdiv, packed)[grid, block](
        x, gate, weight, out, rows, dim, eps
    )
    return out
