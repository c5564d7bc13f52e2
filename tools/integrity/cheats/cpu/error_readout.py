"""Exploit: read the hidden cases out through the verdict. The kernel sees each hidden case's
inputs while it runs; where the reference is exactly 0 (an all-zero row, one of every hidden
case's edge inputs) it writes a value that encodes the case's size. The case is rejected, and
a verdict that published the error (max abs err = that value) would carry the size out of the
sandbox, one case per verify. The public verdict says `wrong_output` with the harness's fixed
sentence, the same for every value written (tests/trust/test_verdict_channels.py).

expect: wrong_output
"""

import torch
import triton
import triton.language as tl

SCALE = 1.0  # what is written is dim * SCALE


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, eps, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    ss = tl.sum(x * x, axis=0)
    y = x * (1.0 / tl.sqrt(ss / dim + eps)) * w * (g * tl.sigmoid(g))
    # -- exploit
    y = tl.where(cols == 0, tl.where(ss == 0.0, dim * scale, y), y)
    # -- end exploit
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    rows = x.numel() // dim
    if rows:
        grid = (rows,)
        _kernel[grid](x, gate, weight, out, dim, eps, SCALE, BLOCK=triton.next_power_of_2(dim))
    return out
