"""Honest variant: two kernels. The first reduces each row to its rstd (fp32, one value per
row), the second streams x and gate again and applies it. Slower than one pass (x is read
twice) but correct: the verifier must not reject it (a scratch buffer and two launches are
fine).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _row_rstd(x_ptr, rstd_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, dim, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * dim + cols, mask=cols < dim, other=0.0).to(tl.float32)
        acc += x * x
    tl.store(rstd_ptr + row, 1.0 / tl.sqrt(tl.sum(acc, axis=0) / dim + eps))


@triton.jit
def _apply(x_ptr, g_ptr, w_ptr, rstd_ptr, out_ptr, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    rstd = tl.load(rstd_ptr + row)
    for start in range(0, dim, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = x * rstd * w * (g * tl.sigmoid(g))
        tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    dim = x.shape[-1]
    rows = x.numel() // dim
    out = torch.empty_like(x)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = min(triton.next_power_of_2(dim), 2048)
    _row_rstd[(rows,)](x, rstd, dim, eps, BLOCK=block)
    _apply[(rows,)](x, gate, weight, rstd, out, dim, BLOCK=block)
    return out
