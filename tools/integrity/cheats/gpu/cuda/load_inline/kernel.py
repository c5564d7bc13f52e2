"""GPU exploit, CUDA C++ around the launcher: kernel.py builds its own extension with
torch.utils.cpp_extension.load_inline (host C++ and CUDA the harness never sees, launched by
code the recorder cannot wrap). Refused by the static scan (host_extension).

static: host_extension
gpu: host_extension
twin: honest_rows
"""

import torch
from harnesslab_cuda import load

NAMES = ["rmsnorm_gate_row<__half>", "rmsnorm_gate_row<__nv_bfloat16>"]
KERNELS = dict(zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES), strict=True))
from torch.utils.cpp_extension import load_inline  # noqa: E402

_EXT = None  # built on first use: load_inline(name="rms", cpp_sources=..., cuda_sources=...)
_ = load_inline


def rmsnorm_gate(x, gate, weight, eps=1e-5):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows:
        KERNELS[x.dtype][rows, 256](x, gate, weight, out, dim, eps)
    return out
