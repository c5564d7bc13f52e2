"""GPU exploit, CUDA C++: device-side memoisation. `__device__` globals keep the last call's
input key and output row in device memory that outlives the launch (the first half of a memo
that answers repeated inputs without reading them). Rejected by the static scan before it runs
(device_state); the PTX check of what NVRTC built sees the globals too.

static: device_state
load: device_state
gpu: device_state
twin: honest_constant_table
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
