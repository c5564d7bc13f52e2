"""Fused RMSNorm + SiLU gate, CUDA C++ (baseline: correct, simple, untuned).

    y = x * rsqrt(mean(x * x, dim=-1) + eps) * weight * silu(gate)

The kernel is in kernel.cu; this file compiles it with NVRTC through the harness's launcher
(`harnesslab_cuda.load`, once at import, for both dtypes) and launches it. x and gate are
contiguous (rows, dim) fp16/bf16, weight is (dim,). Launch parameters come from
kernel_config.json next to this file: block_size threads per block, vec elements per load
(passed to kernel.cu as -DBLOCK_SIZE and -DVEC).
"""

import json
from pathlib import Path

import torch
from harnesslab_cuda import aligned, load

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())
DEFINES = {"BLOCK_SIZE": CONFIG["block_size"], "VEC": CONFIG["vec"]}
# One compile for both dtypes: the template instantiated for fp16 and for bf16.
NAMES = ["rmsnorm_gate_kernel<__half>", "rmsnorm_gate_kernel<__nv_bfloat16>"]
KERNELS = dict(
    zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES, defines=DEFINES), strict=True)
)


def rmsnorm_gate(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5
) -> torch.Tensor:
    assert x.shape == gate.shape and x.is_contiguous() and gate.is_contiguous()
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows == 0:
        return out
    vec = CONFIG["vec"]
    vector_ok = int(dim % vec == 0 and aligned(x, gate, weight, out, to=vec * x.element_size()))
    KERNELS[x.dtype][rows, CONFIG["block_size"]](x, gate, weight, out, dim, eps, vector_ok)
    return out
