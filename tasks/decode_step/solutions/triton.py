"""Reference solution for decode_step: the step's non-GEMM work in Triton kernels, the GEMMs in
torch, and on a GPU the whole step replayed as one CUDA graph per sequence-length bucket.

    step(state, tokens) -> logits [batch, vocab] in the state's dtype (the contract: task.md)

What is Triton (this file's kernels):
- `_rmsnorm`: RMSNorm * weight, one program per row, fp32 math, the result in the state's
  dtype; it feeds the QKV, gate/up and LM-head projections (4 launches of it per layer pair + 1).
- `_rope_append`: rotary embedding of q and k at each sequence's position (lengths[b], read on
  the device) and the append of this token's keys and values at slot lengths[b] of the cache;
  q goes to a [batch, heads, head_dim] buffer. One program per sequence (a head per row).
- `_attend` + `_combine`: decode attention over the contiguous KV cache, split along the
  sequence (flash-decoding): one program per (sequence, kv-head, split) holds the kv-head's
  whole query group (grouped-query attention: each key and value is read once per group), runs
  an online softmax over its split's slots below lengths[b] + 1 (masked loads: a stale slot is
  never read), and writes a partial (max, sum, accumulator); `_combine` merges the splits per
  (sequence, query head). The split count follows the bucket, so short contexts launch few.
What is torch: the embedding gather, the five GEMMs per layer (F.linear: cuBLAS on a GPU),
the residual adds, SiLU * up, and the logits' copy out of the graph's buffer.

CUDA graphs (GPU only): the first step in a bucket (powers of two from 64, by the longest
context in `state.host_lengths`: no synchronisation) runs eagerly (compiling the kernels and
answering that step), then the step is captured into `state.scratch` keyed on the bucket and
the addresses of every state tensor it reads, over a static token buffer; later steps in the
bucket copy the tokens in, replay, and return a copy of the logits. Lengths are read on the
device inside the kernels, so one graph serves every length in its bucket, and nothing in it
depends on a step's values. A new State (new addresses) captures afresh.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# Launch knobs (task.toml [space]; sweep_kernel_config tunes them): kernel_config.json beside
# this file in a workspace; the lab runs this file alone, with these defaults.
CONFIG = {"block_n": 32, "num_warps": 4, "splits": 8}
if (_config_file := Path(__file__).with_name("kernel_config.json")).is_file():
    CONFIG.update(json.loads(_config_file.read_text()))


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * dim
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
    tl.store(out_ptr + row + cols, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_append(qkv_ptr, q_ptr, cache_k_ptr, cache_v_ptr, lengths_ptr, cos_ptr, sin_ptr,
                 max_seq, HEADS: tl.constexpr, KV_HEADS: tl.constexpr, ROWS_P: tl.constexpr,
                 HALF: tl.constexpr):  # fmt: skip
    """Program b: the sequence's qkv row as head rows r: r < HEADS query heads (rotated into
    q), then KV_HEADS key heads (rotated into the cache at slot lengths[b]), then KV_HEADS
    value heads (copied there)."""
    b = tl.program_id(0)
    hd = 2 * HALF
    pos = tl.load(lengths_ptr + b).to(tl.int64)
    r = tl.arange(0, ROWS_P)[:, None]
    d = tl.arange(0, HALF)[None, :]
    live = r < HEADS + 2 * KV_HEADS
    src = qkv_ptr + (b * (HEADS + 2 * KV_HEADS) + r) * hd + d
    x1 = tl.load(src, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=live, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + pos * HALF + d)
    sin = tl.load(sin_ptr + pos * HALF + d)
    rotated = r < HEADS + KV_HEADS
    y1 = tl.where(rotated, x1 * cos - x2 * sin, x1)
    y2 = tl.where(rotated, x2 * cos + x1 * sin, x2)
    is_q = r < HEADS
    is_k = rotated & (r >= HEADS)
    is_v = live & (r >= HEADS + KV_HEADS)
    q_dst = q_ptr + (b * HEADS + r) * hd + d
    tl.store(q_dst, y1.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(q_dst + HALF, y2.to(q_ptr.dtype.element_ty), mask=is_q)
    kv_row = (b * KV_HEADS + tl.where(is_k, r - HEADS, r - HEADS - KV_HEADS)) * max_seq + pos
    kv_dst = kv_row * hd + d
    tl.store(cache_k_ptr + kv_dst, y1.to(cache_k_ptr.dtype.element_ty), mask=is_k)
    tl.store(cache_k_ptr + kv_dst + HALF, y2.to(cache_k_ptr.dtype.element_ty), mask=is_k)
    tl.store(cache_v_ptr + kv_dst, y1.to(cache_v_ptr.dtype.element_ty), mask=is_v)
    tl.store(cache_v_ptr + kv_dst + HALF, y2.to(cache_v_ptr.dtype.element_ty), mask=is_v)


@triton.jit
def _attend(q_ptr, k_ptr, v_ptr, lengths_ptr, m_ptr, l_ptr, acc_ptr, max_seq, split_len, scale,
            KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_P: tl.constexpr,
            HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Program (b, kv head, split): the group's queries against slots [lo, hi) of the split,
    hi <= lengths[b] + 1; writes the partial max, sum and (unnormalised) accumulator."""
    b, kvh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    splits = tl.num_programs(2)
    n = tl.load(lengths_ptr + b) + 1  # the context: the prompt, the steps so far, this token
    lo = sp * split_len
    hi = tl.minimum(lo + split_len, n)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, HEAD_DIM)
    q_rows = (b * KV_HEADS + kvh) * GROUP + g  # query heads kvh * GROUP + g of sequence b
    q = tl.load(q_ptr + q_rows[:, None] * HEAD_DIM + d[None, :], mask=(g < GROUP)[:, None],
                other=0.0).to(tl.float32) * (scale * 1.4426950408889634)  # fmt: skip
    base = (b * KV_HEADS + kvh).to(tl.int64) * max_seq * HEAD_DIM
    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    s = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        slots = start + tl.arange(0, BLOCK_N)
        valid = slots < hi
        offs = base + slots[:, None] * HEAD_DIM + d[None, :]
        k = tl.load(k_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=valid[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_P, BLOCK_N], log2 units
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        s = s * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    part = ((b * KV_HEADS + kvh) * splits + sp) * GROUP_P + g
    tl.store(m_ptr + part, m)
    tl.store(l_ptr + part, s)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc)


