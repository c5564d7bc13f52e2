"""GPU exploit, CUDA C++: a stale scalar. kernel.py keeps the eps of its first call and passes it
to every later launch; a hidden case with its own eps (tiny rows with eps = 1e-10) comes out
wrong. The recorder records the scalar the launch really got, so the replay is as wrong. That
case is a precision edge, so the rejection may carry its code (`precision`, as on an H200).

static: pass
gpu: wrong_output|precision
twin: honest_rows
"""

import torch
from harnesslab_cuda import load

NAMES = ["rmsnorm_gate_row<__half>", "rmsnorm_gate_row<__nv_bfloat16>"]
KERNELS = dict(zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES), strict=True))
_FIRST_EPS: list[float] = []


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows:
        _FIRST_EPS.append(eps)
        KERNELS[x.dtype][rows, 256](x, gate, weight, out, dim, _FIRST_EPS[0])
    return out
