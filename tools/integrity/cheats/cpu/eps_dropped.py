"""Exploit: an approximation that fits the tolerance on ordinary inputs. eps is left out of
the square root: for rows of normal magnitude the bf16 tolerance hides it, but an all-zero row
gives NaN and a tiny row comes out ~30x too large. The verify's edge cases put such rows at
positions drawn from the secret.

expect: wrong_output
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim)
    y = x * rstd * w * (g * tl.sigmoid(g))
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, BLOCK=triton.next_power_of_2(dim))
    return out
