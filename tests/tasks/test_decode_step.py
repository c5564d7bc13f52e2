"""decode_step groundwork (issue 32; no task.toml yet): the reference's interface, the eager
baseline against it over a dynamic trace, the trace objective's per-bucket table, and the cheat
classes of a decode step caught by its correctness check. Each cheat is a flaw switched on in
_step, a compact Llama step that passes with no flaw (its honest twin). CPU, the tiny Config:
2 layers, hidden 64, fp16 (the tolerance a GPU candidate gets)."""

from __future__ import annotations

import dataclasses
import functools
import math
from importlib import resources
from pathlib import Path

import pytest
import torch

from harnesslab.tools.gpu import step_trace
from harnesslab.tools.gpu.runner import load_module

TASK = Path(str(resources.files("harnesslab.tasks"))) / "decode_step"


REF = load_module(TASK / "reference.py", "decode_step_reference")
EAGER = load_module(TASK / "workspace" / "kernel.py", "decode_step_eager")
CONFIG = REF.Config(hidden=64, heads=4, kv_heads=2, layers=2, max_seq=64, batch=4, vocab=256,
                    dtype="float16")  # fmt: skip
BUCKETS = [8, 16, 32, 64]
TRACE = step_trace.dynamic_trace(CONFIG, buckets=BUCKETS, steps_per_segment=3,
                                 segments_per_bucket=2, seed=5)  # fmt: skip


