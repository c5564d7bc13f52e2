"""GPU exploit: a memo in device memory. A memo needs memory that outlives the call: here a
buffer made at import, into which every output is copied (the first half of a memo that would
answer repeated inputs from it). Rejected: the replay allocates every buffer a call uses, so a
launch that names memory from before the call cannot be replayed; and every timed call gets
fresh inputs, so the second half could never hit.

gpu: unreplayable
"""

import torch
import triton
import triton.language as tl

_MEMO = torch.zeros(64 << 20, dtype=torch.float16, device="cuda")


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


@triton.jit
def _memo_copy(memo_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(memo_ptr + i, tl.load(out_ptr + i, mask=m), mask=m)


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    n = min(out.numel(), _MEMO.numel())
    _memo_copy[(triton.cdiv(n, 1024),)](_MEMO, out, n, BLOCK=1024)
    return out
