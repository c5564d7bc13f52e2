"""Fast reference solution for rmsnorm_gate: one row per program, the whole row in registers
(dim <= 8192), fp32 math, launch parameters chosen from dim.

What matters, measured on an H100 (Triton 3.6; % of the 3.0 TB/s copy bandwidth, CUDA-graph
replay over inputs rotated past the L2; this kernel vs the untuned baseline):
- Alignment the compiler can see. dim is passed as dim_units * DIM_ALIGN (DIM_ALIGN constexpr:
  the power of two dividing dim, up to 16), so rows and column masks are provably 16-byte
  aligned. Without it dim = 3000 (= 8 * 375) compiles to 2-byte loads: 8192x3000 bf16 92% vs 70%.
- num_warps = next_pow2(dim) / 256 (8 elements, one 16-byte fp16/bf16 vector, per thread and
  tensor), capped at 16: 4 warps at 1024, 8 at 2048, 16 at 4096 and 8192. 32 warps at 8192
  measured up to 9% slower than 16.
- No padding to 8192 for 4096 < dim < 8192: the row is covered by a 4096 head block and a
  power-of-two tail block (5120 = 4096 + 1024, 6144 = 4096 + 2048) with 8 warps, instead of one
  8192 block: 4096x5120 fp16 88% vs 70%, 4096x6144 bf16 91% vs 80%. (For 1536 and 3000 the
  split measured slower than one padded block, so they keep one block.)
- Half the warps when the padded block is under 75% full (dim 3000 in a 4096 block: 8 warps,
  not 16). Measured on an H200: 8192x3000 bf16 86% vs 77% of copy (4 warps 79%); not measured
  on the H100, where 16 warps gave 95-97%.
- One row per program: several rows per program (a 2-D tile) was slower at every dim from
  1024 to 8192, e.g. 16384x1024: 84% with 4 rows, 90% with 1.
- No cache hints: evict_first on x and gate plus evict_last on the weight measured 2-4% slower
  at every dim.
Power-of-two dims are already at 90-95% with the baseline's structure (4096x8192 bf16: 96% vs
91%), so the gains are mostly on the hidden cases' dims 1536, 3000, 5120, 6144.

Same contract as the workspace's kernel.py. `config` (keyword-only, optional) overrides
num_warps / num_stages for sweeps.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

# Variants `lab_gpu.py --tune` times (each overrides launch_params for every width).
TUNE_CASES = ["4096x4096_fp16", "4096x8192_bf16", "8192x3000_bf16", "4096x5120_fp16"]
TUNE_SPACE = [{"num_warps": w, "num_stages": s} for w in (4, 8, 16, 32) for s in (1, 2)]


@triton.jit
def _rmsnorm_gate_row(
    x_ptr,
    gate_ptr,
    w_ptr,
    out_ptr,
    dim_units,
    eps,
    DIM_ALIGN: tl.constexpr,
    HEAD: tl.constexpr,
    TAIL: tl.constexpr,
    HAS_TAIL: tl.constexpr,
):
    dim = dim_units * DIM_ALIGN  # divisibility by DIM_ALIGN is now visible to the compiler
    row_start = tl.program_id(0).to(tl.int64) * dim
    cols = tl.arange(0, HEAD)
    mask = cols < dim
    x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
    sum_sq = tl.sum(x * x, axis=0)
    if HAS_TAIL:  # columns HEAD .. dim-1 (constexpr branch: no code when there is no tail)
        cols_t = HEAD + tl.arange(0, TAIL)
        mask_t = cols_t < dim
        x_t = tl.load(x_ptr + row_start + cols_t, mask=mask_t, other=0.0).to(tl.float32)
        g_t = tl.load(gate_ptr + row_start + cols_t, mask=mask_t, other=0.0).to(tl.float32)
        sum_sq += tl.sum(x_t * x_t, axis=0)
    rstd = tl.math.rsqrt(sum_sq / dim + eps)

    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w * (g * tl.sigmoid(g))
    tl.store(out_ptr + row_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    if HAS_TAIL:
        w_t = tl.load(w_ptr + cols_t, mask=mask_t, other=0.0).to(tl.float32)
        y_t = x_t * rstd * w_t * (g_t * tl.sigmoid(g_t))
        tl.store(out_ptr + row_start + cols_t, y_t.to(out_ptr.dtype.element_ty), mask=mask_t)


def dim_align(dim: int) -> int:
    """Largest power of two dividing dim, capped at 16 elements (>= 16 bytes for fp16/bf16)."""
    return min(dim & -dim, 16)


def launch_params(dim: int) -> dict[str, int]:
    """HEAD/TAIL blocks covering a row of `dim` and the launch parameters for them."""
    padded = triton.next_power_of_2(dim)
    if padded > 4096 and padded != dim:  # 4096 < dim < 8192: 4096 head + power-of-two tail
        head = padded // 2
        tail = triton.next_power_of_2(dim - head)
        return {"head": head, "tail": tail, "num_warps": head // 512, "num_stages": 1}
    num_warps = max(4, min(16, padded // 256))
    if dim < 0.75 * padded:  # a mostly-masked block: half the warps (8192x3000 on an H200)
        num_warps = max(4, num_warps // 2)
    return {"head": padded, "tail": 0, "num_warps": num_warps, "num_stages": 1}


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
    align = dim_align(dim)
    _rmsnorm_gate_row[(x.numel() // dim,)](
        x,
        gate,
        weight,
        out,
        dim // align,
        eps,
        DIM_ALIGN=align,
        HEAD=params["head"],
        TAIL=max(params["tail"], 1),  # tl.arange needs a size >= 1; unused without a tail
        HAS_TAIL=params["tail"] > 0,
        num_warps=params["num_warps"],
        num_stages=params["num_stages"],
    )
    return out
