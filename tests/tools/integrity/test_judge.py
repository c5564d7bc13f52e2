"""The guarded verify's judgement of raw measurements (integrity/verify.py `judge`, `judge_case`,
`wall_mismatch`): a case passes only when every candidate call passed its checks, the null
control was refused and (on a GPU) it has timing samples whose claim the parent's wall clock
bounds; anything the runner did not answer is an error, never a pass. Canned measurements; no
runner."""

from __future__ import annotations

from typing import Any

import pytest

from harnesslab.tools.execution.launcher import RunnerCall
from harnesslab.tools.integrity.reasons import SANDBOX_REFUSED
from harnesslab.tools.integrity.verify import judge, judge_case, wall_mismatch
from harnesslab.tools.task.spec import Case


def check(role: str = "candidate", passed: bool = True, **extra: Any) -> dict[str, Any]:
    return {"role": role, "kind": "check", "passed": passed, **extra}


def gpu_case(samples: list[float] | None = (10.0, 10.0, 10.0), **extra: Any) -> dict[str, Any]:
    """A GPU case whose one checked call passed, timed by replay `samples`."""
    timing = {} if samples is None else {"candidate": {"samples_us": list(samples)}}
    return {"dtype": "float32", "calls": [check()], "timing": timing, **extra}


def codes(reasons: list[dict[str, str]]) -> list[str]:
    return [r["code"] for r in reasons]


# -- one case ------------------------------------------------------------------------------------
def test_a_clean_gpu_case_passes_with_its_times_and_bandwidths() -> None:
    timing = {"samples_us": [10.0, 20.0, 30.0], "method": "replay", "checked_calls": 3}
    case = gpu_case(None, bytes=40_000) | {"timing": {"candidate": timing}}
    row, reasons, stats = judge_case(case, copy_gbps=8.0, meaningful=True, index=2)
    assert reasons == []
    assert (row.name, row.dtype, row.passed, row.status, row.reason) == (
        "final2_float32", "float32", True, "passed", "",
    )  # fmt: skip
    assert (row.median_us, row.p10_us, row.p90_us) == (20.0, 10.0, 30.0)
    assert row.gbps == pytest.approx(2.0)  # 40 kB in 20 us
    assert row.pct_of_copy_bw == pytest.approx(25.0)
    assert row.timing_method == "replay"
    assert stats == {
        "calls_checked": 1,
        "calls_passed": 1,
        "timed_calls_checked": 3,
        "timed_calls_bad": 0,
        "method": "replay",
    }


def test_a_case_error_rejects_with_its_code_or_as_a_crash() -> None:
    _, reasons, _ = judge_case(gpu_case(error="boom"), None, True, 0)
    assert reasons == [{"code": "candidate_crashed", "detail": "case 0 (float32): boom"}]
    row, reasons, _ = judge_case(gpu_case(error="slow", error_code="timeout"), None, True, 1)
    assert codes(reasons) == ["timeout"]
    assert (row.passed, row.status, row.reason) == (False, "failed", "case 1 (float32): slow")
    assert row.median_us is None  # a rejected case is not timed


def test_every_code_of_a_candidate_call_is_a_reason_once() -> None:
    calls = [
        check(passed=False, codes=[["wrong_output", "bad"], ["inputs_modified", "x"]]),
        check(passed=False, codes=[["wrong_output", "again"]]),
        check("incumbent", passed=False, codes=[["foreign_kernel", "not the candidate's"]]),
    ]
    row, reasons, stats = judge_case(gpu_case(calls=calls), None, True, 0)
    assert row.reason == "case 0 (float32): bad"  # the first reason
    assert reasons == [
        {"code": "wrong_output", "detail": "case 0 (float32): bad"},
        {"code": "inputs_modified", "detail": "case 0 (float32): x"},
    ]
    assert (stats["calls_checked"], stats["calls_passed"]) == (2, 0)


def test_a_reasons_detail_is_cut_to_400_characters() -> None:
    _, reasons, _ = judge_case(gpu_case(error="e" * 1000), None, True, 0)
    assert len(reasons[0]["detail"]) == 400


def test_the_operators_error_figures_are_the_worst_call() -> None:
    calls = [check(max_abs_err=0.5, max_rel_err=0.1), check(max_abs_err=2, max_rel_err="x")]
    row, _, _ = judge_case(gpu_case(calls=calls), None, True, 0)
    assert (row.max_abs_err, row.max_rel_err) == (2, 0.1)
    row, _, _ = judge_case(gpu_case(calls=[check()]), None, True, 0)
    assert (row.max_abs_err, row.max_rel_err) == (None, None)


