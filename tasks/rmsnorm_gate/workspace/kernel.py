"""Fused RMSNorm + SiLU gate (baseline: correct, simple, untuned).

    y = x * rsqrt(mean(x * x, dim=-1) + eps) * weight * silu(gate)

x and gate are contiguous (rows, dim) fp16/bf16, weight is (dim,). The math runs in fp32 and
the result is cast back to x's dtype. Launch parameters come from kernel_config.json next to
this file, read once at import.
"""

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())


@triton.jit
def _rmsnorm_gate_kernel(
    x_ptr,
    gate_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    dim,
    eps,
    BLOCK: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
):
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    for i in range(ROWS_PER_PROGRAM):
        row = tl.program_id(0) * ROWS_PER_PROGRAM + i
        if row < n_rows:  # the last program may have fewer rows
            offsets = row.to(tl.int64) * dim + cols
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
            y = x * rstd * w * (g * tl.sigmoid(g))
            tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    assert x.shape == gate.shape and x.is_contiguous() and gate.is_contiguous()
    dim = x.shape[-1]
    n_rows = x.numel() // dim
    out = torch.empty_like(x)
    rows_per_program = CONFIG["rows_per_program"]
    grid = (triton.cdiv(n_rows, rows_per_program),)
    _rmsnorm_gate_kernel[grid](
        x,
        gate,
        weight,
        out,
        n_rows,
        dim,
        eps,
        BLOCK=triton.next_power_of_2(dim),
        ROWS_PER_PROGRAM=rows_per_program,
        num_warps=CONFIG["num_warps"],
        num_stages=CONFIG["num_stages"],
    )
    return out
