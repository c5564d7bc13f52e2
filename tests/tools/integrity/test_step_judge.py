"""The step verdict judged from the trusted parent's raw records (step_verify.judge_steps), rule
by rule, without a verify or a GPU: each test builds the records a parent could return.

- A runner that says nothing, or says it failed, is the harness's error, never the candidate's.
- A sandbox that is missing or failed before the candidate ran is said as such, with no rows.
- Records without this verify's nonce are forged, whatever they say.
- A code the step verify does not know becomes runner_failed (an error, never a rejection).
- An error with no code is the candidate's crash.
- The first failing trace ends the rows: the traces after it are "not run" and never passed.
- Fewer records than traces is an error that says how many ran.
- A row carries its first reason, its status and the parent's max_abs_err; details are cut at
  400 characters.
- A passed trace carries its timed pass's figures (median_us = p50, a bucket "all" with p95 and
  the steps timed); a clean record without them (or with figures that are not finite positive
  numbers) is the harness's error, never a pass with no score.
- The incumbent comparison (compare_steps): per trace the candidate's p50 beside the incumbent's
  from the same timed pass; an incumbent counts on a trace only where its record passed with
  good figures; a new best needs 1% over every trace (the kernel verify's rule); the first
  reason it failed, or its process's failure, is the comparison's error.
"""

from __future__ import annotations

from typing import Any

from harnesslab.tools.evaluation.results import CaseResult
from harnesslab.tools.execution import RunnerCall
from harnesslab.tools.integrity.reasons import SANDBOX_REFUSED
from harnesslab.tools.integrity.step_verify import compare_steps, judge_steps

TRACES = [{"name": "t0", "dtype": "float16"}, {"name": "t1", "dtype": "bfloat16"},
          {"name": "t2", "dtype": "float16"}]  # fmt: skip
LONG = "x" * 1000
T = {"steps_timed": 4, "p50_us": 10.0, "p95_us": 12.5}  # a clean record's timed pass
Judged = tuple[str, list[dict[str, str]], list[CaseResult]]


def call(
    result: dict[str, Any] | None, exit_code: int | None = 0, timed_out: bool = False
) -> RunnerCall:
    return RunnerCall(result=result, events=[], exit_code=exit_code, timed_out=timed_out,
                      stderr_tail="", host="local", gpu_index=0, wall_s=0.0)  # fmt: skip


def records(*cases: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"status": "measured", "nonce": "n", "cases": list(cases), **top}


def judge(raw: dict[str, Any] | None, **kw: Any) -> Judged:
    return judge_steps(call(raw, **kw), TRACES, "n")


def test_a_silent_runner_is_an_error_that_says_how_it_exited() -> None:
    """Rule: no records at all is runner_failed with the exit code and the timeout said."""
    assert judge(None, exit_code=137, timed_out=True) == (
        "error",
        [{"code": "runner_failed", "detail": "runner exited with 137 (timeout)"}],
        [],
    )
    assert judge(None, exit_code=1)[1][0]["detail"] == "runner exited with 1"


def test_a_runner_that_reports_an_error_is_runner_failed_with_its_reason() -> None:
    """Rule: status "error" is the harness's failure, whatever cases the records hold."""
    raw = {"status": "error", "reason": "bad step spec", "nonce": "n", "cases": [{}, {}, {}]}
    assert judge(raw) == ("error", [{"code": "runner_failed", "detail": "bad step spec"}], [])


def test_a_missing_or_failed_sandbox_is_said_with_no_rows() -> None:
    """Rule: sandbox_unavailable says the refusal sentence; sandbox_failed says its (cut)
    error; both before the nonce check, both with no rows."""
    assert judge({"error_code": "sandbox_unavailable"}) == (
        "error",
        [{"code": "sandbox_unavailable", "detail": SANDBOX_REFUSED}],
        [],
    )
    verdict, reasons, rows = judge({"error_code": "sandbox_failed", "error": LONG})
    assert (verdict, rows) == ("error", [])
    assert reasons == [{"code": "sandbox_failed", "detail": "x" * 400}]


