"""The step probes' rules (tools/gpu/step_probe.py) on the host, with decode_step's reference and
eager baseline at the interpreter's sizes: which contexts each probe's trace reaches, that the
edits reach both states (so the reference answers the same inputs), that the worst error over
the steps is what comes back, that the honest baseline passes every probe with room, and that
a step whose RMSNorm squares in fp16 fails the large-embedding probe in fp16 alone. Then the
step profile's rules (tools/gpu/step_profile.py): per-step shares biggest first, the profiled
steps checked, the reference's operators kept out of the breakdown."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from harnesslab.tools.gpu import step_probe, step_profile
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
BASELINE = (TASK.workspace_template / "kernel.py").read_text()


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


REF = _load(TASK.reference_path, "_step_probe_ref")


def _step(tmp_path, source: str = BASELINE):
    path = tmp_path / "kernel.py"
    path.write_text(source)
    return _load(path, f"_cand_{abs(hash(source))}").step


def _run(step, **req):
    request = {"step": TASK.step.request(), "seed": 3,
               "tolerances": {k: v.model_dump() for k, v in TASK.tolerances.items()}, **req}  # fmt: skip
    events: list[dict] = []
    out = step_probe.run(torch, REF, step, request, interpret=True, device="cpu",
                         emit=events.append)  # fmt: skip
    assert [e["probe"] for e in events] == [r["probe"] for r in out["probes"]]
    return out


def test_each_probe_trace_reaches_its_contexts():
    config = REF.Config(**TASK.step.request()["interpreter"], dtype="float16")
    steps = step_probe.STEPS["interpreter"]
    longest = step_probe.trace_of("long_context", config, steps, seed=1)["segments"][0]
    assert longest["lengths"] == [config.max_seq - steps] * config.batch  # the last step: max_seq
    ragged = step_probe.trace_of("ragged_contexts", config, steps, seed=1)["segments"][0]
    assert ragged["lengths"] == [0, config.max_seq - steps, 1, config.max_seq // 2]
    assert len(longest["tokens"]) == steps


def test_the_edits_reach_the_candidates_state_and_the_references_alike():
    config = REF.Config(**TASK.step.request()["interpreter"], dtype="float16")
    plain = REF.new_state(config, seed=5)
    edited = step_probe.Edited(REF, embed=256.0, values=1024.0)
    states = [edited.new_state(config, seed=5) for _ in range(2)]
    for s in states:
        edited.prefill(s, 1, 10, seed=9)
    REF.prefill(plain, 1, 10, seed=9)
    for s in states:
        assert torch.equal(s.weights["embed"], plain.weights["embed"] * 256)
        assert torch.equal(s.kv_cache[:, 0], plain.kv_cache[:, 0])  # keys as drawn
        assert torch.equal(s.kv_cache[:, 1], plain.kv_cache[:, 1] * 1024)
        assert s.host_lengths == plain.host_lengths
    assert edited.reference_step is REF.reference_step  # everything else is the reference's


def test_worst_keeps_the_largest_error_over_the_steps_and_its_tolerance_ratio():
    worst = step_probe.Worst(torch, {"atol": 0.1, "rtol": 0.0})
    want = torch.zeros(2, 3)
    worst(0, torch.full((2, 3), 0.05, dtype=torch.float16), want)
    worst(1, torch.tensor([[0.0, 0.3, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float16), want)
    worst(2, torch.full((2, 3), 0.02, dtype=torch.float16), want)
    worst(3, "not a tensor", want)  # the comparison's own failure reports that one
    assert worst.step == 1
    assert worst.stats["max_abs_err"] == pytest.approx(0.3, rel=1e-3)
    assert worst.stats["tolerance_ratio"] == pytest.approx(3.0, rel=1e-3)
    assert worst.stats["nan"] == worst.stats["inf"] == 0


def test_the_eager_baseline_passes_every_probe_with_room(tmp_path):
    out = _run(_step(tmp_path))
    assert out["status"] == "passed"
    rows = {(r["probe"], r["dtype"]): r for r in out["probes"]}
    assert set(rows) == {(p, d) for p in step_probe.NAMES for d in ("float16", "bfloat16")}
    for r in rows.values():
        assert r["passed"] and r["reason"] == "" and 0 < r["tolerance_ratio"] < 0.5, r
        assert r["shape"] == [4, 256] and r["steps"] == step_probe.STEPS["interpreter"]
    assert rows["long_context", "float16"]["context"] == 64  # the interpreter's max_seq


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
    assert longest["passed"]


# -- the step profile (tools/gpu/step_profile.py) ----------------------------------------------


class _Event:
    def __init__(self, key: str, count: int, cpu_us: float) -> None:
        self.key, self.count, self.self_cpu_time_total = key, count, cpu_us
        self.device_type, self.self_device_time_total = torch.autograd.DeviceType.CPU, 0.0


def test_the_profile_adds_steps_and_reports_per_step_shares_biggest_first():
    totals: dict[str, list[float]] = {}
    step_profile.add(torch, [_Event("mm", 3, 30.0), _Event("idle", 1, 0.0)], False, totals)
    step_profile.add(torch, [_Event("mm", 3, 30.0), _Event("softmax", 2, 40.0)], False, totals)
    rows, total = step_profile.rows(totals, repeats=2)
    assert total == pytest.approx(50.0)  # (30 + 30 + 40) us over 2 steps
    assert [r["kernel"] for r in rows] == ["mm", "softmax"]  # no-time events dropped
    assert rows[0]["launches"] == 3 and rows[0]["total_us"] == pytest.approx(30.0)
    assert rows[0]["share_pct"] == pytest.approx(60.0) and rows[1]["share_pct"] == pytest.approx(
        40.0
    )


def test_the_profile_of_the_eager_step_checks_the_profiled_steps_and_leaves_the_reference_out(
    tmp_path,
):
    request = {"step": TASK.step.request(["fixed_fp16"]), "repeats": 2, "seed": 1,
               "tolerances": {k: v.model_dump() for k, v in TASK.tolerances.items()}}  # fmt: skip
    out = step_profile.profile(torch, REF, _step(tmp_path), request, interpret=True, device="cpu")
    assert out["status"] == "passed" and out["meaningful"] is False, out
    assert out["trace"] == "fixed_fp16" and out["steps_profiled"] == 2
    assert out["context"] == 20 + 6  # the interpreter's fixed trace: prompt 20, 6 steps
    names = [k["kernel"] for k in out["kernels"]]
    assert "aten::_softmax" not in names and "aten::bmm" not in names  # the reference's ops
    assert any("scaled_dot_product" in n for n in names)  # the eager step's attention
    assert sum(k["share_pct"] for k in out["kernels"]) <= 100.0 + 1e-6
    wrong = BASELINE.replace("<= pos[:, None])", "<= pos[:, None] + 1)")
    out = step_profile.profile(torch, REF, _step(tmp_path, wrong), request, interpret=True,
                               device="cpu")  # fmt: skip
    assert out["status"] == "failed" and out["reason"].startswith("logits at step 0")
