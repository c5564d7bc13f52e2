"""A LayerNorm that takes the variance as E[x^2] - mean^2 in one pass (fp32): catastrophic
cancellation when a row's mean is large against its spread (mean 30, spread 0.01: off by ~7).
On rows drawn around 0 it is exact to fp32 rounding, so ordinary inputs never show it."""

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, w_ptr, b_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * dim
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / dim
    var = tl.sum(x * x, axis=0) / dim - mean * mean
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x - mean) * rstd * w + b
    tl.store(out_ptr + row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm(x, weight, bias, eps=1e-5):
    dim = x.shape[-1]
    out = torch.empty_like(x)
    _kernel[(x.numel() // dim,)](x, weight, bias, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out
