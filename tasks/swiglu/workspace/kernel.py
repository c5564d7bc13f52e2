"""Fused SwiGLU gate (baseline: correct, simple, untuned).

    y = silu(a) * b        silu(a) = a * sigmoid(a)

a and b are contiguous (rows, dim) fp16/bf16. The math runs in fp32 and the result is cast
back to a's dtype. One program per row walks the row in blocks of `block_size` columns.
Launch parameters come from kernel_config.json next to this file, read once at import.
"""

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())


@triton.jit
def _swiglu_row_kernel(a_ptr, b_ptr, out_ptr, dim, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * dim
    for col in range(0, dim, BLOCK):
        cols = col + tl.arange(0, BLOCK)
        mask = cols < dim
        a = tl.load(a_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        y = a * tl.sigmoid(a) * b
        tl.store(out_ptr + row_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
    dim = a.shape[-1]
    out = torch.empty_like(a)
    _swiglu_row_kernel[(a.numel() // dim,)](
        a,
        b,
        out,
        dim,
        BLOCK=CONFIG["block_size"],
        num_warps=CONFIG["num_warps"],
        num_stages=CONFIG["num_stages"],
    )
    return out
