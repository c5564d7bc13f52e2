"""Row softmax, CUDA C++ (baseline: correct for any width, simple, untuned).

    y = exp(x - max(x)) / sum(exp(x - max(x)))       over the last dim

The kernel is in kernel.cu; this file compiles it with NVRTC through the harness's launcher
(`harnesslab_cuda.load`, once at import, for both dtypes) and launches it. x is a contiguous
(rows, dim) fp16/bf16 tensor. Launch parameters come from kernel_config.json next to this file:
block_size threads per block, vec elements per load (-DBLOCK_SIZE, -DVEC in kernel.cu).
"""

import json
from pathlib import Path

import torch
from harnesslab_cuda import aligned, load

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())
DEFINES = {"BLOCK_SIZE": CONFIG["block_size"], "VEC": CONFIG["vec"]}
# One compile for both dtypes: the template instantiated for fp16 and for bf16.
NAMES = ["softmax_kernel<__half>", "softmax_kernel<__nv_bfloat16>"]
KERNELS = dict(
    zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES, defines=DEFINES), strict=True)
)


def softmax(x: torch.Tensor) -> torch.Tensor:
    assert x.is_contiguous()
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    out = torch.empty_like(x)
    if rows == 0:
        return out
    vec = CONFIG["vec"]
    vector_ok = int(dim % vec == 0 and aligned(x, out, to=vec * x.element_size()))
    KERNELS[x.dtype][rows, CONFIG["block_size"]](x, out, dim, vector_ok)
    return out
