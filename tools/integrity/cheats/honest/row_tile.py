"""Honest variant: a 2-D tile of ROWS rows per program (several rows share one weight load),
launch parameters computed from the shape, fp32 math. The verifier must not reject it.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _tile(x_ptr, g_ptr, w_ptr, out_ptr, n_rows, dim, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < n_rows)[:, None] & (cols < dim)[None, :]
    offs = rows.to(tl.int64)[:, None] * dim + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < dim, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / dim + eps)
    y = x * rstd[:, None] * w[None, :] * (g * tl.sigmoid(g))
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    dim = x.shape[-1]
    n_rows = x.numel() // dim
    block = triton.next_power_of_2(dim)
    rows = max(1, min(4, 8192 // block))
    out = torch.empty_like(x)
    _tile[(triton.cdiv(n_rows, rows),)](
        x, gate, weight, out, n_rows, dim, eps, ROWS=rows, BLOCK=block
    )
    return out
