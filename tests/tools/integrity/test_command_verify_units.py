"""A command task's final verdict (tools/integrity/command_verify.py) rule by rule, without a
run: the verdict on one run of the final objective (judge_run), the hidden cases it is fed
(hidden_payload), and what a verdict nothing set claims. The whole final verify (a sandboxed
run on a launcher) is tests/tools/evaluation/test_command_tasks.py.
"""

from __future__ import annotations

import hashlib
import json
import types
from typing import Any

import pytest

from harnesslab.tools.execution import CommandResult
from harnesslab.tools.integrity import command_verify as cv


def run(score: Any = 12.5, *, exit_code: int | None = 0, timed_out: bool = False,
        stdout: str | None = None, stderr: str = "", **fields: Any) -> CommandResult:  # fmt: skip
    if stdout is None:
        stdout = json.dumps({"score": score, **fields})
    return CommandResult(argv=["x"], exit_code=exit_code, stdout=stdout, stderr=stderr,
                         duration_s=1.0, timed_out=timed_out)  # fmt: skip


def judge(res: CommandResult, *, level: str = "full", limit: str = "", hidden: bool = True,
          allow: bool = False) -> tuple[Any, ...]:  # fmt: skip
    return cv.judge_run(res, "score", level, limit, timeout_s=60.0, python="python3",
                        hidden=hidden, allow_unsandboxed=allow)  # fmt: skip


def codes(reasons: list[dict[str, str]]) -> list[str]:
    return [r["code"] for r in reasons]


# -- judge_run ----------------------------------------------------------------------------------
def test_a_clean_run_passes_with_its_score() -> None:
    verdict, reasons, score, parsed = judge(run(12.5, meaningful=True))
    assert (verdict, reasons, score) == ("passed", [], 12.5)
    assert parsed == {"score": 12.5, "meaningful": True}


def test_no_sandbox_is_refused_before_anything_it_said() -> None:
    """Rule: where no sandbox applied the verdict is an error with no score, unless the
    operator allowed unsandboxed runs."""
    verdict, reasons, score, _ = judge(run(12.5), level="none")
    assert (verdict, codes(reasons), score) == ("error", ["sandbox_unavailable"], None)
    assert "HARNESSLAB_ALLOW_UNSANDBOXED=1" in reasons[0]["detail"]
    assert judge(run(12.5), level="none", allow=True)[:3] == ("passed", [], 12.5)
    assert judge(run(12.5), level="partial")[0] == "passed"


@pytest.mark.parametrize(
    "res, code",
    [
        (run(12.5, timed_out=True, exit_code=None), "timeout"),
        (run(12.5, exit_code=1), "objective_exit"),
        (run(12.5, exit_code=-9), "objective_exit"),
        (run("fast"), "no_score"),
        (run(float("inf"), stdout='{"score": Infinity}'), "no_score"),
        (run(None, stdout="no json here"), "no_score"),
        (run(12.5, status="failed"), "objective_failed"),
        (run(12.5, verified=False), "objective_failed"),
        (run(12.5, passed=False), "objective_failed"),
        (run(12.5, exit_code=1, error="boom"), "objective_error"),
    ],
)
def test_a_failed_run_is_rejected_without_a_score(res: CommandResult, code: str) -> None:
    """Rule: a run that timed out, exited non-zero, gave no finite score or says it failed is
    rejected, its score dropped, with the harness's reason."""
    verdict, reasons, score, _ = judge(res)
    assert verdict == "rejected" and score is None
    assert code in codes(reasons)


def test_an_error_field_alone_does_not_reject() -> None:
    """The objective's error fields are reasons only once its run failed: a run that exited 0
    with a finite score and no failure status passes (its fields stay in the evidence)."""
    assert judge(run(12.5, message="note"))[0] == "passed"
    assert judge(run(12.5, error="boom"))[0] == "passed"


