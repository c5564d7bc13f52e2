"""Trusted reference and input generator for softmax (row softmax over the last dim, wide rows).
Stays inside the toolkit.

The GPU-side runner imports this file by path, so it needs only the standard library and torch.
make_inputs draws where the caller's generator lives (the runner passes one on the device); the
probes draw on the CPU and move the result, so a seed gives the same inputs on every device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Inputs = tuple[tuple, dict]


def _pack(x: torch.Tensor, dtype: torch.dtype, device: str) -> Inputs:
    return (x.to(device=device, dtype=dtype).contiguous(),), {}


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp32 for the reference's math; fp64 stays fp64 (the generic suite, tools/gpu/numerics.py,
    checks that a draw's fp32 result is accurate against it)."""
    return t if t.dtype == torch.float64 else t.float()


def make_inputs(
    shape: dict[str, int], dtype: torch.dtype, device: str, generator: torch.Generator
) -> Inputs:
    """Fresh input (x,), {} for the candidate call; shape keys rows and dim. x ~ 3 N(0, 1):
    logits whose softmax spans many orders of magnitude within a row."""
    rows, dim = shape["rows"], shape["dim"]
    x = 3.0 * torch.randn(
        rows, dim, generator=generator, dtype=torch.float32, device=generator.device
    )
    return _pack(x, dtype, device)


def reference(x: torch.Tensor) -> torch.Tensor:
    """softmax(x, dim=-1) in fp32 from the same fp16/bf16 input; returns fp32."""
    return torch.softmax(_wide(x), dim=-1)


def torch_eager(x: torch.Tensor) -> torch.Tensor:
    """What a PyTorch user writes: PyTorch's own fused softmax kernel (fp32 math inside)."""
    return torch.softmax(x, dim=-1)


def output_spec(x: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(x.shape), x.dtype


def bytes_moved(shape: dict[str, int], dtype_bytes: int) -> int:
    """Minimal traffic: read x once, write y once."""
    return 2 * shape["rows"] * shape["dim"] * dtype_bytes


def flops(shape: dict[str, int]) -> int:
    """About 5 per element: max, subtract, exp, sum, scale."""
    return 5 * shape["rows"] * shape["dim"]


def interpreter_shape(shape: dict[str, int]) -> dict[str, int]:
    """Scaled-down shape for the Triton CPU interpreter: same dim (it picks the code path),
    2..9 rows (odd row counts stay odd: a kernel with several rows per program sees a ragged
    last tile)."""
    return {**shape, "rows": max(2, min(8, shape["rows"] // 512)) | (shape["rows"] & 1)}


# Numerical edge cases: (args, kwargs) for one call, small enough for the interpreter.


def _randn(rows: int, dim: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, dim, generator=g)


def _large_logits(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # |x| up to 3e4 (fp16's max is 65504): exp(x) overflows fp32 from x = 88.7.
    x = 1e4 * _randn(4, 1024, g)
    return _pack(x.clamp(-3e4, 3e4), dtype, device)


def _negative_logits_odd_dim(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # Every logit near -80 and dim = 1001: a padded lane loaded as 0 instead of -inf becomes the
    # row maximum, exp(x - 0) underflows and the row comes out as zeros (or NaN).
    return _pack(-80.0 + _randn(3, 1001, g), dtype, device)


def _constant_rows(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # Each row one value (different per row): the result is exactly 1/dim everywhere.
    return _pack(5.0 * _randn(4, 1, g).expand(4, 3000), dtype, device)


def _masked_entries(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # About half the entries are -inf (attention masks); every row keeps a finite entry.
    x = 3.0 * _randn(4, 2048, g)
    drop = torch.rand(4, 2048, generator=g) < 0.5
    drop[:, 0] = False
    return _pack(x.masked_fill(drop, float("-inf")), dtype, device)


def _shape_probe(rows: int, dim: int) -> Callable[[torch.dtype, str, torch.Generator], Inputs]:
    def probe(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
        return _pack(3.0 * _randn(rows, dim, g), dtype, device)

    return probe


PROBES: dict[str, Callable[[torch.dtype, str, torch.Generator], Inputs]] = {
    "large_logits": _large_logits,
    "negative_logits_odd_dim": _negative_logits_odd_dim,
    "constant_rows": _constant_rows,
    "masked_entries": _masked_entries,
    "single_row": _shape_probe(1, 4096),
    "dim_1": _shape_probe(5, 1),
    "odd_dim_3000": _shape_probe(3, 3000),
    "wide_dim_32768": _shape_probe(2, 32768),
    "wider_dim_65536": _shape_probe(2, 65536),
}

PROBE_NOTES: dict[str, str] = {
    "large_logits": "Logits up to +-3e4: fails when the row maximum is not subtracted before exp "
    "(exp overflows to inf, inf/inf = NaN) or when x - max is computed in fp16.",
    "negative_logits_odd_dim": "All logits near -80, dim 1001: fails when padded lanes are loaded "
    "as 0 instead of -inf (the padding becomes the maximum) or the sum includes padded lanes.",
    "constant_rows": "Constant rows must give exactly 1/dim: fails when the sum runs over the "
    "padded block (dim 3000 pads to 4096) or the result is normalized by the wrong count.",
    "masked_entries": "Half the logits are -inf: they must give 0, the rest a proper softmax; "
    "fails when -inf - max makes NaN (an online max/sum without a guard) or -inf is clamped.",
    "single_row": "rows=1: fails when the grid or a several-rows-per-program tile assumes more "
    "rows than exist.",
    "dim_1": "dim=1: every output is 1.0; fails when the block size or masks assume a wider row.",
    "odd_dim_3000": "dim=3000 pads to a 4096 block: fails without column masks, or when a "
    "vectorized path assumes dim % 16 == 0.",
    "wide_dim_32768": "dim=32768, the widest dev case: fails when a register-resident row "
    "drops or double-counts part of the row.",
    "wider_dim_65536": "dim=65536, wider than fits in one program's registers: fails when the "
    "kernel has no looped (online) path for rows it cannot hold at once.",
}


# Production kernels a user would pick instead (the lab times them beside ours, same protocol,
# correctness per row): name -> (pip package, factory returning a callable with the task's
# signature). A factory that cannot import its package makes the lab report the peer missing.
def _liger_softmax():
    """Liger-Kernel's softmax over the last dimension."""
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    def run(x: torch.Tensor) -> torch.Tensor:
        return LigerSoftmaxFunction.apply(x)

    return run


PEERS = {"liger": ("liger-kernel", _liger_softmax)}

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