@pytest.mark.parametrize("null", [{"zeros": False, "copy": True}, {"zeros": False}])
def test_a_checker_that_accepts_a_null_output_voids_the_case(null: dict[str, bool]) -> None:
    _, reasons, _ = judge_case(gpu_case(null_control=null), None, True, 0)
    assert codes(reasons) == ["null_control"]
    _, reasons, _ = judge_case(gpu_case(null_control={"zeros": True, "copy": True}), None, True, 0)
    assert reasons == []


@pytest.mark.parametrize("timing", [None, {}, {"candidate": {}}, {"candidate": {"samples_us": []}}])
def test_a_gpu_case_without_timing_samples_is_a_runner_failure(timing: Any) -> None:
    row, reasons, _ = judge_case(gpu_case() | {"timing": timing}, None, True, 0)
    assert codes(reasons) == ["runner_failed"] and not row.passed


def test_on_the_interpreter_the_parents_wall_clock_around_checked_calls_is_the_time() -> None:
    calls = [
        check(wall_us=30.0),
        check(wall_us=10.0),
        check(wall_us=20.0),
        check(wall_us="x"),
        check("incumbent", wall_us=1.0),
        {"role": "candidate", "kind": "warmup", "passed": True, "wall_us": 1.0},
    ]
    row, reasons, stats = judge_case({"dtype": "float16", "calls": calls}, 1.0, False, 0)
    assert reasons == [] and row.median_us == 20.0
    assert row.gbps == 0.0  # no bytes declared: no bandwidth claimed
    assert (row.timing_method, stats["method"]) == ("wall_clock_interpreter",) * 2
    ints = [check(wall_us=30), check(wall_us=10), check(wall_us=20)]  # whole microseconds
    row, _, _ = judge_case({"dtype": "float16", "calls": ints}, 1.0, False, 0)
    assert row.median_us == 20.0
    # meaningless times: no plausibility check, and no time at all is no failure
    row, reasons, _ = judge_case({"dtype": "float16", "calls": [check()]}, 1.0, False, 0)
    assert reasons == [] and row.passed and row.median_us is None


def test_timing_codes_and_bad_timed_calls_reject() -> None:
    timing = {
        "samples_us": [10.0],
        "codes": [["side_stream", "two streams"]],
        "inputs_modified": 2,
        "bad_calls": 1,
        "checked_calls": 5,
    }
    _, reasons, stats = judge_case(
        gpu_case(None) | {"timing": {"candidate": timing}}, None, True, 0
    )
    assert reasons == [
        {"code": "side_stream", "detail": "case 0 (float32): two streams"},
        {
            "code": "inputs_modified",
            "detail": "case 0 (float32): 2 timed calls changed their inputs",
        },
        {"code": "wrong_output_timed", "detail": "case 0 (float32): 1 of 5 timed calls were wrong"},
    ]
    assert (stats["timed_calls_checked"], stats["timed_calls_bad"]) == (5, 1)


@pytest.mark.parametrize(("pct", "refused"), [(125.0, False), (125.5, True)])
def test_faster_than_125_percent_of_copy_bandwidth_is_implausible(
    pct: float, refused: bool
) -> None:
    # 1000 bytes in 10 us is 0.1 GB/s; the copy bandwidth makes it `pct` of it.
    case = gpu_case([10.0], bytes=1000)
    _, reasons, _ = judge_case(case, copy_gbps=0.1 * 100 / pct, meaningful=True, index=0)
    assert codes(reasons) == (["implausible_speed"] if refused else [])
    slow = {"dtype": "float32", "calls": [check(wall_us=10.0)], "bytes": 1000}
    row, reasons, _ = judge_case(slow, copy_gbps=0.1 * 100 / pct, meaningful=False, index=0)
    assert reasons == [] and row.pct_of_copy_bw == pytest.approx(pct)  # the interpreter's
    # times say nothing


def test_without_a_copy_bandwidth_there_is_no_share_and_no_plausibility_check() -> None:
    row, reasons, _ = judge_case(gpu_case([10.0], bytes=10**6), None, True, 0)
    assert reasons == [] and row.pct_of_copy_bw is None and row.gbps == pytest.approx(100.0)


