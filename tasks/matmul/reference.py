"""Trusted reference and input generator for matmul (C = A @ B, bf16/fp16 GEMM). Stays inside
the toolkit.

The GPU-side runner imports this file by path, so it needs only the standard library and torch.
make_inputs draws where the caller's generator lives (the runner passes one on the device); the
probes draw on the CPU and move the result, so a seed gives the same inputs on every device.

Scaling: A ~ N(0, 1) and B ~ N(0, 1) / sqrt(k), so every entry of C is ~ N(0, 1) whatever k is.
One tolerance per dtype then covers every shape: the output's own rounding (bf16: 2^-9
relative) dominates, and fp32 accumulation in any order adds ~sqrt(k) * 2^-24 on top.
Accumulating in bf16/fp16 does not pass (see the accumulation_cancellation probe).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

Inputs = tuple[tuple, dict]


def _pack(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, device: str) -> Inputs:
    return tuple(t.to(device=device, dtype=dtype).contiguous() for t in (a, b)), {}


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp32 for the reference's math; fp64 stays fp64 (the generic suite, tools/gpu/numerics.py,
    checks that a draw's fp32 result is accurate against it)."""
    return t if t.dtype == torch.float64 else t.float()


def make_inputs(
    shape: dict[str, int], dtype: torch.dtype, device: str, generator: torch.Generator
) -> Inputs:
    """Fresh inputs (a, b), {}: a is (m, k), b is (k, n), both row-major."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    dev = generator.device
    a = torch.randn(m, k, generator=generator, dtype=torch.float32, device=dev)
    b = torch.randn(k, n, generator=generator, dtype=torch.float32, device=dev) / math.sqrt(k)
    return _pack(a, b, dtype, device)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp32 from the same bf16/fp16 inputs (products of 16-bit values are exact in
    fp32; TF32 is off so the fp32 GEMM is a true fp32 GEMM); returns fp32."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _wide(a) @ _wide(b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def torch_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What a PyTorch user writes: torch.matmul, i.e. cuBLAS on a GPU."""
    return torch.matmul(a, b)


def output_spec(a: torch.Tensor, b: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return (a.shape[0], b.shape[1]), a.dtype


def bytes_moved(shape: dict[str, int], dtype_bytes: int) -> int:
    """Minimal traffic: read A and B once, write C once (a GEMM this size is compute-bound)."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    return (m * k + k * n + m * n) * dtype_bytes


def flops(shape: dict[str, int]) -> int:
    """2 * m * n * k: one multiply and one add per term."""
    return 2 * shape["m"] * shape["n"] * shape["k"]


def _small(v: int) -> int:
    # Keeps sizes that are not multiples of a tile not multiples of a tile: 4096 -> 80,
    # 8192 -> 96, 3000 -> 88, 14336 -> 96, 1000 -> 104; sizes up to 112 are kept.
    return v if v <= 112 else 64 + v % 48


def interpreter_shape(shape: dict[str, int]) -> dict[str, int]:
    """Scaled-down shape for the Triton CPU interpreter: every size 1..112."""
    return {key: _small(v) for key, v in shape.items()}


# Numerical edge cases: (args, kwargs) for one call, small enough for the interpreter.


def _accumulation_cancellation(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # Each dot product sums +1 terms, then as many -1 terms, plus small noise: partial sums reach
    # k/2 = 2048 before cancelling to ~0.1. In fp32 that is exact to ~1e-4; a bf16 accumulator
    # (8 bits) rounds the partial sums to multiples of 8-16 and the result is garbage.
    m, n, k = 16, 16, 4096
    a = torch.ones(m, k)
    b = torch.cat([torch.ones(k // 2, n), -torch.ones(k // 2, n)]) + 0.002 * torch.randn(
        k, n, generator=g
    )
    return _pack(a, b, dtype, device)


def _large_magnitude(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # Entries of C up to ~1e4 (fp16) or ~1e30 (bf16): fails when the result is accumulated or
    # scaled in a type with less range than fp32 (fp16 overflows at 65504).
    m, n, k = 32, 48, 256
    scale = 3.0 if dtype == torch.float16 else 1e14
    a = torch.randn(m, k, generator=g) * scale
    b = torch.randn(k, n, generator=g) * scale / math.sqrt(k)
    return _pack(a, b, dtype, device)


def _shape_probe(m: int, n: int, k: int) -> Callable[[torch.dtype, str, torch.Generator], Inputs]:
    def probe(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
        a = torch.randn(m, k, generator=g)
        b = torch.randn(k, n, generator=g) / math.sqrt(k)
        return _pack(a, b, dtype, device)

    return probe


PROBES: dict[str, Callable[[torch.dtype, str, torch.Generator], Inputs]] = {
    "accumulation_cancellation": _accumulation_cancellation,
    "large_magnitude": _large_magnitude,
    "odd_sizes_37x53x71": _shape_probe(37, 53, 71),
    "k_not_multiple_of_tile_1000": _shape_probe(64, 64, 1000),
    "single_row_m1": _shape_probe(1, 256, 512),
    "single_column_n1": _shape_probe(64, 1, 512),
    "unaligned_strides_n1001": _shape_probe(16, 1001, 24),
    "k_1": _shape_probe(32, 32, 1),
}

PROBE_NOTES: dict[str, str] = {
    "accumulation_cancellation": "Partial sums reach 2048 and cancel to ~0.1: fails when the "
    "accumulator is bf16/fp16 (tl.dot(..., out_dtype=tl.float16) or summing in the input dtype) "
    "instead of fp32.",
    "large_magnitude": "Results up to ~1e4 (fp16) or ~1e30 (bf16): fails when the result is "
    "accumulated or rescaled in a type with less range than fp32.",
    "odd_sizes_37x53x71": "No size is a multiple of any tile: fails without masks (or TMA "
    "bounds) on m, n and k, or when out-of-range lanes are not zero in the K loop.",
    "k_not_multiple_of_tile_1000": "k=1000: fails when the last K step reads past the row (no "
    "K mask) or drops the tail.",
    "single_row_m1": "m=1 (decode-like): fails when the grid or the M mask assumes a full tile.",
    "single_column_n1": "n=1: fails when the N mask is missing or B's row stride is assumed to "
    "be a multiple of 8 elements.",
    "unaligned_strides_n1001": "n=1001: rows of B and C are not 16-byte aligned, so TMA "
    "descriptors cannot describe them: fails when a TMA path has no pointer fallback.",
    "k_1": "k=1: an outer product; fails when the K loop assumes at least one full tile.",
}


# Production kernels a user would pick instead (the lab times them beside ours, same protocol,
# correctness per row): name -> (pip package, factory returning a callable with the task's
# signature). cuBLAS comes with torch: it is also the torch_eager strategy, named here so the
# report's peer columns read the same for every task.
def _cublas():
    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)

    return run


PEERS = {"cublas": ("torch", _cublas)}

__all__ = [
    "PEERS",
    "PROBES",
    "PROBE_NOTES",
    "bytes_moved",
    "flops",
    "interpreter_shape",
    "make_inputs",
    "output_spec",
    "reference",
    "torch_eager",
]
