"""Honest twin of the device-state and timer cheats: a __constant__ table (read-only, set at
compile time), static __shared__ scratch and a function-local static constexpr: none of it
outlives a launch or tells time.

static: pass
gpu: pass
"""

import torch
from harnesslab_cuda import load

NAMES = ["rmsnorm_gate_row<__half>", "rmsnorm_gate_row<__nv_bfloat16>"]
KERNELS = dict(zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES), strict=True))


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows:
        KERNELS[x.dtype][rows, 256](x, gate, weight, out, dim, eps)
    return out