def test_a_wall_clock_mismatch_rejects_the_case() -> None:
    timing = {"samples_us": [10.0, 10.0], "parent_wall_us": [5000.0, 5000.0]}
    _, reasons, _ = judge_case(gpu_case(None) | {"timing": {"candidate": timing}}, None, True, 0)
    assert codes(reasons) == ["timing_mismatch"]


# -- the wall clock ------------------------------------------------------------------------------
def test_a_sample_is_believed_within_125_percent_plus_250_us_of_its_wall_clock() -> None:
    # 4 calls of 100 us claimed: the wall clock may be up to 1.25 * 400 + 250 = 750 us
    ok = {"samples_us": [100.0], "calls_per_sample": 4, "parent_wall_us": [750.0]}
    assert wall_mismatch(ok) == ""
    late = ok | {"parent_wall_us": [750.5]}
    assert wall_mismatch(late) == (
        "parent wall clock 750 us per sample, child claims 400 us (no sample within 1.25x + 250 us)"
    )


def test_one_believable_sample_is_enough() -> None:
    timing = {"samples_us": [100.0, 100.0, 100.0], "parent_wall_us": [9000.0, 300.0, 9000.0]}
    assert wall_mismatch(timing) == ""
    assert wall_mismatch(timing | {"parent_wall_us": [9000.0, 400.0, 9000.0]}) != ""


def test_one_call_per_sample_by_default_and_no_walls_no_verdict() -> None:
    assert wall_mismatch({"samples_us": [100.0], "parent_wall_us": [375.0]}) == ""
    assert wall_mismatch({"samples_us": [100.0], "parent_wall_us": [376.0]}) != ""
    assert wall_mismatch({"samples_us": [100.0], "calls_per_sample": 0, "parent_wall_us": [376.0]})
    assert wall_mismatch({"samples_us": [100.0]}) == ""
    assert wall_mismatch({"samples_us": [], "parent_wall_us": []}) == ""
    assert wall_mismatch({"samples_us": [100.0, 1.0], "parent_wall_us": [9000.0]}) == ""


def test_the_mismatch_names_the_medians() -> None:
    timing = {"samples_us": [10.0, 30.0, 20.0], "parent_wall_us": [900.0, 700.0, 800.0]}
    assert wall_mismatch(timing).startswith(
        "parent wall clock 800 us per sample, child claims 20 us"
    )


# -- the whole run -------------------------------------------------------------------------------
CASES = [Case(name=f"c{i}", dtype="float32", shape={"dim": 8}) for i in range(2)]


def runner(
    result: dict[str, Any] | None, *, exit_code: int | None = 0, timed_out=False
) -> RunnerCall:
    return RunnerCall(
        result=result,
        events=[],
        exit_code=exit_code,
        timed_out=timed_out,
        stderr_tail="hidden shape rows=4096",
        host="h",
        gpu_index=0,
        wall_s=1.0,
    )


def raw(*cases: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"nonce": "n1", "env": {"meaningful": True}, "cases": list(cases), **extra}


def test_a_run_whose_every_case_passed_passes() -> None:
    verdict, reasons, rows, stats = judge(runner(raw(gpu_case(), gpu_case())), CASES, "n1")
    assert (verdict, reasons) == ("passed", [])
    assert [r.name for r in rows] == ["final0_float32", "final1_float32"]
    assert stats == {"calls_checked": 2, "calls_passed": 2, "timed_calls_checked": 0}


def test_no_result_is_an_error_that_never_repeats_the_stderr() -> None:
    verdict, reasons, rows, _ = judge(runner(None, exit_code=-9, timed_out=True), CASES, "n1")
    assert (verdict, rows) == ("error", [])
    assert reasons == [{"code": "runner_failed", "detail": "runner exited with -9 (timeout)"}]
    _, reasons, _, _ = judge(runner(None, exit_code=1), CASES, "n1")
    assert reasons[0]["detail"] == "runner exited with 1"


def test_a_runner_error_is_an_error_with_its_reason() -> None:
    verdict, reasons, _, _ = judge(runner({"status": "error", "reason": "oom"}), CASES, "n1")
    assert (verdict, reasons) == ("error", [{"code": "runner_failed", "detail": "oom"}])
    _, reasons, _, _ = judge(runner({"status": "error"}), CASES, "n1")
    assert reasons[0]["detail"] == "runner error"


