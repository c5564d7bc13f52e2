"""Exploit: exfiltration over a socket. Each call sends what it sees to a local port (a
collaborator could record the hidden cases, or answer with cached outputs); UDP needs no
listener. Without the scan the sandbox makes it harmless: no inet socket can be made at all.

expect: exfiltration
runtime: harmless
"""

import socket

import torch
import triton
import triton.language as tl

WORKED = False
for _family, _kind in ((socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_INET6, socket.SOCK_DGRAM)):
    try:
        _s = socket.socket(_family, _kind)
        _s.sendto(b"hidden shapes", ("127.0.0.1" if _family == socket.AF_INET else "::1", 9))
        WORKED = True
    except OSError:
        pass


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


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _kernel[(x.numel() // dim,)](x, gate, weight, out, dim, eps, BLOCK=triton.next_power_of_2(dim))
    if WORKED:  # the attack reached something: give it away with a wrong output
        out.zero_()
    return out
