"""Fused (KernelBench level 2): relu(x @ W^T + bias) as a plain `model_new` function that is
given the Model's weights (gemm_weight, bias) like any input."""

import torch
import triton
import triton.language as tl


@triton.jit
def _gemm_bias_relu(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr):  # fmt: skip
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :],
                    mask=(rm < M)[:, None] & (rk < K)[None, :], other=0.0)  # fmt: skip
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None],
                    mask=(rk < K)[:, None] & (rn < N)[None, :], other=0.0)  # fmt: skip
        acc += tl.dot(x, w)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    y = tl.maximum(acc + bias[None, :], 0.0)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def model_new(x, bias, gemm_weight, *, in_features, out_features, bias_shape):
    m, k = x.shape
    n = gemm_weight.shape[0]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    _gemm_bias_relu[grid](x, gemm_weight, bias, out, m, n, k, BM=64, BN=64, BK=32)
    return out
