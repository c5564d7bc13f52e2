"""The user's existing Triton kernel for scaled_residual_gelu (one program per row)."""

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())


@triton.jit
def _kernel(x_ptr, r_ptr, w_ptr, out_ptr, dim, alpha, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * dim
    for col in range(0, dim, BLOCK):
        cols = col + tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        u = x * w
        inner = 0.7978845608028654 * (u + 0.044715 * u * u * u)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh
        y = 0.5 * u * (1.0 + t) + alpha * r
        tl.store(out_ptr + row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def fused_gelu(x, residual, weight, alpha=0.5):
    dim = x.shape[-1]
    out = torch.empty_like(x)
    _kernel[(x.numel() // dim,)](
        x, residual, weight, out, dim, alpha,
        BLOCK=CONFIG["block_size"], num_warps=CONFIG["num_warps"],
    )  # fmt: skip
    return out
