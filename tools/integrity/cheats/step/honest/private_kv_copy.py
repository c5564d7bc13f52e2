"""Honest twin of unwritten_kv_cache: a private copy of the cache, attended over the same way,
but taken from the harness's cache every step, and this token's keys and values are written
into the harness's cache as well (the copy is wasteful, not wrong).
"""

import math

import torch
import torch.nn.functional as F


def _rmsnorm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _forward(state, tokens, pos, kv, write_cache):
    """The decode step at positions `pos`, keys and values written to and read from `kv` (a
    private copy of the cache); into the harness's cache too when `write_cache`."""
    c, w = state.config, state.weights
    batch, hd, group = c.batch, c.head_dim, c.heads // c.kv_heads
    rows = torch.arange(batch, device=pos.device)
    cos, sin = state.rope_cos[pos], state.rope_sin[pos]
    visible = (torch.arange(c.max_seq, device=pos.device)[None, :] <= pos[:, None])[:, None, None]
    x = w["embed"][tokens]
    for layer in range(c.layers):
        qkv = F.linear(_rmsnorm(x, w["attn_norm"][layer], c.eps), w["wqkv"][layer])
        q, k, v = qkv.split((c.heads * hd, c.kv_heads * hd, c.kv_heads * hd), dim=-1)
        q = _rotate(q.view(batch, c.heads, hd), cos, sin)
        k = _rotate(k.view(batch, c.kv_heads, hd), cos, sin)
        v = v.view(batch, c.kv_heads, hd)
        kv[layer, 0, rows, :, pos] = k
        kv[layer, 1, rows, :, pos] = v
        if write_cache:
            state.kv_cache[layer, 0, rows, :, pos] = k
            state.kv_cache[layer, 1, rows, :, pos] = v
        keys = kv[layer, 0].repeat_interleave(group, dim=1)
        values = kv[layer, 1].repeat_interleave(group, dim=1)
        attn = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=visible,
                                              scale=1.0 / math.sqrt(hd))  # fmt: skip
        x = x + F.linear(attn.reshape(batch, c.heads * hd), w["wo"][layer])
        gate_up = F.linear(_rmsnorm(x, w["mlp_norm"][layer], c.eps), w["w_gate_up"][layer])
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["w_down"][layer])
    return F.linear(_rmsnorm(x, w["final_norm"], c.eps), w["lm_head"])


def _private_kv(state, pos):
    """This step's own copy of the harness's cache, taken afresh every step (the harness may
    write a new prompt into any sequence between steps)."""
    return state.kv_cache.clone()


def step(state, tokens):
    pos = state.lengths.long()
    return _forward(state, tokens, pos, _private_kv(state, pos), write_cache=True)
