"""Honest twin of previous_logits: one logits buffer kept in state.scratch for the whole trace
(as a CUDA graph's static output is), this step's logits written into it and returned. The
harness takes each step's logits before it runs the next one.
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


def _attend(q, keys, values, visible, hd):
    return F.scaled_dot_product_attention(
        q[:, :, None, :], keys, values, attn_mask=visible, scale=1.0 / math.sqrt(hd)
    )


def _forward(state, tokens, pos, layers, slots):
    """The decode step at positions `pos` through `layers` of the model, attending over the
    first `slots` slots of the cache (the mask keeps each sequence to its own context)."""
    c, w, cache = state.config, state.weights, state.kv_cache
    batch, hd, group = c.batch, c.head_dim, c.heads // c.kv_heads
    rows = torch.arange(batch, device=pos.device)
    cos, sin = state.rope_cos[pos], state.rope_sin[pos]
    visible = (torch.arange(slots, device=pos.device)[None, :] <= pos[:, None])[:, None, None]
    x = w["embed"][tokens]
    for layer in layers:
        qkv = F.linear(_rmsnorm(x, w["attn_norm"][layer], c.eps), w["wqkv"][layer])
        q, k, v = qkv.split((c.heads * hd, c.kv_heads * hd, c.kv_heads * hd), dim=-1)
        q = _rotate(q.view(batch, c.heads, hd), cos, sin)
        k = _rotate(k.view(batch, c.kv_heads, hd), cos, sin)
        cache[layer, 0, rows, :, pos] = k
        cache[layer, 1, rows, :, pos] = v.view(batch, c.kv_heads, hd)
        keys = cache[layer, 0, :, :, :slots].repeat_interleave(group, dim=1)
        values = cache[layer, 1, :, :, :slots].repeat_interleave(group, dim=1)
        attn = _attend(q, keys, values, visible, hd)
        x = x + F.linear(attn.reshape(batch, c.heads * hd), w["wo"][layer])
        gate_up = F.linear(_rmsnorm(x, w["mlp_norm"][layer], c.eps), w["w_gate_up"][layer])
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["w_down"][layer])
    return F.linear(_rmsnorm(x, w["final_norm"], c.eps), w["lm_head"])


def step(state, tokens):
    c = state.config
    out = _forward(state, tokens, state.lengths.long(), range(c.layers), c.max_seq)
    buf = state.scratch.setdefault("logits", torch.empty_like(out))
    buf.copy_(out)
    return buf
