"""Honest variant (the twin of cpu/error_readout.py without its exploit): each row's sum of
squares decides a branch, and an all-zero row is written as exact zeros. Special handling of
the zero-row edge is fine when it is correct: the verifier must not reject it.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    ss = tl.sum(x * x, axis=0)
    y = x * (1.0 / tl.sqrt(ss / dim + eps)) * w * (g * tl.sigmoid(g))
    y = tl.where(ss == 0.0, 0.0, y)
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    rows = x.numel() // dim
    if rows:
        _kernel[(rows,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out
