"""Not an exploit: a debugging printf left in (it never fires). Allowed by the launcher in eval,
refused by the guarded verify's scan: a .cu submitted for the verdict holds no printf.

static: cuda_host_code
gpu: cuda_host_code
twin: honest_rows
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
