"""Norm: x / sqrt(mean(x^2 over the feature dim) + eps) for (batch, features, *spatial)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _rms(x_ptr, out_ptr, F, S, eps, BLOCK_F: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0)
    ss = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    sm = ss < S
    base = x_ptr + b * F * S
    acc = tl.zeros([BLOCK_S], dtype=tl.float32)
    for f0 in range(0, F, BLOCK_F):
        fs = f0 + tl.arange(0, BLOCK_F)
        mask = (fs < F)[:, None] & sm[None, :]
        x = tl.load(base + fs[:, None] * S + ss[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(x * x, axis=0)
    inv = 1.0 / tl.sqrt(acc / F + eps)
    for f0 in range(0, F, BLOCK_F):
        fs = f0 + tl.arange(0, BLOCK_F)
        mask = (fs < F)[:, None] & sm[None, :]
        offs = fs[:, None] * S + ss[None, :]
        x = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
        y = x * inv[None, :]
        tl.store(out_ptr + b * F * S + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def model_new(x, *, num_features, eps=1e-5):
    batch, features = x.shape[0], x.shape[1]
    out = torch.empty_like(x)
    if out.numel() == 0:  # an empty batch: nothing to launch
        return out
    spatial = x.numel() // (batch * features)
    block_s = min(128, triton.next_power_of_2(spatial))
    grid = (batch, triton.cdiv(spatial, block_s))
    _rms[grid](x, out, features, spatial, eps, BLOCK_F=16, BLOCK_S=block_s)
    return out