@triton.jit
def _combine(m_ptr, l_ptr, acc_ptr, out_ptr, splits, KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
             GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_P: tl.constexpr,
             SPLITS_P: tl.constexpr):  # fmt: skip
    """Program b: merges the splits' partials of every query head (an empty split: max -inf)."""
    b = tl.program_id(0)
    h = tl.arange(0, HEADS_P)[:, None]  # [HEADS_P, 1]
    sp = tl.arange(0, SPLITS_P)[None, :]  # [1, SPLITS_P]
    d = tl.arange(0, HEAD_DIM)[None, None, :]
    part = ((b * KV_HEADS + h // GROUP) * splits + sp) * GROUP_P + h % GROUP
    live = (sp < splits) & (h < KV_HEADS * GROUP)
    m = tl.load(m_ptr + part, mask=live, other=float("-inf"))
    s = tl.load(l_ptr + part, mask=live, other=0.0)
    acc = tl.load(acc_ptr + part[:, :, None] * HEAD_DIM + d, mask=live[:, :, None], other=0.0)
    top = tl.max(m, axis=1)  # split 0 always holds slot 0: finite for a live head
    top = tl.where(top > float("-inf"), top, 0.0)
    w = tl.where(live & (m > float("-inf")), tl.exp2(m - top[:, None]), 0.0)
    total = tl.maximum(tl.sum(s * w, axis=1), 1e-30)  # padding heads: 0 / 1e-30, not stored
    out = tl.sum(acc * w[:, :, None], axis=1) / total[:, None]  # [HEADS_P, HEAD_DIM]
    hh = tl.arange(0, HEADS_P)[:, None]
    dd = tl.arange(0, HEAD_DIM)[None, :]
    tl.store(out_ptr + (b * KV_HEADS * GROUP + hh) * HEAD_DIM + dd,
             out.to(out_ptr.dtype.element_ty), mask=hh < KV_HEADS * GROUP)  # fmt: skip


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _rmsnorm[(x.shape[0],)](x, w, out, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def _split_len(bucket: int, device: torch.device) -> int:
    """Slots per attention split: on a GPU CONFIG["splits"] splits per sequence and kv head at
    the bucket's longest context (at least 64 slots each); in the interpreter 32, so tiny traces
    split too."""
    return 32 if device.type != "cuda" else max(64, bucket // CONFIG["splits"])


def _bucket(state) -> int:
    longest = max(state.host_lengths) + 1
    return min(max(64, triton.next_power_of_2(longest)), state.config.max_seq)


def _eager(state, tokens: torch.Tensor, bucket: int) -> torch.Tensor:
    c, w, cache = state.config, state.weights, state.kv_cache
    batch, hd, group = c.batch, c.head_dim, c.heads // c.kv_heads
    split_len = _split_len(bucket, cache.device)
    splits = triton.cdiv(bucket, split_len)
    group_p = max(2, triton.next_power_of_2(group))
    rows_p = triton.next_power_of_2(c.heads + 2 * c.kv_heads)
    f32 = dict(dtype=torch.float32, device=cache.device)
    m = torch.empty(batch, c.kv_heads, splits, group_p, **f32)
    s = torch.empty_like(m)
    acc = torch.empty(batch, c.kv_heads, splits, group_p, hd, **f32)
    q = torch.empty(batch, c.heads, hd, dtype=cache.dtype, device=cache.device)
    attn = torch.empty_like(q)
    x = w["embed"][tokens]
    for layer in range(c.layers):
        qkv = F.linear(_norm(x, w["attn_norm"][layer], c.eps), w["wqkv"][layer])
        keys, values = cache[layer, 0], cache[layer, 1]
        _rope_append[(batch,)](
            qkv, q, keys, values, state.lengths, state.rope_cos, state.rope_sin, c.max_seq,
            HEADS=c.heads, KV_HEADS=c.kv_heads, ROWS_P=rows_p, HALF=hd // 2)  # fmt: skip
        _attend[(batch, c.kv_heads, splits)](
            q, keys, values, state.lengths, m, s, acc, c.max_seq, split_len, 1.0 / math.sqrt(hd),
            KV_HEADS=c.kv_heads, GROUP=group, GROUP_P=group_p, HEAD_DIM=hd, BLOCK_N=CONFIG["block_n"],
            num_warps=CONFIG["num_warps"])  # fmt: skip
        _combine[(batch,)](
            m, s, acc, attn, splits, KV_HEADS=c.kv_heads, GROUP=group, GROUP_P=group_p,
            HEAD_DIM=hd, HEADS_P=triton.next_power_of_2(c.heads),
            SPLITS_P=max(2, triton.next_power_of_2(splits)))  # fmt: skip
        x = x + F.linear(attn.view(batch, c.heads * hd), w["wo"][layer])
        gate_up = F.linear(_norm(x, w["mlp_norm"][layer], c.eps), w["w_gate_up"][layer])
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["w_down"][layer])
    return F.linear(_norm(x, w["final_norm"], c.eps), w["lm_head"])


def _addresses(state) -> tuple[int, ...]:
    tensors = [state.kv_cache, state.lengths, state.rope_cos, state.rope_sin]
    return tuple(t.data_ptr() for t in [*tensors, *state.weights.values()])


@torch.no_grad()
def step(state, tokens: torch.Tensor) -> torch.Tensor:
    bucket = _bucket(state)
    if tokens.device.type != "cuda" or state.scratch.get("recording"):
        # The guarded verify records a step with a fresh scratch marked "recording" (graph
        # capture is off then): the eager work is what it replays, captured in its own graph.
        return _eager(state, tokens, bucket)
    graphs = state.scratch.setdefault("graphs", {})
    key = (bucket, _addresses(state))
    if key not in graphs:
        # This step's answer, run eagerly on a side stream (compiling every kernel, setting up
        # cuBLAS) as torch.cuda.graph's documentation asks before a capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = _eager(state, tokens, bucket)
        torch.cuda.current_stream().wait_stream(side)
        static = tokens.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records only: nothing below runs now
            out = _eager(state, static, bucket)
        graphs[key] = (graph, static, out)
        return logits
    graph, static, out = graphs[key]
    static.copy_(tokens)
    graph.replay()
    return out.clone()
