"""The step probes' rules (tools/gpu/step_probe.py) on the host, with decode_step's reference and
eager baseline at the interpreter's sizes: which probes run and what each says, which contexts
each probe's trace reaches, that each edit scales one thing by the power of two its note states
and reaches both states (so the reference answers the same inputs), that the worst error over
the steps is what comes back, that the probe checks its steps alone over weights drawn from the
request's seed under the request's tolerances and deadline, that the honest baseline passes
every probe with room (the docstring's measured 0.23), and that a step whose RMSNorm squares in
fp16 fails the large-embedding probe in fp16 alone."""

from __future__ import annotations

import math

import pytest
import torch

from harnesslab.tests.tools.gpu.step_support import recorded_deadlines
from harnesslab.tools.gpu import step_probe
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
BASELINE = (TASK.workspace_template / "kernel.py").read_text()
REF = load_module(TASK.reference_path, "_step_probe_ref")
CONFIG = REF.Config(**TASK.step.request()["interpreter"], dtype="float16")  # type: ignore[union-attr]
STEPS = step_probe.STEPS["interpreter"]


def _step(tmp_path, source: str = BASELINE):
    path = tmp_path / "kernel.py"
    path.write_text(source)
    return load_module(path, f"_cand_{abs(hash(source))}").step


def _request(**req):
    return {"step": TASK.step.request(), "seed": 3,  # type: ignore[union-attr]
            "tolerances": {k: v.model_dump() for k, v in TASK.tolerances.items()}, **req}  # fmt: skip


def _run(step, **req):
    events: list[dict] = []
    out = step_probe.run(torch, REF, step, _request(**req), interpret=True, device="cpu",
                         emit=events.append)  # fmt: skip
    assert events == [{"event": "probe", **r} for r in out["probes"]]
    return out


class _Spy:
    """The eager step, counting its calls and noting each call's embedding table."""

    def __init__(self, step) -> None:
        self.step, self.embeds = step, []

    def __call__(self, state, tokens):
        self.embeds.append(state.weights["embed"].clone())
        return self.step(state, tokens)


def test_the_probes_are_the_four_edges_each_with_its_note():
    assert step_probe.NAMES == ("long_context", "ragged_contexts", "large_embeddings",
                                "large_values")  # fmt: skip
    assert all(len(step_probe.NOTES[n]) > 40 for n in step_probe.NAMES)


def _shown(scale: float) -> str:
    power = int(math.log2(scale))
    return str(int(scale)) if power < 16 else f"2^{power}"


def test_each_edit_scales_one_thing_by_a_power_of_two_its_note_states():
    assert set(step_probe.EDITS) == {"large_embeddings", "large_values"}
    for name, per_dtype in step_probe.EDITS.items():
        assert set(per_dtype) == set(TASK.tolerances) == {"float16", "bfloat16"}
        for scales in per_dtype.values():
            (scale,) = [s for s in scales if s != 1.0]  # the other one is left as drawn
            assert math.frexp(scale)[0] == 0.5, scale  # exact in every dtype
            assert _shown(scale) in step_probe.NOTES[name], (name, scale)
    assert step_probe.EDITS["large_embeddings"]["float16"][1] == 1.0  # the table, not the values
    assert step_probe.EDITS["large_values"]["float16"][0] == 1.0


def test_the_embedding_scales_reach_the_range_each_dtype_must_survive():
    """fp16: the scaled table fits fp16 but its squares do not (RMSNorm must square in fp32);
    bf16: the scaled table is past fp16's range (nothing may cast the residual to fp16) while
    its squares stay finite in fp32."""
    top = REF.new_state(CONFIG, seed=0).weights["embed"].abs().max().item()
    fp16, bf16 = (step_probe.EDITS["large_embeddings"][d][0] for d in ("float16", "bfloat16"))
    fp16_max = torch.finfo(torch.float16).max
    assert top * fp16 < fp16_max < (top * fp16) ** 2
    assert fp16_max < top * bf16 and (top * bf16) ** 2 < torch.finfo(torch.float32).max


def test_the_edits_reach_the_candidates_state_and_the_references_alike():
    plain = REF.new_state(CONFIG, seed=5)
    edited = step_probe.Edited(REF, embed=256.0, values=1024.0)
    states = [edited.new_state(CONFIG, seed=5) for _ in range(2)]
    for s in states:
        edited.prefill(s, 1, 10, seed=9)
    REF.prefill(plain, 1, 10, seed=9)
    for s in states:
        assert torch.equal(s.weights["embed"], plain.weights["embed"] * 256)
        assert torch.equal(s.kv_cache[:, 0], plain.kv_cache[:, 0])  # keys as drawn
        assert torch.equal(s.kv_cache[:, 1], plain.kv_cache[:, 1] * 1024)
        assert s.host_lengths == plain.host_lengths
    assert edited.reference_step is REF.reference_step  # everything else is the reference's


def test_edited_with_no_scales_is_the_reference():
    plain, same = REF.new_state(CONFIG, seed=5), step_probe.Edited(REF).new_state(CONFIG, seed=5)
    REF.prefill(plain, 2, 12, seed=4)
    step_probe.Edited(REF).prefill(same, 2, 12, seed=4)
    assert torch.equal(plain.weights["embed"], same.weights["embed"])
    assert torch.equal(plain.kv_cache, same.kv_cache)


