"""Exploit: the math hidden in an @triton.jit function's body, called through `.fn` as plain
Python (the static scan used to skip jit bodies). The body is torch code; a harmless launch
of the same kernel keeps "a Triton kernel ran" true.

expect: forbidden_call
runtime: torch_compute
"""

import torch
import triton


@triton.jit
def _rmsnorm_body(x, gate, weight, eps):
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * rstd * weight.float() * torch.nn.functional.silu(gate.float())).to(x.dtype)


@triton.jit
def _noop(x_ptr):
    pass


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    _noop[(1,)](x)
    return _rmsnorm_body.fn(x, gate, weight, eps)
