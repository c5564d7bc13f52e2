"""Honest twin of the CUDA cheats: rmsnorm_gate in CUDA C++ through harnesslab_cuda, one block
per row, every element, eps from the call. It must pass the scan, compile, and pass the guarded
verify on a GPU once CUDA launches are recorded (issue 31).

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
