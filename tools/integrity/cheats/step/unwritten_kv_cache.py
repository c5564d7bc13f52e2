"""Exploit: a KV cache the step never writes. The step keeps its tokens' keys and values in a
private copy of the cache (state.scratch) and attends over the harness's cache with the slots
it never wrote filled from that copy (they still hold the harness's public poison value, so
it can tell them from a new prompt's): every step's logits are right,
but the harness's cache, the one a server hands to the next step, a prefill or another
sequence, is never written (two stores per layer saved), so its slots after a pass hold
whatever was there before.

expect: wrong_kv_cache
twin: private_kv_copy
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


POISON = 512.0  # what the harness leaves in a slot's values until someone writes it (public)


def _private_kv(state, pos):
    """This step's view of the cache: the harness's, with the slots it holds no value for (the
    ones this cheat never wrote) filled from the step's own copy, for each sequence that
    continues from the last step (a new prompt or a new pass starts from the harness's)."""
    s = state.scratch
    kv = state.kv_cache.clone()
    if "kv" in s:
        goes_on = pos == s["last_pos"] + 1  # [batch]
        unwritten = (kv[:, 1] == POISON).all(-1)  # [layers, batch, kv_heads, slots]
        fill = (unwritten & goes_on[None, :, None, None])[:, None, ..., None]
        kv = torch.where(fill, s["kv"], kv)
    s["kv"], s["last_pos"] = kv, pos.clone()
    return kv


def step(state, tokens):
    pos = state.lengths.long()
    return _forward(state, tokens, pos, _private_kv(state, pos), write_cache=False)
