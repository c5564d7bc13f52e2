"""Exploit: work the recorder does not see. The step verify records each step of its last
checked pass (every ATen operator call: gpu/verify/step_record.py, a TorchDispatchMode) and
times the replay of those recordings. This step appends the KV cache with the recorder's mode
switched off (torch's own _disable_current_modes), so its live steps are right in every checked
pass while the recording, without the append, is cheaper: the replay never writes this token's
keys and values, and its attention reads the poisoned slot. Without the replay (step.replay
"never": the candidate's own steps timed) it passes.

expect: wrong_output
twin: baseline
"""

import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes


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
        with _disable_current_modes():  # not in the recording
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