def _step(state, tokens, *, skip_layer_below: int = 0, overread: int = 0, store: bool = True):
    """A decode step in the state's dtype, flawed on request: skip the last layer while every
    context is shorter than skip_layer_below, attend to `overread` slots past the length, or
    keep this token's keys and values out of the cache (attending to them from a copy)."""
    c, w = state.config, state.weights
    cache = state.kv_cache if store else state.kv_cache.clone()
    pos, rows = state.lengths.long(), torch.arange(c.batch)
    cos, sin, hd, group = (
        state.rope_cos[pos],
        state.rope_sin[pos],
        c.head_dim,
        c.heads // c.kv_heads,
    )
    visible = torch.arange(c.max_seq)[None, :] <= pos[:, None] + overread

    def norm(x, weight):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + c.eps)).to(x.dtype) * weight

    layers = c.layers - (max(state.host_lengths) + 1 < skip_layer_below)
    x = w["embed"][tokens]
    for layer in range(layers):
        q, k, v = (norm(x, w["attn_norm"][layer]) @ w["wqkv"][layer].T).split(
            (c.heads * hd, c.kv_heads * hd, c.kv_heads * hd), -1)  # fmt: skip
        q = REF.rotate(q.view(c.batch, c.heads, hd), cos, sin).to(x.dtype)
        cache[layer, 0, rows, :, pos] = REF.rotate(k.view(c.batch, c.kv_heads, hd), cos, sin).to(
            x.dtype
        )
        cache[layer, 1, rows, :, pos] = v.view(c.batch, c.kv_heads, hd)
        keys, values = cache[layer, 0].float(), cache[layer, 1].float()
        scores = torch.einsum(
            "bkgd,bksd->bkgs", q.view(c.batch, c.kv_heads, group, hd).float(), keys
        )
        scores = (scores / math.sqrt(hd)).masked_fill(~visible[:, None, None, :], float("-inf"))
        attn = torch.einsum("bkgs,bksd->bkgd", scores.softmax(-1), values).to(x.dtype)
        x = x + attn.reshape(c.batch, -1) @ w["wo"][layer].T
        gate, up = (norm(x, w["mlp_norm"][layer]) @ w["w_gate_up"][layer].T).chunk(2, -1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w["w_down"][layer].T
    return norm(x, w["final_norm"]) @ w["lm_head"].T


def _logits_cache():
    """Caches logits across steps, keyed on the tokens (the KV cache still updated)."""
    seen: dict[tuple[int, ...], torch.Tensor] = {}

    def step(state, tokens):
        return seen.setdefault(tuple(tokens.tolist()), _step(state, tokens))

    return step


def _earlier_pass():
    """Answers every pass after the first with the first pass's logits, step by step."""
    first: list[torch.Tensor] = []

    def step(state, tokens):
        if len(first) < TRACE_STEPS:
            first.append(_step(state, tokens))
            return first[-1]
        _step(state, tokens)
        first.append(first[len(first) % TRACE_STEPS])
        return first[-1]

    return step


def _late_kv_write(state, tokens):
    """Writes each step's keys and values one step late (attending to them from a copy): every
    step's logits are right, the cache after the trace lacks the last step."""
    rows, cache = torch.arange(CONFIG.batch), state.kv_cache
    if "pending" in state.scratch:
        pos, kv = state.scratch.pop("pending")
        cache[:, :, rows, :, pos] = kv
    pos = state.lengths.long().clone()
    state.kv_cache = cache.clone()
    try:
        out = _step(state, tokens)
        state.scratch["pending"] = (pos, state.kv_cache[:, :, rows, :, pos].clone())
    finally:
        state.kv_cache = cache
    return out


def _advances_lengths(state, tokens):
    out = _step(state, tokens)
    state.lengths += 1
    return out


def _rewrites_tokens(state, tokens):
    """Rewrites its tokens in place to token 0 and answers for those."""
    tokens.zero_()
    return _step(state, tokens)


TRACE_STEPS = sum(len(s["tokens"]) for s in TRACE["segments"])
FIXED = step_trace.fixed_trace(CONFIG, length=10, steps=6, seed=2, buckets=BUCKETS)
LONG = step_trace.fixed_trace(CONFIG, length=56, steps=4, seed=3, buckets=BUCKETS)
# name -> (the cheat's factory, the check that must catch it first, the trace)
CHEATS = {
    "caches_logits_across_steps": (_logits_cache, "logits", TRACE),
    "replays_an_earlier_pass": (_earlier_pass, "logits", TRACE),
    "skips_a_layer_on_short_contexts": (
        lambda: lambda s, t: _step(s, t, skip_layer_below=16),
        "logits",
        TRACE,
    ),
    "reads_one_slot_past_the_length": (
        lambda: lambda s, t: _step(s, t, overread=1),
        "logits",
        TRACE,
    ),
    # One stale slot among 57: it takes ~2% of the attention, so only a poisoned value shows.
    "reads_one_slot_past_a_long_context": (
        lambda: lambda s, t: _step(s, t, overread=1),
        "logits",
        LONG,
    ),
    "drops_the_kv_cache_update": (lambda: lambda s, t: _step(s, t, store=False), "logits", TRACE),
    "writes_the_kv_cache_one_step_late": (lambda: _late_kv_write, "kv_cache", FIXED),
    "rewrites_the_tokens_in_place": (lambda: _rewrites_tokens, "logits", TRACE),
    "advances_the_lengths_itself": (lambda: _advances_lengths, "lengths", TRACE),
}


def _run(step, trace=TRACE, config=CONFIG):
    return step_trace.run_trace(torch, REF, step, config, trace, device="cpu")


@functools.cache
def _eager():
    return _run(EAGER.step)


def test_the_eager_baseline_matches_the_reference_over_a_dynamic_trace():
    result = _eager()
    assert result["correct"], result["failures"]
    assert result["meaningful"] is False and result["steps"] == TRACE_STEPS == 24


@pytest.mark.parametrize("trace", [TRACE, FIXED], ids=["dynamic", "fixed"])
def test_the_honest_twin_of_the_cheats_passes(trace):
    assert _run(_step, trace)["correct"]


@pytest.mark.parametrize("name", CHEATS)
def test_a_decode_step_cheat_fails_the_check(name: str):
    make, what, trace = CHEATS[name]
    result = _run(make(), trace)
    assert not result["correct"]
    assert result["failures"][0]["what"] == what, result["failures"]


def test_the_latency_table_has_every_bucket_and_every_step():
    result = _eager()
    assert [row["bucket"] for row in result["buckets"]] == BUCKETS
    assert sum(row["steps"] for row in result["buckets"]) == result["total"]["steps"] == TRACE_STEPS
    for row in [*result["buckets"], result["total"]]:
        assert 0 < row["p50_us"] <= row["p95_us"] <= row["p99_us"]
        assert row["tokens_per_s"] > 0 and row["launch_overhead_us"] is None  # no device pass


def test_every_step_of_a_dynamic_segment_falls_in_its_bucket_and_tokens_repeat():
    config = dataclasses.replace(CONFIG, batch=8)
    trace = step_trace.dynamic_trace(config, buckets=BUCKETS, steps_per_segment=4,
                                     segments_per_bucket=3, seed=11)  # fmt: skip
    lengths = [0] * config.batch
    seen, steps = set(), []
    for segment in trace["segments"]:
        lengths = [
            n if fresh is None else fresh
            for n, fresh in zip(lengths, segment["lengths"], strict=True)
        ]
        buckets = set()
        for tokens in segment["tokens"]:
            buckets.add(step_trace.bucket_of(max(lengths) + 1, BUCKETS))
            lengths = [n + 1 for n in lengths]
            steps.append(tokens)
        assert len(buckets) == 1
        seen |= buckets
    assert seen == set(BUCKETS)
    assert all(steps[i] == steps[i - 1] for i in range(2, len(steps), 3))
    fixed = step_trace.fixed_trace(config, length=20, steps=6, seed=1, buckets=BUCKETS)
    assert fixed["segments"][0]["lengths"] == [20] * 8


def test_the_check_pass_poisons_every_slot_past_the_length():
    state = REF.new_state(CONFIG)
    REF.prefill(state, 1, 5, seed=3)
    step_trace.poison_stale(torch, state, state.host_lengths)
    values = state.kv_cache[:, 1, 1].float()
    assert bool((values[:, :, 5:] == step_trace.POISON).all()) and not bool(
        (values[:, :, :5] == step_trace.POISON).any()
    )
    assert bool((state.kv_cache[:, 1, 0] == step_trace.POISON).all())  # length 0: all stale


def test_a_prompt_written_into_two_states_is_drawn_once_and_neither_state_aliases_it(
    monkeypatch,
):
    """The harness prefills the candidate's State and the truth's with the same prompt one
    after the other: one draw serves both, each State holds its own copy (a step writing into
    one changes neither the other nor the next prefill), and the values are the seed's."""
    a, b, c = REF.new_state(CONFIG), REF.new_state(CONFIG), REF.new_state(CONFIG)
    draws = []
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: draws.append(a) or randn(*a, **k))
    REF._prompt.cache_clear()
    REF.prefill(a, 2, 9, seed=11)
    REF.prefill(b, 2, 9, seed=11)
    assert len(draws) == 1
    want = torch.randn(2, 2, 2, 9, 16, generator=torch.Generator().manual_seed(11)).half()
    assert torch.equal(b.kv_cache[:, :, 2, :, :9], want)
    a.kv_cache.fill_(7.0)
    assert torch.equal(b.kv_cache[:, :, 2, :, :9], want)
    REF.prefill(c, 0, 9, seed=11)
    assert torch.equal(c.kv_cache[:, :, 0, :, :9], want) and len(draws) == 2  # `want`'s draw
    REF.prefill(c, 1, 9, seed=12)
    assert len(draws) == 3 and not torch.equal(c.kv_cache[:, :, 1, :, :9], want)


def test_reference_state_layout_and_a_step_appends_one_slot():
    state = REF.new_state(CONFIG, seed=3)
    assert state.kv_cache.shape == (2, 2, 4, 2, 64, 16) and state.kv_cache.is_contiguous()
    assert state.kv_cache.dtype == torch.float16 and state.lengths.dtype == torch.int32
    for b, n in enumerate([0, 7, 30, 62]):
        REF.prefill(state, b, n, seed=b)
    before = state.kv_cache.clone()
    logits = REF.reference_step(state, torch.tensor([1, 2, 3, 4]))
    assert logits.shape == (4, 256) and logits.dtype == torch.float32
    changed = (state.kv_cache != before).any(dim=(0, 1, 3, 5))  # [batch, max_seq]
    assert changed.nonzero().tolist() == [[0, 0], [1, 7], [2, 30], [3, 62]]
    assert state.lengths.tolist() == state.host_lengths == [0, 7, 30, 62]  # the harness advances
    REF.advance(state)
    assert state.lengths.tolist() == state.host_lengths == [1, 8, 31, 63]
