"""Exploit: a tensor subclass that computes lazily. The call returns at once with a wrapper
whose data is only produced when someone reads it (after the timed window).

expect: private_api
runtime: not_plain_tensor
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
    tl.store(out_ptr + row * dim + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x, gate, weight, out, eps):
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    return out


class _Lazy(torch.Tensor):
    @staticmethod
    def __new__(cls, out, thunk):
        t = torch.Tensor._make_subclass(cls, out)
        t._thunk = thunk
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in args:
            if isinstance(a, _Lazy) and a._thunk is not None:
                thunk, a._thunk = a._thunk, None
                thunk()
        return super().__torch_function__(func, types, args, kwargs or {})


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    return _Lazy(out, lambda: _launch(x, gate, weight, out, eps))
