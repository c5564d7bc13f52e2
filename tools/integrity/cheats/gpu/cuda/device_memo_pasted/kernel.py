"""GPU exploit, CUDA C++: the same device-side memo with `__device__` built by token pasting, so
no text scan can see it. The launcher's PTX check refuses it at load (the module holds device
globals: device_state), so kernel.py does not import; once the trusted side checks the PTX it
compiled itself (issue 31 integration), the verdict's code is device_state.

static: pass
load: device_state
gpu: import_failed
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