def test_a_sandbox_limit_comes_first() -> None:
    """Rule: a limit the sandbox counted is the first reason of a failed run (and no reason
    of a passed one)."""
    verdict, reasons, _, _ = judge(run(12.5, exit_code=137), limit="memory")
    assert verdict == "rejected"
    assert codes(reasons)[0] == "resource_limit" and "objective_exit" in codes(reasons)
    assert reasons[0]["detail"] == (
        "resource_limit: memory (a limit of the sandbox ended the final objective)"
    )
    assert judge(run(12.5), limit="memory")[:2] == ("passed", [])


def test_hidden_runs_withhold_the_objectives_words() -> None:
    res = run(12.5, exit_code=2, stderr="secret shape 4096")
    hidden = json.dumps(judge(res, hidden=True)[1])
    assert "4096" not in hidden and "(2)" not in hidden
    assert "4096" in json.dumps(judge(res, hidden=False)[1])


# -- hidden_payload ------------------------------------------------------------------------------
def test_hidden_payload_names_cases_and_seeds_them_from_the_secret() -> None:
    """Rule: each case is named final<i>, keeps its dtype and sizes, and gets an input seed
    derived from the secret and its index (below 2**31)."""
    drawn = [types.SimpleNamespace(dtype="float16", shape={"n": 64, "m": 8}),
             types.SimpleNamespace(dtype="float32", shape={"n": 128, "m": 4})]  # fmt: skip
    seeds: list[Any] = []
    final = types.SimpleNamespace(draw=lambda seed: seeds.append(seed) or drawn)
    ws = types.SimpleNamespace(task=types.SimpleNamespace(final=final))
    got = cv.hidden_payload(ws, "s3cret", "cs-1")  # type: ignore[arg-type]
    assert seeds == ["s3cret"]
    assert got["case_set"] == "cs-1"

    def seed(i: int) -> int:
        return int.from_bytes(hashlib.sha256(f"s3cret:{i}".encode()).digest()[:4], "big") % 2**31

    assert got["cases"] == [
        {"name": "final0", "dtype": "float16", "n": 64, "m": 8, "seed": seed(0)},
        {"name": "final1", "dtype": "float32", "n": 128, "m": 4, "seed": seed(1)},
    ]
    assert seed(0) != seed(1)


# -- the verdict ---------------------------------------------------------------------------------
def verdict(**kw: Any) -> cv.CommandVerdict:
    return cv.CommandVerdict(verdict="rejected", score_key="score", case_set="c",
                             hidden_cases=0, candidate="abc", **kw)  # fmt: skip


def test_a_command_verdict_nothing_set_claims_nothing() -> None:
    v = verdict()
    assert v.certifies == "nothing" and v.is_new_best is False and v.meaningful is None
    assert v.score is None and v.best_final_score is None and v.record_id is None
    assert v.sandbox == "none" and v.higher_is_better is False and v.unit == ""
    assert (v.reasons, v.warnings, v.evidence) == ([], [], {})
    w = verdict()
    v.reasons.append({"code": "x", "detail": "y"})
    v.warnings.append({"code": "x", "detail": "y"})
    v.evidence["k"] = 1
    assert (w.reasons, w.warnings, w.evidence) == ([], [], {})


def test_the_score_label_says_its_unit_and_direction() -> None:
    assert verdict().score_label() == "score, lower is better"
    assert verdict(unit="ms", higher_is_better=True).score_label() == "score (ms), higher is better"


def test_a_timed_out_run_is_rejected_whatever_it_printed() -> None:
    """Rule: a timeout rejects even a run that reports exit 0 and a score (an executor that
    gives the status of a process that ended as its deadline hit)."""
    verdict, reasons, score, _ = judge(run(12.5, timed_out=True, exit_code=0))
    assert (verdict, score) == ("rejected", None) and codes(reasons) == ["timeout"]


def test_json_without_the_score_key_says_so() -> None:
    """The objective's JSON without its score key: the reason is that the key is missing, not
    that its value is not a number."""
    verdict, reasons, _, parsed = judge(run(stdout='{"status": "ok"}'))
    assert verdict == "rejected" and parsed == {"status": "ok"}
    assert reasons == [{"code": "no_score", "detail": "the objective's JSON has no key 'score'"}]


def test_a_command_verdict_has_no_wall_time_unless_set() -> None:
    assert verdict().wall_s == 0.0
