"""The parts of tools/gpu/step_trace.py that the guarded step verify (step_guard.py,
step_timed.py) runs in its trusted parent, rule by rule: the buckets, the traces it draws (their
bounds, their repeats, every segment's steps in its bucket, kept sequences and new prompts), each
pass's schedule (its own tokens and prompt seeds), the State helpers (reset, the poison of stale
slots, the cache's valid slots) and the percentile its timed pass reports. The dev objective
that runs these with a candidate is tests/tasks/test_decode_step.py's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harnesslab.tools.gpu import step_trace
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
REF = load_module(TASK.root / "reference.py", "decode_step_reference_trace")
CONFIG = REF.Config(hidden=64, heads=4, kv_heads=2, layers=2, max_seq=64, batch=4, vocab=256,
                    dtype="float16")  # fmt: skip
BUCKETS = [8, 16, 32, 64]


def test_a_context_falls_in_the_first_bucket_whose_bound_holds_it() -> None:
    assert [step_trace.bucket_of(c, BUCKETS) for c in (1, 8, 9, 16, 17, 64)] == [8, 8, 16, 16,
                                                                               32, 64]  # fmt: skip
    with pytest.raises(ValueError, match="context 65 is past the last bucket 64"):
        step_trace.bucket_of(65, BUCKETS)


def test_every_third_step_of_the_whole_trace_repeats_the_previous_ones_tokens() -> None:
    import random

    rng = random.Random(3)
    first = step_trace._tokens(rng, 4, 5, 7, [])
    assert len(first) == 4 and all(len(t) == 5 for t in first)
    assert first[2] == first[1] and first[2] is not first[1]
    assert first[0] != first[1] and first[3] != first[2]
    assert {x for t in first for x in t} <= set(range(7)) and len({x for t in first for x in t}) > 3
    more = step_trace._tokens(rng, 3, 5, 7, first)  # steps 4, 5, 6 of the trace: 5 repeats 4
    assert len(more) == 3 and more[1] == more[0] and more[2] != more[1]
    assert step_trace._tokens(rng, 0, 5, 7, first) == []


def test_a_fixed_trace_gives_every_sequence_its_prompt_and_fits_max_seq() -> None:
    t = step_trace.fixed_trace(CONFIG, length=60, steps=4, seed=9)  # 60 + 4 = max_seq: fits
    assert t["name"] == "fixed_60x4" and t["kind"] == "fixed" and t["seed"] == 9
    assert t["buckets"] == [64]
    (seg,) = t["segments"]
    assert seg["lengths"] == [60] * 4 and len(seg["tokens"]) == 4
    assert len(set(seg["prompt_seeds"])) == 4 and all(0 <= s < 1 << 31 for s in seg["prompt_seeds"])
    assert step_trace.fixed_trace(CONFIG, length=60, steps=4, seed=9) == t  # seeded
    assert step_trace.fixed_trace(CONFIG, length=60, steps=4, seed=10) != t
    given = [32, 64]
    assert (
        step_trace.fixed_trace(CONFIG, length=3, steps=4, seed=9, buckets=given)["buckets"] == given
    )
    with pytest.raises(ValueError, match="length 61 \\+ steps 4 is past max_seq 64"):
        step_trace.fixed_trace(CONFIG, length=61, steps=4, seed=9)


def dynamic(seed: int = 11, steps: int = 4, per: int = 3, buckets=None, batch: int = 8):
    config = dataclasses.replace(CONFIG, batch=batch)
    return step_trace.dynamic_trace(config, buckets=buckets or BUCKETS, steps_per_segment=steps,
                                    segments_per_bucket=per, seed=seed)  # fmt: skip


def test_each_dynamic_segment_stays_in_its_bucket_and_one_sequence_reaches_past_its_floor() -> None:
    orders = set()
    for seed in range(6):
        t = dynamic(seed)
        assert t["name"] == "dynamic_12x4" and t["kind"] == "dynamic" and t["seed"] == seed
        assert t["buckets"] == BUCKETS and t["buckets"] is not BUCKETS
        assert len(t["segments"]) == 12
        floors = dict(zip(BUCKETS, [0, *BUCKETS[:-1]], strict=True))
        seen = []
        for seg, ctx in zip(t["segments"], _contexts(t, 8), strict=True):
            (bucket,) = {step_trace.bucket_of(c, BUCKETS) for c in ctx}  # one bucket a segment
            assert ctx[0] > floors[bucket]  # the anchor's prompt is at least the bucket's floor
            seen.append(bucket)
            assert len(seg["tokens"]) == 4
            assert [s is None for s in seg["prompt_seeds"]] == [n is None for n in seg["lengths"]]
        assert sorted(seen) == sorted(BUCKETS * 3)  # each bucket segments_per_bucket times
        orders.add(tuple(seen))
    assert len(orders) > 1  # a seeded order of the buckets
    assert dynamic(4) == dynamic(4) and dynamic(4) != dynamic(5)


def _contexts(trace, batch: int) -> list[list[int]]:
    lengths: list[int] = [0] * batch
    out: list[list[int]] = []
    for seg in trace["segments"]:
        lengths = [
            n if new is None else new for n, new in zip(lengths, seg["lengths"], strict=True)
        ]
        out.append([])
        for _ in seg["tokens"]:
            out[-1].append(max(lengths) + 1)
            lengths = [n + 1 for n in lengths]
    return out


def test_a_later_segment_keeps_about_half_of_the_sequences_that_still_fit() -> None:
    """The first segment prompts every sequence; later ones keep some sequences that fit their
    bucket (None) and prompt the others anew, each prompt leaving room for the segment."""
    kept = replaced = brim = zeros = most_kept = low = 0
    for seed in range(8):
        t = dynamic(seed)
        assert None not in t["segments"][0]["lengths"]
        lengths = [0] * 8
        for seg, ctx in zip(t["segments"], _contexts(t, 8), strict=True):
            hi = step_trace.bucket_of(ctx[0], BUCKETS)
            fit = 0  # sequences that would have fit but got a new prompt (one may be the anchor)
            for b, new in enumerate(seg["lengths"]):
                if new is None:
                    assert lengths[b] + 4 <= hi
                    kept += 1
                    brim += lengths[b] + 4 == hi  # one that just fits may stay
                else:
                    assert 0 <= new <= hi - 4
                    fit += lengths[b] + 4 <= hi and seg is not t["segments"][0]
            replaced += max(0, fit - 1)
            zeros = max(zeros, seg["lengths"].count(0))  # two: one is not the anchor's
            most_kept = max(most_kept, seg["lengths"].count(None))
            lo = [0, *BUCKETS][BUCKETS.index(hi)]
            if lo:  # new prompts under the bucket's floor (the anchor alone reaches past it)
                low = max(low, sum(n is not None and n < lo for n in seg["lengths"]))
            assert all(0 <= x < 1 << 31 for x in seg["prompt_seeds"] if x is not None)
            lengths = [(n if new is None else new) + 4 for n, new in zip(lengths, seg["lengths"],
                                                                     strict=True)]  # fmt: skip
    assert kept > 20 and replaced > 20  # both, about as often
    assert brim > 0 and zeros >= 2  # new prompts from 0 tokens up
    assert most_kept >= 2 and low >= 2  # any sequence but the anchor may stay, or start short


def test_a_dynamic_trace_refuses_buckets_it_cannot_fill() -> None:
    for buckets in ([16, 8], [8, 8, 16], [8, 65]):
        with pytest.raises(ValueError, match="must ascend up to max_seq 64"):
            dynamic(buckets=buckets)
    with pytest.raises(ValueError, match="at least 4 steps wide"):
        dynamic(buckets=[8, 11])
    with pytest.raises(ValueError, match="at least 4 steps wide"):
        dynamic(buckets=[3, 8])
    ok = dynamic(buckets=[4, 8, 64], per=1)  # as wide as a segment, up to max_seq: fine
    assert [len(s["tokens"]) for s in ok["segments"]] == [4, 4, 4]


def test_a_passes_schedule_shifts_the_tokens_and_prompt_seeds_by_its_variant() -> None:
    t = dynamic(2, per=1)
    for variant in (0, 1, 3):
        steps = list(step_trace.schedule(t, variant, 256))
        assert len(steps) == 16
        at = 0
        for seg in t["segments"]:
            prompts = [(b, n, s + variant * 1_000_003) for b, (n, s) in
                       enumerate(zip(seg["lengths"], seg["prompt_seeds"], strict=True)) if n is not None]  # fmt: skip
            assert steps[at][0] == prompts and all(p == [] for p, _ in steps[at + 1 : at + 4])
            for i, toks in enumerate(seg["tokens"]):
                assert steps[at + i][1] == [(x + variant * 7919) % 256 for x in toks]
            at += 4
    small = list(step_trace.schedule(t, 1, 7))
    assert all(0 <= x < 7 for _, toks in small for x in toks)


def test_reset_empties_a_state_in_place() -> None:
    state = REF.new_state(CONFIG, seed=1)
    cache, lengths = state.kv_cache, state.lengths
    for b in range(4):
        REF.prefill(state, b, 5 + b, seed=b)
    step_trace.reset_state(state)
    assert state.kv_cache is cache and state.lengths is lengths
    assert not cache.any() and not lengths.any() and state.host_lengths == [0, 0, 0, 0]


def test_poison_marks_every_slot_past_each_length_and_only_those() -> None:
    state = REF.new_state(CONFIG, seed=1)
    state.kv_cache.copy_(torch.randn(state.kv_cache.shape))  # what earlier steps left
    for b, n in enumerate([0, 5, 63, 20]):
        REF.prefill(state, b, n, seed=b)
    before = state.kv_cache.clone()
    step_trace.poison_stale(torch, state, [0, 5, 63, 20])
    cache = state.kv_cache
    for b, n in enumerate([0, 5, 63, 20]):
        assert bool((cache[:, 0, b, :, n:] == 0).all()), b  # keys 0
        assert bool((cache[:, 1, b, :, n:] == step_trace.POISON).all()), b  # values poisoned
        assert torch.equal(cache[:, :, b, :, :n], before[:, :, b, :, :n]), b  # context kept


def test_the_valid_slots_are_each_sequences_context_in_order() -> None:
    state = REF.new_state(CONFIG, seed=1)
    state.kv_cache.copy_(torch.randn(state.kv_cache.shape))
    got = step_trace.valid_slots(torch, state.kv_cache, [2, 0, 3, 1])
    assert got.shape == (6, 2, 2, 2, 16)  # [slots, layers, 2, kv_heads, head_dim]
    want = [state.kv_cache[:, :, b, :, s] for b, n in enumerate([2, 0, 3, 1]) for s in range(n)]
    assert torch.equal(got, torch.stack(want))


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert step_trace.percentile(xs, 50) == 2.5
    assert step_trace.percentile(xs, 0) == 1.0 and step_trace.percentile(xs, 100) == 4.0
    assert step_trace.percentile(xs, 95) == pytest.approx(3.85)
    assert step_trace.percentile([7.0], 95) == 7.0
    assert xs == [4.0, 1.0, 3.0, 2.0]  # the caller's list is left as it was


def test_build_makes_the_trace_a_task_toml_entry_names() -> None:
    fixed = {"kind": "fixed", "length": 10, "steps": 3, "seed": 4}
    assert step_trace.build(CONFIG, fixed) == step_trace.fixed_trace(CONFIG, length=10, steps=3,
                                                                     seed=4)  # fmt: skip
    assert step_trace.build(CONFIG, {**fixed, "buckets": [16, 64]})["buckets"] == [16, 64]
    assert step_trace.build(CONFIG, {**fixed, "buckets": []})["buckets"] == [64]
    params = {"kind": "dynamic", "buckets": [8, 64], "seed": 2, "steps_per_segment": 3,
              "segments_per_bucket": 2}  # fmt: skip
    assert step_trace.build(CONFIG, params) == step_trace.dynamic_trace(
        CONFIG, buckets=[8, 64], seed=2, steps_per_segment=3, segments_per_bucket=2
    )
