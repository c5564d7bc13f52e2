"""The outbound gate for hidden cases (tools/integrity/verdict_view.py), unit by unit: a public
verdict keeps only fixed sentences, one row per case that says nothing of which case failed, the
listed evidence and a passed verdict's incumbent comparison. Each rule is pinned on a verdict
whose withheld fields all hold values a candidate could have chosen."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harnesslab.tools.evaluation.results import CaseResult, EvalResult
from harnesslab.tools.integrity.command_verify import CommandVerdict
from harnesslab.tools.integrity.reasons import REASONS, SANDBOX_REFUSED
from harnesslab.tools.integrity.verdict_view import (
    WITHHELD,
    public_command_verdict,
    public_reasons,
    public_result,
    public_rows,
    public_verdict,
)
from harnesslab.tools.integrity.verify import Verdict

PUBLIC_EVIDENCE = {
    "candidate": "abc",
    "case_set_generation": 2,
    "checks_per_case": 3,
    "harness_sha256": "h",
    "scan": {"rejects": 0},
    "device": "cpu",
    "driver": "d",
    "clocks": (1, 2),  # a tuple: the public form is JSON's list
    "copy_gbps": 100.0,
    "versions": {"torch": "2"},
    "sandbox": "full",
}
PRIVATE_EVIDENCE = {"checks": [{"case": 1, "err": 0.5}], "wall": 1.5, "seed": 7}
INCUMBENT = {
    "hash": "inc",
    "speedup": 1.2,
    "faster": True,
    "meaningful": True,
    "cases": [{"median_us": 3.0}],
    "wall_s": 2.0,
}
REASON_LIST = [
    {"code": "wrong_output", "detail": "case final3: max error 0.4375 at [17]"},
    {"code": "timeout", "detail": "case final5 after 12 s"},
]


def row(name: str, passed: bool) -> CaseResult:
    return CaseResult(
        name=name,
        dtype="float32",
        shape={"rows": 17, "dim": 4096},
        rows=17,
        dim=4096,
        passed=passed,
        status="passed" if passed else "failed",
        reason="" if passed else "max error 0.4375",
        median_us=12.5,
        gbps=800.0,
        max_abs_err=0.4375,
    )


def verdict(outcome: str = "rejected", *, ran: bool = True, **update: Any) -> Verdict:
    result = EvalResult(
        status="passed" if outcome == "passed" else "failed",
        score_us=25.0,
        meaningful=True,
        reason="case final3 failed",
        cases=[row("final0_float32", True), row("final1_float32", False)],
        candidate="abc",
        config={"block": (64, 1)},
        seed=1234,
        wall_s=3.5,
        phases_s={"runner_timing": 2.0},
    )
    fields: dict[str, Any] = {
        "verdict": outcome,
        "reasons": REASON_LIST,
        "case_set": "final-xyz",
        "ran_on_hidden_cases": ran,
        "result": result,
        "evidence": PUBLIC_EVIDENCE | PRIVATE_EVIDENCE,
        "incumbent": INCUMBENT,
        "score_us": 25.0 if outcome == "passed" else None,
    }
    return Verdict.model_validate(fields | update)


# -- reasons -------------------------------------------------------------------------------------
def test_a_candidate_that_ran_gets_its_first_reasons_code_with_the_harness_sentence() -> None:
    assert public_reasons(REASON_LIST, ran=True) == [
        {"code": "wrong_output", "detail": REASONS["wrong_output"]}
    ]


def test_an_unknown_code_gets_a_fixed_sentence_and_no_reason_stays_none() -> None:
    shown = public_reasons([{"code": "new_code", "detail": "case 3: 0.5"}], ran=True)
    assert shown == [{"code": "new_code", "detail": "the verify did not pass"}]
    assert public_reasons([], ran=True) == []


def test_the_hosts_sandbox_refusal_is_shown_as_the_hosts_own_text() -> None:
    shown = public_reasons([{"code": "sandbox_unavailable", "detail": "x"}], ran=True)
    assert shown == [{"code": "sandbox_unavailable", "detail": SANDBOX_REFUSED}]
    assert SANDBOX_REFUSED != REASONS["sandbox_unavailable"]  # the host's text wins


def test_a_candidate_that_never_ran_gets_every_reason_in_full() -> None:
    shown = public_reasons(REASON_LIST, ran=False)
    assert shown == REASON_LIST


# -- rows ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("outcome", "status", "reason"),
    [("passed", "passed", ""), ("rejected", "failed", WITHHELD), ("error", "error", WITHHELD)],
)
def test_every_public_row_is_the_same_the_verdicts(outcome: str, status: str, reason: str) -> None:
    rows = public_rows([row("final0_float32", True), row("final1_float16", False)], outcome)
    expected = [
        CaseResult(
            name=name, dtype="float32", passed=outcome == "passed", status=status, reason=reason
        )
        for name in ("final0_float32", "final1_float16")
    ]
    assert rows == expected  # no shape, time, bandwidth or error survives


# -- the result and the verdict ------------------------------------------------------------------
def test_the_public_result_has_public_rows_the_public_reason_and_no_time_or_seed() -> None:
    full = verdict()
    shown = public_result(full)
    assert shown.cases == public_rows(full.result.cases, "rejected")
    assert shown.reason == REASONS["wrong_output"]
    assert (shown.wall_s, shown.phases_s, shown.seed) == (0.0, {}, None)
    assert (shown.score_us, shown.candidate) == (25.0, "abc")  # the rest as it was
    assert public_result(verdict(reasons=[])).reason == ""
    # never ran: every reason is shown, and the result's reason is the first of them
    assert public_result(verdict(ran=False)).reason == REASON_LIST[0]["detail"]


def test_a_public_verdict_keeps_only_the_listed_evidence_as_json() -> None:
    shown = public_verdict(verdict("passed", reasons=[]))
    assert shown["evidence"] == json.loads(json.dumps(PUBLIC_EVIDENCE))
    assert shown["evidence"]["clocks"] == [1, 2]


def test_a_public_verdict_has_public_reasons_and_result_without_time_or_seed() -> None:
    full = verdict()
    shown = public_verdict(full)
    assert shown["reasons"] == public_reasons(full.reasons, ran=True)
    expected = public_result(full).model_dump(mode="json")
    for key in ("wall_s", "phases_s", "seed"):
        assert key in expected
        del expected[key]
    assert shown["result"] == expected
    assert shown["result"]["config"] == {"block": [64, 1]}
    assert shown["verdict"] == "rejected" and shown["case_set"] == "final-xyz"


def test_only_a_passed_verdict_shows_the_incumbent_and_only_its_public_fields() -> None:
    assert public_verdict(verdict("passed"))["incumbent"] == {
        "hash": "inc",
        "speedup": 1.2,
        "faster": True,
        "meaningful": True,
    }
    assert public_verdict(verdict("rejected"))["incumbent"] is None
    assert public_verdict(verdict("error"))["incumbent"] is None
    assert public_verdict(verdict("passed", incumbent=None))["incumbent"] is None
    assert public_verdict(verdict("passed", incumbent={}))["incumbent"] is None


def test_a_command_verdict_withholds_its_wall_time_exit_status_and_error_fields() -> None:
    full = CommandVerdict(
        verdict="rejected",
        score_key="loss",
        case_set="final-xyz",
        hidden_cases=4,
        candidate="abc",
        wall_s=9.5,
        evidence={"exit_code": 3, "error_fields": ["case2"], "sandbox": "full", "dims": (1, 2)},
    )
    shown = public_command_verdict(full)
    assert "wall_s" not in shown
    assert shown["evidence"] == {"sandbox": "full", "dims": [1, 2]}
    assert shown["hidden_cases"] == 4 and shown["score_key"] == "loss"
