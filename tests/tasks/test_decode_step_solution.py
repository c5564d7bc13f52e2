"""decode_step's shipped Triton solution (tasks/decode_step/solutions/triton.py) through the real
paths, on the Triton CPU interpreter's tiny decode_step (2 layers, hidden 64): copied into a fresh
workspace as kernel.py, run_step_objective passes a dynamic dev trace with a per-bucket table,
and the guarded step verify passes it on hidden traces (fixed and dynamic, fp16 and bf16). Each costs tens of seconds of interpreted
kernels on a loaded 2-core machine (~30 Triton programs a step), hence `slow`. The honest-twin
check that the tests are not vacuous: tests/tasks/test_decode_step.py's cheats fail the same
per-step check, and a solution with its attention mask widened by one slot fails here too."""

from __future__ import annotations

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_settings, make_workspace
from harnesslab.tools.evaluation import run_step_objective
from harnesslab.tools.integrity import public_verdict
from harnesslab.tools.integrity.step_verify import guarded_step_verify
from harnesslab.tools.task import load_task

SOLUTION = load_task("decode_step").solutions()["triton"]
MASK = "n = tl.load(lengths_ptr + b) + 1"  # the context bound in _attend


def _workspace(tmp_path, source: str):
    ws = make_workspace(tmp_path, "decode_step")
    (ws.root / "kernel.py").write_text(source)
    return ws


async def _objective(tmp_path, source: str, traces=None):
    ws = _workspace(tmp_path, source)
    launcher = make_launcher(tmp_path)
    try:
        with anyio.fail_after(400):
            return await run_step_objective(ws, launcher, traces=traces, seed=7)
    finally:
        await launcher.aclose()


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_the_triton_solution_ships_beside_the_baseline() -> None:
    assert set(load_task("decode_step").solutions()) == {"triton"}
    assert MASK in SOLUTION.read_text()


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_triton_solution_passes_a_dynamic_dev_trace_with_a_per_bucket_table(tmp_path):
    """One dev trace (every bucket, bf16: the loosest dtype's rounding); the guarded verify
    below runs the fixed and fp16 kinds too. All three dev traces: ~75 s here."""
    res = await _objective(tmp_path, SOLUTION.read_text(), traces=["dynamic_bf16"])
    assert res.status == "passed", res.reason
    (case,) = res.cases
    assert case.name == "dynamic_bf16" and case.passed
    assert [b.bucket for b in case.buckets] == [16, 32, 64, "all"]
    assert all(b.failed_steps == 0 and b.checked_steps == b.steps > 0 for b in case.buckets)
    assert case.median_us == case.buckets[-1].p50_us


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_triton_solution_reading_one_slot_past_the_length_fails(tmp_path):
    source = SOLUTION.read_text().replace(MASK, MASK + " + 1")
    res = await _objective(tmp_path, source, traces=["dynamic_fp16"])
    assert res.status == "failed" and res.score_us is None
    assert res.cases[0].reason.startswith("logits at step "), res.cases[0].reason


@pytest.mark.slow
def test_the_guarded_step_verify_passes_the_triton_solution(tmp_path) -> None:
    ws = _workspace(tmp_path, SOLUTION.read_text())

    async def go():
        launcher = make_launcher(tmp_path)
        try:
            with anyio.fail_after(600):
                return await guarded_step_verify(ws, launcher, make_settings(tmp_path))
        finally:
            await launcher.aclose()

    v = anyio.run(go)
    assert v.verdict == "passed", v.reasons
    assert v.certifies == "step_outputs" and all(c.passed for c in v.result.cases)
    # Where the parent's seconds went, for the operator (never in what an agent reads).
    phases = v.evidence["runner_phases_s"]
    assert set(phases) == {"start", "state", "reference", "poison", "candidate", "compare",
                           "timed"}  # fmt: skip
    assert all(t > 0 for t in phases.values()), phases
    assert sum(phases.values()) <= v.evidence["runner_wall_s"]
    assert "runner_phases_s" not in public_verdict(v)["evidence"]