def test_each_probe_trace_reaches_its_contexts():
    longest = step_probe.trace_of("long_context", CONFIG, STEPS, seed=1)["segments"][0]
    assert longest["lengths"] == [CONFIG.max_seq - STEPS] * CONFIG.batch  # the last step: max_seq
    ragged = step_probe.trace_of("ragged_contexts", CONFIG, STEPS, seed=1)["segments"][0]
    assert ragged["lengths"] == [0, CONFIG.max_seq - STEPS, 1, CONFIG.max_seq // 2]
    assert len(longest["tokens"]) == STEPS
    for name in ("large_embeddings", "large_values"):  # half the cache
        trace = step_probe.trace_of(name, CONFIG, STEPS, seed=1)
        assert trace["segments"][0]["lengths"] == [32] * CONFIG.batch and trace["name"] == name
    wide = REF.Config(**{**TASK.step.request()["interpreter"], "batch": 8}, dtype="float16")  # type: ignore[union-attr]
    ragged = step_probe.trace_of("ragged_contexts", wide, STEPS, seed=1)["segments"][0]
    assert ragged["lengths"] == [0, 60, 1, 32] * 2  # the pattern repeats over a wider batch


def test_worst_keeps_the_largest_error_over_the_steps_and_its_tolerance_ratio():
    worst = step_probe.Worst(torch, {"atol": 0.1, "rtol": 0.0})
    assert worst.step is None and worst.stats["tolerance_ratio"] is None
    want = torch.zeros(2, 3)
    worst(0, torch.full((2, 3), 0.05, dtype=torch.float16), want)
    worst(1, torch.tensor([[0.0, 0.3, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float16), want)
    worst(2, torch.full((2, 3), 0.02, dtype=torch.float16), want)
    worst(3, "not a tensor", want)  # the comparison's own failure reports that one
    worst(4, torch.full((3,), 9.0), want)  # nor a wrong shape (broadcast, it would count)
    assert worst.step == 1
    assert worst.stats["max_abs_err"] == pytest.approx(0.3, rel=1e-3)
    assert worst.stats["tolerance_ratio"] == pytest.approx(3.0, rel=1e-3)
    assert worst.stats["nan"] == worst.stats["inf"] == 0


def test_worst_relative_error_is_against_the_reference_floored_at_atol_and_kept_at_its_max():
    worst = step_probe.Worst(torch, {"atol": 0.1, "rtol": 0.0})
    worst(0, torch.tensor([2.5, -4.0]), torch.tensor([2.0, -4.0]))  # 0.5 / 2
    assert worst.stats["max_rel_err"] == pytest.approx(0.25)
    worst(1, torch.tensor([0.02, 0.0]), torch.tensor([0.0, 0.0]))  # 0.02 / atol: smaller
    assert worst.stats["max_rel_err"] == pytest.approx(0.25)
    worst(2, torch.tensor([0.05, 0.0]), torch.tensor([0.01, 0.0]))  # 0.04 / atol
    assert worst.stats["max_rel_err"] == pytest.approx(0.4)


def test_worst_counts_nan_and_inf_over_the_steps_and_measures_the_finite_rest():
    worst = step_probe.Worst(torch, {"atol": 0.1, "rtol": 0.0})
    nan, inf = float("nan"), float("inf")
    worst(0, torch.tensor([nan, inf, -inf]), torch.zeros(3))  # nothing finite to measure
    assert (worst.stats["nan"], worst.stats["inf"]) == (1, 2)
    assert worst.stats["tolerance_ratio"] is None and worst.stats["max_abs_err"] is None
    worst(1, torch.tensor([nan, 0.2, 0.0]), torch.zeros(3))
    assert (worst.stats["nan"], worst.stats["inf"]) == (2, 2)
    assert worst.stats["tolerance_ratio"] == pytest.approx(2.0) and worst.step == 1


def test_worst_names_the_first_step_that_reached_the_worst_ratio():
    worst = step_probe.Worst(torch, {"atol": 0.1, "rtol": 0.0})
    for index in (0, 1):
        worst(index, torch.tensor([0.2]), torch.zeros(1))
    assert worst.step == 0


def test_the_eager_baseline_passes_every_probe_with_room(tmp_path):
    out = _run(_step(tmp_path))
    assert out["status"] == "passed"
    rows = {(r["probe"], r["dtype"]): r for r in out["probes"]}
    assert set(rows) == {(p, d) for p in step_probe.NAMES for d in ("float16", "bfloat16")}
    for (probe, _), r in rows.items():
        assert r["passed"] and r["reason"] == "" and 0 < r["tolerance_ratio"] < 0.5, r
        assert r["shape"] == [4, 256] and r["steps"] == STEPS
        assert r["family"] == probe and r["note"] == step_probe.NOTES[probe]
    # the longest context each trace reaches: the interpreter's max_seq, or half of it + steps
    assert rows["long_context", "float16"]["context"] == 64
    assert rows["ragged_contexts", "bfloat16"]["context"] == 64
    assert rows["large_values", "float16"]["context"] == 32 + STEPS
    # the module docstring's measurement (seed 3): the baseline's worst tolerance ratio
    assert round(max(r["tolerance_ratio"] for r in rows.values()), 2) == 0.23


def test_the_request_seed_draws_the_weights_and_no_seed_is_seed_zero(tmp_path):
    runs = {}
    for seed in (None, 0, 4):
        spy = _Spy(_step(tmp_path))
        request = _request(seed=seed)
        if seed is None:
            del request["seed"]
        row = step_probe.one(torch, REF, spy, request, "long_context", "float16", interpret=True,
                             device="cpu")  # fmt: skip
        assert len(spy.embeds) == STEPS  # the check pass alone: nothing is timed
        runs[seed] = row, spy.embeds[0]
    assert runs[None][0] == runs[0][0] and torch.equal(runs[None][1], runs[0][1])
    assert not torch.equal(runs[0][1], runs[4][1])


def test_the_requests_tolerances_decide_the_verdict(tmp_path):
    tight = {"float16": {"atol": 1e-9, "rtol": 0.0}, "bfloat16": {"atol": 1e-9, "rtol": 0.0}}
    out = _run(_step(tmp_path), probes=["large_values"], dtypes=["float16"], tolerances=tight)
    (row,) = out["probes"]
    assert not row["passed"] and row["reason"].startswith("logits at step 0 of the check pass")


def test_only_the_large_probes_edit_the_states_and_by_their_scales(monkeypatch):
    made: list[tuple[str, float, float]] = []

    class Recorded(step_probe.Edited):
        def __init__(self, ref, embed=1.0, values=1.0):
            made.append((probe, embed, values))
            super().__init__(ref, embed, values)

    def refuse(state, tokens):
        raise RuntimeError("not needed")

    monkeypatch.setattr(step_probe, "Edited", Recorded)
    for probe in step_probe.NAMES:
        for dtype in ("float16", "bfloat16"):
            step_probe.run(torch, REF, refuse, _request(probes=[probe], dtypes=[dtype]),
                           interpret=True, device="cpu", emit=lambda e: None)  # fmt: skip
            edits = step_probe.EDITS.get(probe, {}).get(dtype)
            assert made.pop() == (probe, *(edits or (1.0, 1.0)))


def test_the_deadline_is_the_requests_case_timeout_or_the_runners_120_s(monkeypatch):
    seen = recorded_deadlines(monkeypatch)
    for req in ({}, {"case_timeout_s": 7}):
        out = _run(lambda s, t: None, probes=["long_context"], dtypes=["float16"], **req)
        assert not out["probes"][0]["passed"]
    assert seen == [120.0, 7.0]


def test_a_gpu_probe_runs_the_models_sizes_for_more_steps(tmp_path):
    """interpret=False: the request's "model" sizes (here the interpreter's, so the CPU can run
    them) and STEPS["gpu"] decode steps, the last at max_seq."""
    spec = TASK.step.request()  # type: ignore[union-attr]
    req = _request(step={**spec, "interpreter": {**spec["interpreter"], "max_seq": 40},
                         "model": spec["interpreter"]})  # fmt: skip
    spy = _Spy(_step(tmp_path))
    row = step_probe.one(torch, REF, spy, req, "long_context", "bfloat16", interpret=False,
                         device="cpu")  # fmt: skip
    assert row["passed"] and row["steps"] == len(spy.embeds) == 8 and row["context"] == 64


def test_a_step_squaring_in_fp16_fails_the_large_embedding_probe_in_fp16(tmp_path):
    fp16_norm = BASELINE.replace("x32 = x.float()", "x32 = x")
    assert fp16_norm != BASELINE
    out = _run(_step(tmp_path, fp16_norm), probes=["large_embeddings", "long_context"])
    failed = {(r["probe"], r["dtype"]) for r in out["probes"] if not r["passed"]}
    assert out["status"] == "failed" and failed == {("large_embeddings", "float16")}
    (bad,) = [r for r in out["probes"] if not r["passed"]]
    assert bad["reason"].startswith("logits at step 0 of the check pass")
    assert bad["tolerance_ratio"] > 10


def test_an_unknown_probe_name_fails_that_probe_alone(tmp_path):
    out = _run(_step(tmp_path), probes=["nope", "long_context"], dtypes=["float16"])
    nope, longest = out["probes"]
    assert not nope["passed"] and "unknown step probe 'nope'" in nope["reason"]
    assert nope["note"] == "" and longest["passed"]


def test_the_probe_runs_on_the_device_it_is_given(monkeypatch):
    seen = []

    def run_trace(torch_, ref, step, config, trace, **kwargs):
        seen.append(kwargs["device"])
        return {"correct": True, "steps": 8, "failures": []}

    monkeypatch.setattr(step_probe.step_trace, "run_trace", run_trace)
    row = step_probe.one(torch, REF, None, _request(), "large_values", "float16",
                         interpret=False, device="cuda")  # fmt: skip
    assert seen == ["cuda"] and row["passed"] and row["context"] == 1024 + 8
