"""Fused SwiGLU gate, CUDA C++ (baseline: correct, simple, untuned).

    y = silu(a) * b        silu(a) = a * sigmoid(a)

The kernel is in kernel.cu; this file compiles it with NVRTC through the harness's launcher
(`harnesslab_cuda.load`, once at import, for both dtypes) and launches it. a and b are
contiguous (rows, dim) fp16/bf16. Launch parameters come from kernel_config.json next to this
file: block_size threads per block, vec elements per load, items_per_thread packs per thread
(-DBLOCK_SIZE, -DVEC, -DITEMS_PER_THREAD in kernel.cu).
"""

import json
from pathlib import Path

import torch
from harnesslab_cuda import aligned, load

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())
DEFINES = {
    "BLOCK_SIZE": CONFIG["block_size"],
    "VEC": CONFIG["vec"],
    "ITEMS_PER_THREAD": CONFIG["items_per_thread"],
}
# One compile for both dtypes: the template instantiated for fp16 and for bf16.
NAMES = ["swiglu_kernel<__half>", "swiglu_kernel<__nv_bfloat16>"]
KERNELS = dict(
    zip((torch.float16, torch.bfloat16), load("kernel.cu", NAMES, defines=DEFINES), strict=True)
)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    if n == 0:
        return out
    vec = CONFIG["vec"]
    vector_ok = int(aligned(a, b, out, to=vec * a.element_size()))
    per_block = (vec if vector_ok else 1) * CONFIG["items_per_thread"] * CONFIG["block_size"]
    blocks = max(1, -(-n // per_block))
    KERNELS[a.dtype][blocks, CONFIG["block_size"]](a, b, out, n, vector_ok)
    return out