def test_a_refused_sandbox_is_the_hosts_own_text() -> None:
    verdict, reasons, _, _ = judge(runner(raw(error_code="sandbox_unavailable")), CASES, "n1")
    assert (verdict, reasons) == (
        "error",
        [{"code": "sandbox_unavailable", "detail": SANDBOX_REFUSED}],
    )


def test_a_sandbox_that_did_not_start_is_the_hosts_error_not_a_rejection() -> None:
    why = "candidate: the sandbox did not start: OSError: " + "x" * 500
    verdict, reasons, rows, _ = judge(
        runner(raw(error_code="sandbox_failed", error=why)), CASES, "n1"
    )
    assert (verdict, reasons, rows) == (
        "error",
        [{"code": "sandbox_failed", "detail": why[:400]}],
        [],
    )


def test_a_result_without_this_verifys_nonce_is_forged() -> None:
    verdict, reasons, _, _ = judge(runner(raw(gpu_case(), gpu_case())), CASES, "n2")
    assert (verdict, reasons) == ("error", [{"code": "forged_result", "detail": "nonce mismatch"}])
    result = raw(gpu_case(), gpu_case())
    del result["nonce"]
    assert judge(runner(result), CASES, "n1")[0] == "error"


def test_import_findings_and_a_run_error_reject() -> None:
    load = {"candidate": {"codes": [["monkey_patch", "timer replaced"]]}}
    verdict, reasons, _, _ = judge(runner(raw(gpu_case(), gpu_case(), load=load)), CASES, "n1")
    assert (verdict, reasons) == (
        "rejected", [{"code": "monkey_patch", "detail": "at import: timer replaced"}],
    )  # fmt: skip
    result = raw(gpu_case(), gpu_case(), error="x" * 500)
    verdict, reasons, _, _ = judge(runner(result), CASES, "n1")
    assert (verdict, codes(reasons)) == ("rejected", ["candidate_crashed"])
    assert reasons[0]["detail"] == "x" * 400
    _, reasons, _, _ = judge(runner(raw(error="e", error_code="import_failed")), CASES, "n1")
    assert codes(reasons) == ["import_failed"]


def test_a_failed_case_rejects_and_the_cases_not_run_are_listed_as_failed() -> None:
    bad = gpu_case(calls=[check(passed=False, codes=[["wrong_output", "x"]])])
    verdict, reasons, rows, _ = judge(runner(raw(bad)), CASES, "n1")
    assert (verdict, codes(reasons)) == ("rejected", ["wrong_output"])
    assert [(r.name, r.passed) for r in rows] == [
        ("final0_float32", False),
        ("final1_float32", False),
    ]
    assert rows[1].reason == "not run: an earlier case was rejected"


def test_fewer_cases_than_asked_with_no_reason_is_a_runner_failure() -> None:
    verdict, reasons, rows, _ = judge(runner(raw(gpu_case())), CASES, "n1")
    assert (verdict, reasons) == ("error", [{"code": "runner_failed", "detail": "1 of 2 cases"}])
    assert len(rows) == 2 and not rows[1].passed


def test_a_void_case_makes_the_run_an_error_not_a_rejection() -> None:
    void = gpu_case(null_control={"zeros": False})
    assert judge(runner(raw(void, gpu_case())), CASES, "n1")[0] == "error"


def test_the_run_statistics_sum_over_cases() -> None:
    timed = gpu_case(None) | {"timing": {"candidate": {"samples_us": [5.0], "checked_calls": 3}}}
    two = gpu_case(calls=[check(), check(passed=False, codes=[["wrong_output", "x"]])])
    _, _, _, stats = judge(runner(raw(timed, two)), CASES, "n1")
    assert stats == {"calls_checked": 3, "calls_passed": 2, "timed_calls_checked": 3}


def test_the_interpreters_run_is_judged_on_checked_calls_alone() -> None:
    case = {"dtype": "float32", "calls": [check(wall_us=50.0)]}
    result = {"nonce": "n1", "env": {"meaningful": False}, "cases": [case, case]}
    verdict, reasons, rows, _ = judge(runner(result), CASES, "n1")
    assert (verdict, reasons, rows[0].median_us) == ("passed", [], 50.0)
    result["env"] = None  # no env: meaningless, so no timing is required
    assert (
        judge(
            runner(result | {"cases": [{"dtype": "float32", "calls": [check()]}] * 2}), CASES, "n1"
        )[0]
        == "passed"
    )
