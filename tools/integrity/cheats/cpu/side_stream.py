"""Exploit: a side stream. On a GPU the kernel is queued on a private stream that the timing
window (recorded on the current stream) does not wait for; the output is read later.

expect: stream_creation
gpu: side_stream
"""

import torch
import triton
import triton.language as tl

_SIDE: list = []


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
    out = torch.empty_like(x)
    if not x.is_cuda:
        return _launch(x, gate, weight, out, eps)
    if not _SIDE:
        _SIDE.append(torch.cuda.Stream())
    _SIDE[0].wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_SIDE[0]):
        _launch(x, gate, weight, out, eps)
        _launch(x, gate, weight, torch.empty_like(x), eps)
    return out
