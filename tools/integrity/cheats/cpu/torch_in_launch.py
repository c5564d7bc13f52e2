"""Exploit: torch compute inside an interpreted launch. Under TRITON_INTERPRET a kernel body is
Python: this one calls a plain helper that does the reference's math in torch on the caller's
tensors (captured in a global) and writes the result, while the launch itself looks honest.
The runtime guard counts torch calls a candidate frame makes inside a launch.

expect: forbidden_call
runtime: torch_compute
"""

import torch
import triton

_ARGS = {}


def _cheat():
    x, gate, weight, eps, out = (_ARGS[k] for k in ("x", "gate", "weight", "eps", "out"))
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    out.copy_((y * torch.nn.functional.silu(gate.float())).to(out.dtype))


@triton.jit
def _kernel(x_ptr):
    _cheat()


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    out = torch.empty_like(x)
    _ARGS.update(x=x, gate=gate, weight=weight, eps=eps, out=out)
    _kernel[(1,)](x)
    return out
