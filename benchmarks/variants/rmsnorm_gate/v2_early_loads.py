"""rmsnorm_gate variant 2: every load issued before the reduction, unmasked power-of-two rows.

fast.py loads x and the gate, reduces, and then loads the weight: a second (L2) round trip on
every row's critical path after a block-wide barrier. Here x, the gate and the weight are all
issued first, so a row costs one memory round trip; the weight is kept in its storage dtype
until it is used (half the registers of an fp32 copy). When dim is a power of two the row fills
its block exactly (EVEN), and the loads and the store carry no mask. One power-of-two block per
row (no head/tail split), fast.py's alignment trick and warps rule.

Prediction: the launch-bound shapes (HarnessGym's four final cases, 1024x1024, 768x2048,
384x4096), where each program's latency chain is the kernel's time, gain ~0.2-0.4 us each (one
L2 round trip of ~0.3 us removed); the bandwidth-bound shapes stay within noise (latency is
hidden there by other programs), except 5120/6144, which now run in one 8192 block like FLA.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_gate_early(
    x_ptr,
    gate_ptr,
    w_ptr,
    out_ptr,
    dim_units,
    eps,
    DIM_ALIGN: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
):
    dim = dim_units * DIM_ALIGN  # divisibility by DIM_ALIGN is visible to the compiler
    row = tl.program_id(0).to(tl.int64) * dim
    cols = tl.arange(0, BLOCK)
    if EVEN:  # dim == BLOCK: no lane is outside the row
        x = tl.load(x_ptr + row + cols)
        g = tl.load(gate_ptr + row + cols)
        w = tl.load(w_ptr + cols)
    else:
        mask = cols < dim
        x = tl.load(x_ptr + row + cols, mask=mask, other=0.0)
        g = tl.load(gate_ptr + row + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / dim + eps)
    gf = g.to(tl.float32)
    y = (xf * rstd * w.to(tl.float32) * (gf * tl.sigmoid(gf))).to(out_ptr.dtype.element_ty)
    if EVEN:
        tl.store(out_ptr + row + cols, y)
    else:
        tl.store(out_ptr + row + cols, y, mask=cols < dim)


def launch_params(dim: int) -> dict[str, int]:
    """fast.py's warps rule on one power-of-two block."""
    block = triton.next_power_of_2(dim)
    num_warps = max(4, min(16, block // 256))
    if dim < 0.75 * block:
        num_warps = max(4, num_warps // 2)
    return {"block": block, "num_warps": num_warps, "num_stages": 1}


def rmsnorm_gate(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    assert x.shape == gate.shape and x.is_contiguous() and gate.is_contiguous()
    dim = x.shape[-1]
    out = torch.empty_like(x)
    params = launch_params(dim) | (config or {})
    align = min(dim & -dim, 16)
    _rmsnorm_gate_early[(x.numel() // dim,)](
        x,
        gate,
        weight,
        out,
        dim // align,
        eps,
        DIM_ALIGN=align,
        BLOCK=params["block"],
        EVEN=params["block"] == dim,
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
    )
    return out
