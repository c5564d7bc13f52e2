"""Exploit: positions kept across steps instead of read from the state. The step remembers the
lengths it saw on its first call and counts its own steps from there (one host read fewer),
so rotary positions and cache slots go stale as soon as the harness gives a sequence a new
prompt (continuous batching) or starts the trace over.

expect: wrong_output
twin: host_positions
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


_START: dict = {}


def step(state, tokens):
    c = state.config
    if "pos" not in _START:
        _START["pos"] = state.lengths.long().clone()
    else:  # kept in range (as a cheat that must not crash would): stale, never out of bounds
        _START["pos"] = (_START["pos"] + 1).clamp(max=c.max_seq - 1)
    return _forward(state, tokens, _START["pos"], range(c.layers), c.max_seq)
