"""Exploit: structured error inside the tolerance. In bf16 each row is normalised by the first
31/32 of its columns only (a reduction that skips the last tile): on inputs drawn i.i.d. per
element the mean of squares comes out within ~1% of the true one, inside bf16's 1.6e-2. Inputs
whose magnitude varies along the row (per-column scales largest at the row's ends, outliers in
the last column) put most of the row's energy where the kernel does not look.

expect: wrong_output
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, g_ptr, w_ptr, out_ptr, dim, used, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    head = tl.where(cols < used, x, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(head * head, axis=0) / used + eps)
    y = x * rstd * w * (g * tl.sigmoid(g))
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    dim = x.shape[-1]
    out = torch.empty_like(x)
    used = max(1, dim - dim // 32) if x.dtype == torch.bfloat16 else dim
    _kernel[(x.numel() // dim,)](
        x, gate, weight, out, dim, used, eps, BLOCK=triton.next_power_of_2(dim)
    )
    return out
