"""run_objective on a step task (decode_step, issue 32), end to end on this machine: a fresh
workspace's eager baseline through the local executor, the sandboxed runner's step mode and the
Triton interpreter's tiny sizes (2 layers, hidden 64): a passing score with a per-bucket table,
recorded like any dev run (rank_history ranks it, restore_best_checkpoint brings it back), and
candidates that cache logits across steps or read the KV cache past its length failing the
per-step check. The kernel tasks' guarded verify refuses a step task, saying what the scores
mean (its own verify is tests/tools/integrity/test_step_cheats.py's)."""

from __future__ import annotations

import pytest

from harnesslab.tests.conftest_shared import (
    ESCAPE_AT_IMPORT,
    make_launcher,
    make_settings,
    make_workspace,
)
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation import rank_history, restore_candidate, run_step_objective
from harnesslab.tools.integrity import guarded_verify
from harnesslab.tools.task import load_task

CACHES_LOGITS = """
_seen = {}


def step(state, tokens):  # logits cached across steps, keyed on the tokens
    out = _eager_step(state, tokens)
    return _seen.setdefault(tuple(tokens.tolist()), out)
"""
BASELINE_MASK = "<= pos[:, None])[:, None, None]"


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _run(tmp_path, kernel: str | None = None, traces=None):
    ws = make_workspace(tmp_path, "decode_step")
    if kernel is not None:
        (ws.root / "kernel.py").write_text(kernel)
    launcher = make_launcher(tmp_path)
    try:
        return ws, await run_step_objective(ws, launcher, traces=traces, seed=7)
    finally:
        await launcher.aclose()


@pytest.mark.anyio
async def test_the_eager_baseline_passes_every_trace_with_a_per_bucket_table(tmp_path):
    ws, res = await _run(tmp_path)
    assert res.status == "passed", res.reason
    assert res.meaningful is False and res.env.device.startswith("cpu")
    assert [c.name for c in res.cases] == ["fixed_fp16", "dynamic_fp16", "dynamic_bf16"]
    assert res.score_us == pytest.approx(sum(c.median_us for c in res.cases))
    dynamic = res.cases[1]
    assert [b.bucket for b in dynamic.buckets] == [16, 32, 64, "all"]  # the interpreter's
    for row in dynamic.buckets:
        assert row.failed_steps == 0 and row.checked_steps == row.steps > 0
        assert 0 < row.p50_us <= row.p95_us <= row.p99_us and row.tokens_per_s > 0
    assert dynamic.buckets[-1].steps == 9 and dynamic.median_us == dynamic.buckets[-1].p50_us
    # Recorded as a dev run: ranked, and the best is what restore_best_checkpoint brings back.
    assert res.record_id is not None and res.is_new_best
    page = rank_history(ws)
    assert [c.candidate for c in page.candidates] == [res.candidate] and page.case_set == "all"
    baseline = (ws.root / "kernel.py").read_text()
    (ws.root / "kernel.py").write_text("def step(state, tokens):\n    raise RuntimeError\n")
    restore_candidate(ws)
    assert (ws.root / "kernel.py").read_text() == baseline


@pytest.mark.slow  # ~4 s each on a loaded 2-core machine
@pytest.mark.anyio
@pytest.mark.parametrize("cheat", ["caches_logits_across_steps", "reads_one_slot_past_the_length"])
async def test_a_step_that_cheats_fails_the_per_step_check_and_gets_no_score(tmp_path, cheat):
    baseline = (load_task("decode_step").workspace_template / "kernel.py").read_text()
    assert BASELINE_MASK in baseline
    if cheat == "caches_logits_across_steps":
        kernel = baseline.replace("def step(", "def _eager_step(") + CACHES_LOGITS
    else:
        kernel = baseline.replace(BASELINE_MASK, "<= pos[:, None] + 1)[:, None, None]")
    _, res = await _run(tmp_path, kernel, traces=["dynamic_fp16"])
    assert res.status == "failed" and res.score_us is None
    (case,) = res.cases
    assert not case.passed and case.reason.startswith("logits at step "), case.reason
    assert sum(b.failed_steps for b in case.buckets[:-1]) == case.buckets[-1].failed_steps > 0
    assert all(b.steps == 0 and b.p50_us is None for b in case.buckets)  # nothing timed


@pytest.mark.anyio
async def test_an_unknown_trace_name_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(UsageError, match="unknown trace 'nope'") as err:
        await _run(tmp_path, traces=["nope"])
    assert "fixed_fp16, dynamic_fp16, dynamic_bf16" in err.value.next_step


@pytest.mark.anyio
async def test_the_kernel_verify_refuses_a_step_task_and_says_what_the_scores_mean(tmp_path):
    ws = make_workspace(tmp_path, "decode_step")
    launcher = make_launcher(tmp_path)
    try:
        with pytest.raises(UsageError, match="not built for step tasks") as err:
            await guarded_verify(ws, launcher, make_settings(tmp_path))
    finally:
        await launcher.aclose()
    assert "dev feedback" in str(err.value) and "hidden traces" in str(err.value)
    assert "guarded_final_verify" in err.value.next_step
    assert ws.ledger().records() == []  # nothing ran, nothing recorded


@pytest.mark.anyio
async def test_the_step_mode_runs_the_candidate_inside_the_sandbox(tmp_path):
    """The step mode imports agent code: it starts inside the sandbox like every dev mode, so a
    candidate that writes outside its folder at import leaves nothing behind."""
    outside = tmp_path / "escaped.txt"
    baseline = (load_task("decode_step").workspace_template / "kernel.py").read_text()
    _, res = await _run(tmp_path, baseline + ESCAPE_AT_IMPORT.format(outside=str(outside)),
                        traces=["fixed_fp16"])  # fmt: skip
    assert res.env.sandbox == "full", res.env
    assert not outside.exists()
    assert res.status == "passed", res.reason