def test_records_without_this_nonce_are_forged() -> None:
    """Rule: a wrong nonce is forged_result, even on records that would pass."""
    assert judge(records({}, {}, {}, nonce="other")) == (
        "error",
        [{"code": "forged_result", "detail": "nonce mismatch"}],
        [],
    )


def test_all_traces_clean_pass_with_their_rows() -> None:
    """Rule: every trace run and no code is a pass; each row says passed and carries the
    parent's max_abs_err (a record needs no `codes` key)."""
    verdict, reasons, rows = judge(records({"max_abs_err": 0.5, **T}, {"codes": [], **T}, T))
    assert (verdict, reasons) == ("passed", [])
    assert [(r.name, r.dtype, r.passed, r.status, r.reason) for r in rows] == [
        ("t0", "float16", True, "passed", ""), ("t1", "bfloat16", True, "passed", ""),
        ("t2", "float16", True, "passed", "")]  # fmt: skip
    assert [r.max_abs_err for r in rows] == [0.5, None, None]


def test_the_first_failing_trace_ends_the_rows() -> None:
    """Rule: the traces after a rejected one are not run, never passed, and their records
    (even failing ones) add no reason."""
    verdict, reasons, rows = judge(records(
        T, {"codes": [["wrong_output", "logits off"]], "max_abs_err": 3.0},
        {"codes": [["wrong_kv_cache", "later"]]}))  # fmt: skip
    assert (verdict, reasons) == ("rejected", [{"code": "wrong_output", "detail": "logits off"}])
    assert [(r.passed, r.status) for r in rows] == [(True, "passed"), (False, "failed"),
                                                    (False, "failed")]  # fmt: skip
    assert rows[1].reason == "logits off" and rows[1].max_abs_err == 3.0
    assert rows[2].reason == "not run: an earlier trace was rejected"


def test_a_rows_reason_is_its_first_and_every_code_is_kept() -> None:
    """Rule: a trace's error comes first (named by its trace), then its codes, all reasons."""
    rec = {"error": "died", "error_code": "candidate_error", "codes": [["wrong_shape", "s"]]}
    verdict, reasons, rows = judge(records(rec))
    assert verdict == "rejected"
    assert reasons == [{"code": "candidate_error", "detail": "t0: died"},
                       {"code": "wrong_shape", "detail": "s"}]  # fmt: skip
    assert rows[0].reason == "t0: died"


def test_an_error_without_a_code_is_the_candidates_crash() -> None:
    """Rule: a trace's error, or the records' own, with no code is candidate_crashed."""
    assert judge(records({"error": "segv"}))[1] == [
        {"code": "candidate_crashed", "detail": "t0: segv"}
    ]
    verdict, reasons, rows = judge({"status": "measured", "nonce": "n", "error": "oom"})
    assert (verdict, reasons) == ("rejected", [{"code": "candidate_crashed", "detail": "oom"}])
    assert [r.reason for r in rows] == ["not run: an earlier trace was rejected"] * 3
    assert not any(r.passed for r in rows)


def test_the_records_own_error_keeps_its_code_and_the_traces_are_still_judged() -> None:
    """Rule: the records' error with a step code is that code; the traces still judge."""
    verdict, reasons, rows = judge(records(T, T, T, error="killed", error_code="timeout"))
    assert (verdict, reasons) == ("rejected", [{"code": "timeout", "detail": "killed"}])
    assert [r.passed for r in rows] == [True, True, True]


