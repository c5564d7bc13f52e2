"""A KernelBench-style solution, unchanged in form: a `ModelNew` nn.Module holding the same
Conv1d as the Model (the harness builds it and gives it the task's weights); forward runs a
Triton direct convolution (stride 1, no padding, no bias: the problem's configuration)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _conv1d(x_ptr, w_ptr, out_ptr, C, L, OC, L_OUT, K: tl.constexpr, BLOCK_O: tl.constexpr,
            BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr):  # fmt: skip
    b = tl.program_id(0)
    os_ = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    ls = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)
    om, lm = os_ < OC, ls < L_OUT
    acc = tl.zeros([BLOCK_O, BLOCK_L], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        cm = cs < C
        for k in tl.static_range(K):  # out[o, l] += sum_c w[o, c, k] * x[c, l + k]
            w = tl.load(w_ptr + os_[:, None] * C * K + cs[None, :] * K + k,
                        mask=om[:, None] & cm[None, :], other=0.0)  # fmt: skip
            x = tl.load(x_ptr + b * C * L + cs[:, None] * L + ls[None, :] + k,
                        mask=cm[:, None] & lm[None, :], other=0.0)  # fmt: skip
            acc += tl.dot(w.to(tl.float32), x.to(tl.float32))
    offs = b * OC * L_OUT + os_[:, None] * L_OUT + ls[None, :]
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=om[:, None] & lm[None, :])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=False):  # fmt: skip
        super().__init__()
        self.conv1d = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride,
                                padding=padding, dilation=dilation, groups=groups, bias=bias)  # fmt: skip

    def forward(self, x):
        w = self.conv1d.weight
        batch, channels, length = x.shape
        out_channels, _, k = w.shape
        l_out = length - k + 1
        out = torch.empty((batch, out_channels, l_out), device=x.device, dtype=x.dtype)
        block_o = max(16, min(64, triton.next_power_of_2(out_channels)))
        block_c = max(16, min(32, triton.next_power_of_2(channels)))
        block_l = max(16, min(128, triton.next_power_of_2(l_out)))
        grid = (batch, triton.cdiv(out_channels, block_o), triton.cdiv(l_out, block_l))
        _conv1d[grid](x, w, out, channels, length, out_channels, l_out, K=k, BLOCK_O=block_o,
                      BLOCK_C=block_c, BLOCK_L=block_l)  # fmt: skip
        return out
