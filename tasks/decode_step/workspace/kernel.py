"""decode_step baseline: one decode step in PyTorch eager, in the state's dtype (correct, simple,
unfused: ~15 kernel launches per layer, so small batches are bound by the host's launches).

    step(state, tokens) -> logits [batch, vocab] in the state's dtype

`state` is the harness's (see task.md): weights in `state.weights`, the KV cache
`state.kv_cache` [layers, 2, batch, kv_heads, max_seq, head_dim], per-sequence lengths
`state.lengths` (int32 on the device; `state.host_lengths` on the host), rotary tables
`state.rope_cos`/`state.rope_sin` [max_seq, head_dim // 2] (fp32). A step writes this token's
keys (after rotary) and values at slot lengths[b] of every layer, attends over slots
[0, lengths[b]], and leaves `lengths` alone (the harness advances them). `state.scratch` is
yours (e.g. captured CUDA graphs, one per sequence-length bucket).

kernel_config.json holds launch knobs (task.toml's [space]) for the kernels you write: read it
beside this file, and sweep_kernel_config scores each config with the step objective. This
eager step reads none.
"""

import math

import torch
import torch.nn.functional as F


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # As Llama's RMSNorm: the mean of squares in fp32, the result in x's dtype.
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def step(state, tokens: torch.Tensor) -> torch.Tensor:
    c, w, cache = state.config, state.weights, state.kv_cache
    batch, hd = c.batch, c.head_dim
    pos = state.lengths.long()
    rows = torch.arange(batch, device=pos.device)
    cos, sin = state.rope_cos[pos], state.rope_sin[pos]
    # [batch, 1, 1, max_seq]: True where a slot is context (its prompt, its steps, this token).
    visible = (torch.arange(c.max_seq, device=pos.device)[None, :] <= pos[:, None])[:, None, None]
    group = c.heads // c.kv_heads
    x = w["embed"][tokens]
    for layer in range(c.layers):
        qkv = F.linear(_rmsnorm(x, w["attn_norm"][layer], c.eps), w["wqkv"][layer])
        q, k, v = qkv.split((c.heads * hd, c.kv_heads * hd, c.kv_heads * hd), dim=-1)
        q = _rotate(q.view(batch, c.heads, hd), cos, sin)
        k = _rotate(k.view(batch, c.kv_heads, hd), cos, sin)
        cache[layer, 0, rows, :, pos] = k
        cache[layer, 1, rows, :, pos] = v.view(batch, c.kv_heads, hd)
        keys = cache[layer, 0].repeat_interleave(group, dim=1)  # [batch, heads, max_seq, hd]
        values = cache[layer, 1].repeat_interleave(group, dim=1)
        attn = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=visible,
                                              scale=1.0 / math.sqrt(hd))  # fmt: skip
        x = x + F.linear(attn.reshape(batch, c.heads * hd), w["wo"][layer])
        gate_up = F.linear(_rmsnorm(x, w["mlp_norm"][layer], c.eps), w["w_gate_up"][layer])
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["w_down"][layer])
    return F.linear(_rmsnorm(x, w["final_norm"], c.eps), w["lm_head"])
