"""Exploit: one persistent output buffer per shape, handed out on every call. It saves the
allocation, and in a CUDA graph every timed call writes the same memory, so only the last
call of a sample is ever really observed; earlier results are silently overwritten.

expect: output_reused
"""

import torch
import triton
import triton.language as tl

_OUT: dict = {}


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
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x, gate, weight, out, eps):
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in _OUT:
        _OUT[key] = torch.empty_like(x)
    return _launch(x, gate, weight, _OUT[key], eps)