def test_an_unknown_code_is_the_harnesss_error_never_a_rejection() -> None:
    """Rule: a code outside the step verify's own (even one the kernel verify knows, such as
    forbidden_call) becomes runner_failed, wherever it appears."""
    for raw in (records({"codes": [["forbidden_call", "x"]]}),
                records({"error": "e", "error_code": "made_up"}),
                records({}, {}, {}, error="e", error_code="cuda_timer")):  # fmt: skip
        verdict, reasons, _ = judge(raw)
        assert verdict == "error" and reasons[0]["code"] == "runner_failed", raw


def test_fewer_records_than_traces_is_an_error_that_says_how_many_ran() -> None:
    """Rule: a trace with no record is never passed; the reason counts what ran."""
    verdict, reasons, rows = judge(records(T, T))
    assert (verdict, reasons) == ("error", [{"code": "runner_failed", "detail": "2 of 3 traces"}])
    assert [r.passed for r in rows] == [True, True, False]


def test_details_are_cut_at_400_characters() -> None:
    """Rule: no detail the parent passes on is longer than 400 characters."""
    for rec in ({"error": LONG, "error_code": "timeout"}, {"codes": [["wrong_output", LONG]]}):
        _, reasons, _ = judge(records(rec))
        assert len(reasons[0]["detail"]) == 400
    _, reasons, _ = judge({"status": "measured", "nonce": "n", "error": LONG})
    assert len(reasons[0]["detail"]) == 400


def test_a_passed_trace_carries_its_timed_figures_p50_as_its_median() -> None:
    """Rule: the row's median_us is the parent's p50; its one bucket ("all") has p50, p95, the
    steps timed and the steps checked; a failed trace has no figures."""
    verdict, _, rows = judge(records({**T, "steps_checked": 18}, {**T, "p50_us": 7},
                                     {**T, "codes": [["wrong_output", "x"]]}))  # fmt: skip
    assert verdict == "rejected"
    assert [r.median_us for r in rows] == [10.0, 7.0, None]
    (all_,) = rows[0].buckets or []
    assert (all_.bucket, all_.p50_us, all_.p95_us, all_.steps, all_.checked_steps) == (
        "all", 10.0, 12.5, 4, 18)  # fmt: skip
    assert all_.failed_steps == 0 and (rows[1].buckets or [])[0].checked_steps == 0  # none said
    assert rows[2].buckets is None
    # the least a clean trace may carry: one step timed, figures under a microsecond
    least, _, small = judge(records(*[{**T, "steps_timed": 1, "p50_us": 0.5, "p95_us": 0.75}] * 3))
    assert least == "passed" and [r.median_us for r in small] == [0.5] * 3


def test_a_clean_record_without_good_timed_figures_is_the_harnesss_error() -> None:
    """Rule: a trace with no codes but no timed pass (or p50/p95 that are not finite positive
    numbers, or no step timed) is runner_failed, naming the trace: never a pass without a
    score, never the candidate's rejection."""
    for bad in ({}, {**T, "p50_us": None}, {**T, "p95_us": float("nan")}, {**T, "p50_us": 0},
                {**T, "p50_us": -1.0}, {**T, "steps_timed": 0}, {**T, "steps_timed": True},
                {**T, "p50_us": "10"}, {**T, "p95_us": float("inf")}, {**T, "p50_us": True}):  # fmt: skip
        verdict, reasons, rows = judge(records(T, bad, T))
        assert verdict == "error", bad
        assert reasons == [{"code": "runner_failed", "detail": "t1: no timed pass"}], bad
        assert [r.passed for r in rows] == [True, False, False]


def compared(*incumbents: dict[str, Any] | None, **raw: Any) -> dict[str, Any]:
    """compare_steps over clean candidate records (p50 10 us each) with these incumbent records
    (None: the trace has none), meaningful, incumbent hash "abc"."""
    recs = [{"codes": [], **T, **({"incumbent": inc} if inc is not None else {})}
            for inc in incumbents]  # fmt: skip
    result = {"status": "measured", "nonce": "n", "cases": recs, **raw}
    traces = TRACES[: len(recs)]
    _, _, rows = judge_steps(call(result), traces, "n")
    return compare_steps(result, rows, True, "abc")


