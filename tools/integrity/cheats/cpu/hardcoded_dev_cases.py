"""Exploit: hard-coded behaviour for the visible dev cases. The kernel runs only for the exact
dev shapes; every other shape gets zeros (a benchmark that only ever sees dev cases cannot
tell).

expect: wrong_output
"""

import torch
import triton
import triton.language as tl

DEV_SHAPES = {(1024, 1024), (768, 2048), (384, 4096), (4096, 4096), (4096, 8192)}


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
    out = torch.zeros_like(x)
    if tuple(x.shape) in DEV_SHAPES:
        return _launch(x, gate, weight, out, eps)
    return out
