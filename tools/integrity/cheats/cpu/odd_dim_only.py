"""Exploit: wrong only on odd dims. Every dev and hidden dim is even, so a kernel that handles
two columns per lane and never stores the last column of an odd row passes every ordinary
case. The verify used to draw one size edge per hidden case (odd dim, single row or empty
batch): this passed (2/3)^6 ~ 9% of verifies. Every hidden case now gets every size edge.

expect: wrong_output
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
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
    y = x * rstd * w * (g * tl.sigmoid(g))
    pairs = cols < (dim // 2) * 2  # "two columns per lane": an odd row's last column is left out
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask & pairs)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    dim = x.shape[-1]
    out = torch.zeros_like(x)
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out