def inc(p50: float, passed: bool = True, codes: list[list[str]] | None = None) -> dict[str, Any]:
    return {"name": "t", "codes": codes or [], "passed": passed, "steps_timed": 4,
            "p50_us": p50, "p95_us": p50 * 1.25}  # fmt: skip


def test_a_candidate_1pct_faster_on_every_trace_than_the_incumbent_beside_it_is_faster() -> None:
    out = compared(inc(10.2), inc(10.1))
    assert out["cases"] == [
        {"candidate_us": 10.0, "incumbent_passed": True, "incumbent_us": 10.2},
        {"candidate_us": 10.0, "incumbent_passed": True, "incumbent_us": 10.1},
    ]
    assert out["faster"] is True and out["hash"] == "abc" and out["meaningful"] is True
    assert out["speedup"] > 1.01 and out["error"] is None
    assert compared(inc(10.05), inc(10.05))["faster"] is False  # 0.5%: noise, not a new best
    assert compared(inc(9.0), inc(12.0))["faster"] is True  # the geomean decides: 1.039x


def test_an_incumbent_that_failed_or_was_not_timed_on_a_trace_gives_no_win_there() -> None:
    failed = compared(inc(40.0), inc(40.0, passed=False, codes=[["wrong_output", "t1: logits"]]))
    assert failed["cases"][1] == {"candidate_us": 10.0, "incumbent_passed": False,
                                  "incumbent_us": None}  # fmt: skip
    assert failed["faster"] is False and failed["error"] == "t1: logits"
    assert compared(inc(40.0), None)["faster"] is False  # it left the verify before trace 1
    flagged = compared(inc(40.0), inc(40.0, codes=[["wrong_kv_cache", "t1: cache"]]))
    assert flagged["cases"][1]["incumbent_passed"] is False  # "passed" with a reason: not passed
    untimed = compared(inc(40.0), {**inc(40.0), "p50_us": None})
    assert untimed["cases"][1]["incumbent_passed"] is False and untimed["faster"] is False


def test_the_incumbents_process_failure_is_the_comparisons_error() -> None:
    out = compared(None, incumbent_error="candidate_crashed: the process died")
    assert out["error"] == "candidate_crashed: the process died" and out["faster"] is False
    assert out["cases"] == [{"candidate_us": 10.0, "incumbent_passed": False, "incumbent_us": None}]


def test_an_incumbent_record_counts_only_when_it_says_passed_itself() -> None:
    """The parent writes passed=True only after the incumbent's whole timed pass: figures of a
    pass it did not finish (the candidate failed first) are not a time."""
    assert compared(inc(40.0, passed=False))["cases"][0]["incumbent_passed"] is False
    assert compared({**inc(40.0), "passed": 1})["cases"][0]["incumbent_passed"] is False


def test_traces_the_verify_never_ran_have_no_times_and_the_first_reason_is_the_error() -> None:
    """A rejected trace ends the rows: the traces after it were never run (no record)."""
    bad = {"codes": [["wrong_output", "t0: x"]], "incumbent": inc(40.0)}
    result = {"status": "measured", "nonce": "n", "cases": [bad]}
    _, _, rows = judge_steps(call(result), TRACES, "n")
    out = compare_steps(result, rows, True, "abc")
    assert [r["incumbent_us"] for r in out["cases"]] == [40.0, None, None]  # no record, no time
    assert compare_steps({}, rows, True, "abc")["cases"][2]["incumbent_passed"] is False
    two = compared(inc(40.0, passed=False, codes=[["wrong_output", "first"], ["x", "second"]]),
                   inc(40.0, passed=False, codes=[["wrong_kv_cache", "later"]]))  # fmt: skip
    assert two["error"] == "first"
    long = compared(inc(40.0, passed=False, codes=[["wrong_output", LONG]]))
    assert long["error"] == LONG[:400]
