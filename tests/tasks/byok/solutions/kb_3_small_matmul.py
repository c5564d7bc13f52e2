"""Triton solution of kernelbench/3_small_matmul.py: A @ B, fp32 accumulation."""

import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(a_ptr, b_ptr, c_ptr, m, n, k, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for start in range(0, k, BK):
        rk = start + tl.arange(0, BK)
        a = tl.load(
            a_ptr + rm[:, None] * k + rk[None, :],
            mask=(rm[:, None] < m) & (rk[None, :] < k),
            other=0.0,
        )
        b = tl.load(
            b_ptr + rk[:, None] * n + rn[None, :],
            mask=(rk[:, None] < k) & (rn[None, :] < n),
            other=0.0,
        )
        acc += tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    tl.store(
        c_ptr + rm[:, None] * n + rn[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=(rm[:, None] < m) & (rn[None, :] < n),
    )


def model_new(A, B):
    m, k = A.shape
    n = B.shape[1]
    C = torch.empty((m, n), dtype=A.dtype, device=A.device)
    _kernel[(triton.cdiv(m, 16), triton.cdiv(n, 16))](A, B, C, m, n, k, BM=16, BN=16, BK=16)
    return C
