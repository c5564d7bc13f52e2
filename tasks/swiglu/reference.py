"""Trusted reference and input generator for swiglu (y = silu(a) * b). Stays inside the toolkit.

The GPU-side runner imports this file by path, so it needs only the standard library and torch.
make_inputs draws where the caller's generator lives (the runner passes one on the device); the
probes draw on the CPU and move the result, so a seed gives the same inputs on every device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Inputs = tuple[tuple, dict]


def _randn(rows: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, dim, generator=generator, dtype=torch.float32, device=generator.device)


def _pack(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, device: str) -> Inputs:
    return tuple(t.to(device=device, dtype=dtype).contiguous() for t in (a, b)), {}


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp32 for the reference's math; fp64 stays fp64 (the generic suite, tools/gpu/numerics.py,
    checks that a draw's fp32 result is accurate against it)."""
    return t if t.dtype == torch.float64 else t.float()


def make_inputs(
    shape: dict[str, int], dtype: torch.dtype, device: str, generator: torch.Generator
) -> Inputs:
    """Fresh inputs (a, b), {} for the candidate call; shape keys rows and dim. a ~ 2 N(0, 1)
    (the gate: silu's curved part and both tails), b ~ N(0, 1)."""
    rows, dim = shape["rows"], shape["dim"]
    a = 2.0 * _randn(rows, dim, generator)
    b = _randn(rows, dim, generator)
    return _pack(a, b, dtype, device)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b in fp32 from the same fp16/bf16 inputs; returns fp32."""
    return torch.nn.functional.silu(_wide(a)) * _wide(b)


def torch_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What a PyTorch user writes: two kernels in the input dtype (silu, then the product)."""
    return torch.nn.functional.silu(a) * b


def output_spec(a: torch.Tensor, b: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    return tuple(a.shape), a.dtype


def bytes_moved(shape: dict[str, int], dtype_bytes: int) -> int:
    """Minimal traffic: read a and b, write y."""
    return 3 * shape["rows"] * shape["dim"] * dtype_bytes


def flops(shape: dict[str, int]) -> int:
    """About 5 per element: exp, add, divide (sigmoid), two products."""
    return 5 * shape["rows"] * shape["dim"]


def interpreter_shape(shape: dict[str, int]) -> dict[str, int]:
    """Scaled-down shape for the Triton CPU interpreter: same dim, 2..9 rows (odd row counts
    stay odd, so a flat kernel still sees a ragged last block)."""
    return {**shape, "rows": max(2, min(8, shape["rows"] // 512)) | (shape["rows"] & 1)}


# Numerical edge cases: (args, kwargs) for one call, small enough for the interpreter.


def _silu_saturation(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # |a| in 20..100: exp(|a|) overflows fp16 from 11 and fp32 from 88.7.
    rows, dim = 4, 1024
    magnitude = torch.empty(rows, dim).uniform_(20.0, 100.0, generator=g)
    sign = torch.where(torch.rand(rows, dim, generator=g) < 0.5, -1.0, 1.0)
    b = torch.randn(rows, dim, generator=g)
    return _pack(sign * magnitude, b, dtype, device)


def _large_products(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # silu(a) * b up to ~3e4 in fp16 (max 65504), up to ~3e14 in bf16 (whose range is fp32's):
    # fails when bf16 data passes through fp16 anywhere (overflow to inf).
    rows, dim = 4, 1024
    a = torch.empty(rows, dim).uniform_(1.0, 150.0, generator=g)
    b = torch.empty(rows, dim).uniform_(-200.0, 200.0, generator=g)
    if dtype != torch.float16:
        b = b * 10.0 ** torch.empty(rows, 1).uniform_(0.0, 10.0, generator=g)
    return _pack(a, b, dtype, device)


def _tiny_values(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
    # a, b ~ 1e-2: silu(a) ~ a/2, the product ~ 5e-5 sits at fp16's subnormal boundary (6.1e-5).
    rows, dim = 4, 2048
    a = 1e-2 * torch.randn(rows, dim, generator=g)
    b = 1e-2 * torch.randn(rows, dim, generator=g)
    return _pack(a, b, dtype, device)


def _shape_probe(rows: int, dim: int) -> Callable[[torch.dtype, str, torch.Generator], Inputs]:
    def probe(dtype: torch.dtype, device: str, g: torch.Generator) -> Inputs:
        return _pack(2.0 * torch.randn(rows, dim, generator=g), torch.randn(rows, dim, generator=g),
                     dtype, device)  # fmt: skip

    return probe


PROBES: dict[str, Callable[[torch.dtype, str, torch.Generator], Inputs]] = {
    "silu_saturation": _silu_saturation,
    "large_products": _large_products,
    "tiny_values": _tiny_values,
    "single_row": _shape_probe(1, 4096),
    "odd_numel_7x1001": _shape_probe(7, 1001),
    "one_element": _shape_probe(1, 1),
    "wide_dim_14336": _shape_probe(3, 14336),
}

PROBE_NOTES: dict[str, str] = {
    "silu_saturation": "Gates of +-20..100 must give silu(a) ~ a or ~ 0: fails with an unstable "
    "silu such as a*exp(a)/(1+exp(a)), where exp overflows (inf/inf = NaN; from a=11 in fp16, "
    "a=89 in fp32).",
    "large_products": "Products up to ~3e4 (fp16) or ~3e14 (bf16): fails when bf16 values "
    "pass through fp16 (a cast or fp16 math overflows past 65504 to inf); do the math in fp32 "
    "and round once to the output dtype.",
    "tiny_values": "Outputs ~5e-5, at fp16's subnormal boundary (atol is 1e-5): fails when "
    "subnormal results are flushed to zero or the product underflows in a narrower type.",
    "single_row": "rows=1: fails when the grid assumes more rows than exist.",
    "odd_numel_7x1001": "7*1001 elements, odd: fails when the last block is not masked or a "
    "vectorized path assumes numel % 8 == 0.",
    "one_element": "A single element: fails when the grid or the block mask assumes a full block.",
    "wide_dim_14336": "dim=14336 (an LLM MLP width): fails when a row-per-program kernel drops "
    "or double-counts part of a wide row.",
}


# Production kernels a user would pick instead (the lab times them beside ours, same protocol,
# correctness per row): name -> (pip package, factory returning a callable with the task's
# signature). A factory that cannot import its package makes the lab report the peer missing.
def _liger_swiglu():
    """Liger-Kernel's fused SiLU-and-multiply (its SwiGLU MLP's elementwise part)."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return LigerSiLUMulFunction.apply(a, b)

    return run


PEERS = {"liger": ("liger-kernel", _liger_swiglu)}

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
