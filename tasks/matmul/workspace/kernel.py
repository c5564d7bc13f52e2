"""bf16/fp16 GEMM C = A @ B (baseline: correct for any shape, simple, untuned).

A is (m, k), B is (k, n), both row-major; C is (m, n) in A's dtype, accumulated in fp32. One
program computes one block_m x block_n tile of C, walking K in steps of block_k. Programs are
ordered in groups of group_m tile rows (group_m = 1: plain row-major order). Launch parameters
come from kernel_config.json next to this file, read once at import.
"""

import json
from pathlib import Path

import torch
import triton
import triton.language as tl

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)
        if UPCAST:  # see matmul() below
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.ndim == 2 and b.ndim == 2 and a.shape[1] == b.shape[0] and a.dtype == b.dtype
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    bm, bn = CONFIG["block_m"], CONFIG["block_n"]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _matmul_kernel[grid](
        a, b, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=CONFIG["block_k"], GROUP_M=CONFIG["group_m"],
        # The Triton CPU interpreter (3.9) multiplies bf16 tiles as their raw 16-bit patterns
        # in tl.dot; on the CPU the tiles are upcast to fp32 first. On a GPU this is False and
        # the branch is not compiled.
        UPCAST=a.device.type == "cpu",
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"],
    )  # fmt: skip
    return c
