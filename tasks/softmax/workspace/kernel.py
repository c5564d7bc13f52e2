"""Row softmax (baseline: correct for any width, simple, untuned).

    y = exp(x - max(x)) / sum(exp(x - max(x)))       over the last dim

x is a contiguous (rows, dim) fp16/bf16 tensor; the result has x's shape and dtype, the math
runs in fp32. One program per row walks the row in blocks of `block_size` columns twice: a
first pass keeps a running max and a running sum (rescaled when the max grows), a second pass
writes the output. Launch parameters come from kernel_config.json next to this file.
"""

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())


@triton.jit
def _softmax_row_kernel(x_ptr, out_ptr, dim, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * dim
    # Pass 1: per-lane running max m and sum s of exp(x - m).
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for col in range(0, dim, BLOCK):
        cols = col + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row_start + cols, mask=cols < dim, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # Lanes still at -inf (padding, masked logits) must add 0, not exp(-inf + inf) = NaN.
        scale = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        term = tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
        s = s * scale + term
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    inv = 1.0 / total
    # Pass 2: the output.
    for col in range(0, dim, BLOCK):
        cols = col + tl.arange(0, BLOCK)
        mask = cols < dim
        x = tl.load(x_ptr + row_start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - row_max) * inv
        tl.store(out_ptr + row_start + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    assert x.is_contiguous()
    dim = x.shape[-1]
    out = torch.empty_like(x)
    _softmax_row_kernel[(x.numel() // dim,)](
        x,
        out,
        dim,
        BLOCK=CONFIG["block_size"],
        num_warps=CONFIG["num_warps"],
        num_stages=CONFIG["num_stages"],
    )
    return out
