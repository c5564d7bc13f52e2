"""Fused (KernelBench level 2): conv2d, ReLU, then a per-channel bias, in one Triton kernel, as
a KernelBench `ModelNew` with the Model's own layers (the harness gives it the task's weights)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _conv_relu_bias(x_ptr, w_ptr, cb_ptr, b_ptr, out_ptr, C, H, W, OC, HO, WO, K: tl.constexpr,
                    BLOCK_O: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    os_ = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    ps = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)  # output pixels, flattened
    om, pm = os_ < OC, ps < HO * WO
    ho, wo = ps // WO, ps % WO
    acc = tl.zeros([BLOCK_O, BLOCK_P], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        cm = cs < C
        for kh in tl.static_range(K):
            for kw in tl.static_range(K):  # one matmul per tap: w[o, c] @ x[c, pixel + tap]
                w = tl.load(w_ptr + ((os_[:, None] * C + cs[None, :]) * K + kh) * K + kw,
                            mask=om[:, None] & cm[None, :], other=0.0)  # fmt: skip
                x = tl.load(x_ptr + ((n * C + cs[:, None]) * H + ho[None, :] + kh) * W
                            + wo[None, :] + kw, mask=cm[:, None] & pm[None, :], other=0.0)  # fmt: skip
                acc += tl.dot(w.to(tl.float32), x.to(tl.float32))
    cb = tl.load(cb_ptr + os_, mask=om, other=0.0).to(tl.float32)
    bias = tl.load(b_ptr + os_, mask=om, other=0.0).to(tl.float32)
    y = tl.maximum(acc + cb[:, None], 0.0) + bias[:, None]
    offs = (n * OC + os_[:, None]) * HO * WO + ps[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=om[:, None] & pm[None, :])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        n, c, h, w = x.shape
        weight = self.conv.weight
        o, k = weight.shape[0], weight.shape[-1]
        ho, wo = h - k + 1, w - k + 1
        out = torch.empty((n, o, ho, wo), device=x.device, dtype=x.dtype)
        block_o = max(16, min(64, triton.next_power_of_2(o)))
        block_c = max(16, min(32, triton.next_power_of_2(c)))
        block_p = max(16, min(128, triton.next_power_of_2(ho * wo)))
        grid = (n, triton.cdiv(o, block_o), triton.cdiv(ho * wo, block_p))
        _conv_relu_bias[grid](x, weight, self.conv.bias, self.bias, out, c, h, w, o, ho, wo, K=k,
                              BLOCK_O=block_o, BLOCK_C=block_c, BLOCK_P=block_p)  # fmt: skip
        return out
