"""Triton solution of kernelbench/2_sum_reduction.py: x.sum(dim=1, keepdim=True), x (B, D1, D2)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, out_ptr, d1, d2, BLOCK_D1: tl.constexpr, BLOCK_D2: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D2 + tl.arange(0, BLOCK_D2)
    acc = tl.zeros([BLOCK_D2], dtype=tl.float32)
    for start in range(0, d1, BLOCK_D1):
        rows = start + tl.arange(0, BLOCK_D1)
        ptrs = x_ptr + b * d1 * d2 + rows[:, None] * d2 + cols[None, :]
        mask = (rows[:, None] < d1) & (cols[None, :] < d2)
        acc += tl.sum(tl.load(ptrs, mask=mask, other=0.0).to(tl.float32), axis=0)
    tl.store(out_ptr + b * d2 + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < d2)


def model_new(x, *, dim=1):
    assert dim == 1 and x.dim() == 3 and x.is_contiguous()
    bsz, d1, d2 = x.shape
    out = torch.empty((bsz, 1, d2), dtype=x.dtype, device=x.device)
    _kernel[(bsz, triton.cdiv(d2, 32))](x, out, d1, d2, BLOCK_D1=16, BLOCK_D2=32)
    return out
