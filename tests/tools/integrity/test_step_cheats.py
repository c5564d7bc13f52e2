"""The guarded verify of a step task (tools/integrity/step_verify.py, tools/gpu/verify/step_guard.py)
against the step corpus (tools/integrity/cheats/step/: caching logits across steps, skipping
layers on short contexts, reading the KV cache past its length, stale positions, returning the
previous step's logits, a KV cache the step never writes), each with an honest twin in step/honest/ that must pass. Every file's
docstring names the verdict's reason code (`expect:`) or its twin (`twin:`). All of it runs on
the Triton CPU interpreter's tiny decode_step (2 layers, hidden 64): a verify costs ~8-17 s of
CPU on a loaded 2-core machine, so one cheat and one twin stay fast and the rest are `slow`."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tests.conftest_shared import verify_step
from harnesslab.tools.execution.launcher import RunnerCall
from harnesslab.tools.integrity import public_verdict, step_verify
from harnesslab.tools.integrity.reasons import CERTIFIES, REASONS
from harnesslab.tools.integrity.step_verify import judge_steps
from harnesslab.tools.integrity.verdict import Verdict
from harnesslab.tools.integrity.verdict_view import PUBLIC_INCUMBENT
from harnesslab.tools.state import Checkpoints
from harnesslab.tools.task import load_task

CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "step"
CHEATS = sorted(CORPUS.glob("*.py"))
TWINS = sorted((CORPUS / "honest").glob("*.py"))
BASELINE = load_task("decode_step").workspace_template / "kernel.py"


def docstring(path: Path) -> dict[str, str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in doc.splitlines()) if v}


def verify(tmp_path: Path, kernel: Path) -> Verdict:
    return verify_step(tmp_path, kernel.read_text())[1]


def fast_first(paths: list[Path]) -> list[object]:
    return [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if i else []) for i, p in
            enumerate(paths)]  # fmt: skip


def test_every_step_cheat_names_a_known_code_and_a_twin_that_exists() -> None:
    assert len(CHEATS) >= 5 and len(TWINS) >= 4
    for path in CHEATS:
        exp = docstring(path)
        assert exp["expect"] in REASONS, path.name
        assert (CORPUS / "honest" / f"{exp['twin']}.py").is_file(), path.name


@pytest.mark.parametrize("path", fast_first(CHEATS))
def test_a_step_cheat_is_rejected_with_its_code_and_the_public_verdict_says_only_that(
    tmp_path: Path, path: Path
) -> None:
    v = verify(tmp_path, path)
    assert v.verdict == "rejected", v.reasons
    assert v.reasons[0]["code"] == docstring(path)["expect"], v.reasons
    assert v.certifies == "nothing" and v.score_us is None and v.sandbox == "full"
    shown = public_verdict(v)  # the code and the harness's sentence: no step, pass or trace
    assert shown["reasons"] == [
        {"code": v.reasons[0]["code"], "detail": REASONS[v.reasons[0]["code"]]}
    ]
    assert all(
        not c["passed"] and c["reason"].startswith("not shown") for c in shown["result"]["cases"]
    )
    assert "traces" not in shown["evidence"] and "seed" not in shown["evidence"]


@pytest.mark.parametrize("path", fast_first([BASELINE, *TWINS]))
def test_an_honest_step_passes_and_certifies_outputs_on_hidden_traces_with_a_score(
    tmp_path: Path, path: Path
) -> None:
    v = verify(tmp_path, path)
    assert v.verdict == "passed", v.reasons
    assert v.certifies == "step_outputs" and "NOT certified" in CERTIFIES["step_outputs"]
    assert v.unverified == ["step_work", "speed"] and not v.meaningful  # the interpreter
    assert v.score_us is not None and v.score_us > 0
    assert [c.name for c in v.result.cases] == ["final0_float16", "final1_float16",
                                                "final2_bfloat16"]  # fmt: skip
    assert all(c.passed for c in v.result.cases)


def test_the_best_checkpoint_is_timed_beside_the_next_candidate_and_shown_only_in_public_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settled: list[dict[str, Any]] = []
    settle = step_verify.settle_best
    monkeypatch.setattr(step_verify, "settle_best",
                        lambda *a, **k: settled.append(k) or settle(*a, **k))  # fmt: skip
    ws, first = verify_step(tmp_path, BASELINE.read_text())
    assert first.verdict == "passed" and first.incumbent is None
    _, second = verify_step(tmp_path, (CORPUS / "honest" / "host_positions.py").read_text(), ws)
    assert second.verdict == "passed", second.reasons
    inc = second.incumbent
    assert inc is not None and inc["hash"] == first.evidence["candidate"] and inc["error"] is None
    assert [r["candidate_us"] for r in inc["cases"]] == [c.median_us for c in second.result.cases]
    assert len(inc["cases"]) == 3 and all(r["incumbent_passed"] and r["incumbent_us"] > 0
                                          for r in inc["cases"])  # fmt: skip
    assert inc["speedup"] > 0 and inc["meaningful"] is False  # the interpreter: not a best rule
    assert second.evidence["runner_phases_s"]["incumbent"] > 0
    assert set(second.evidence["sandbox"]) == {"candidate", "incumbent"}
    assert public_verdict(second)["incumbent"] == {k: inc[k] for k in PUBLIC_INCUMBENT}
    # the candidate's process lived while the incumbent was timed: the comparison alone
    # promotes nobody (incumbent.settle_best's `contested`)
    assert settled and all(k == {"contested": True} for k in settled)


@pytest.mark.slow(
    "repeated by test_step_guard_units's test_an_incumbent_with_wrong_logits_fails_its_trace_and_"
    "is_not_timed_again"
)
def test_a_best_checkpoint_that_now_fails_loses_the_comparison_not_the_candidates_verdict(
    tmp_path: Path,
) -> None:
    """A best pointer on a checkpoint whose step is wrong (a damaged or an old bad pointer)."""
    ws, first = verify_step(tmp_path, BASELINE.read_text())
    ckpt = Checkpoints(ws)
    bad = ckpt.save({**ws.editable_files(),
                     "kernel.py": (CORPUS / "previous_logits.py").read_bytes()})  # fmt: skip
    ckpt.set_best("final", bad, 1.0, "r0", case_set=first.case_set)
    _, v = verify_step(tmp_path, (CORPUS / "honest" / "host_positions.py").read_text(), ws)
    assert v.verdict == "passed", v.reasons
    assert v.incumbent is not None and v.incumbent["hash"] == bad
    assert v.incumbent["faster"] is False and v.incumbent["speedup"] is None
    assert not v.incumbent["cases"][0]["incumbent_passed"] and v.incumbent["error"]


def _call(result: dict | None) -> RunnerCall:
    return RunnerCall(result=result, events=[], exit_code=0, timed_out=False, stderr_tail="",
                      host="local", gpu_index=0, wall_s=0.0)  # fmt: skip


TRACES = [{"name": "final0_float16", "dtype": "float16"},
          {"name": "final1_bfloat16", "dtype": "bfloat16"}]  # fmt: skip


def test_the_step_judge_takes_nothing_but_the_parents_records_with_this_nonce() -> None:
    timed = {"codes": [], "steps_timed": 3, "p50_us": 5.0, "p95_us": 6.0}
    ok = {"status": "measured", "nonce": "n", "cases": [timed, timed]}
    assert judge_steps(_call(ok), TRACES, "n")[0] == "passed"
    assert judge_steps(_call(ok), TRACES, "other")[1][0]["code"] == "forged_result"
    assert judge_steps(_call(None), TRACES, "n")[0] == "error"
    short = {**ok, "cases": [timed]}  # a trace missing: never a pass
    assert judge_steps(_call(short), TRACES, "n")[0] == "error"
    odd = {**ok, "cases": [{"codes": [["made_up", "x"]]}, timed]}
    verdict, reasons, rows = judge_steps(_call(odd), TRACES, "n")
    assert verdict == "error" and reasons[0]["code"] == "runner_failed"
    bad = {**ok, "cases": [timed, {"codes": [["wrong_kv_cache", "after pass 0"]]}]}
    verdict, reasons, rows = judge_steps(_call(bad), TRACES, "n")
    assert verdict == "rejected" and [r.passed for r in rows] == [True, False]
    crashed = {**ok, "cases": [{"codes": [], "error": "died", "error_code": "timeout"}]}
    verdict, reasons, rows = judge_steps(_call(crashed), TRACES, "n")
    assert verdict == "rejected" and reasons[0]["code"] == "timeout"
    assert rows[1].reason.startswith("not run")
