"""Matmul: a tiled Triton matmul, fp32 accumulation."""

import torch
import triton
import triton.language as tl


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :],
                    mask=(rm < M)[:, None] & (rk < K)[None, :], other=0.0)  # fmt: skip
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :],
                    mask=(rk < K)[:, None] & (rn < N)[None, :], other=0.0)  # fmt: skip
        acc += tl.dot(a, b)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


def model_new(A, B):
    m, k = A.shape
    n = B.shape[1]
    out = torch.empty((m, n), device=A.device, dtype=A.dtype)
    _matmul[(triton.cdiv(m, 64), triton.cdiv(n, 64))](A, B, out, m, n, k, BM=64, BN=64, BK=32)
    return out
