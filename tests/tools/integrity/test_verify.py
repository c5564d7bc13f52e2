"""The guarded verify's incumbent comparison (integrity/verify.py `compare_incumbent`,
`incumbent_score`): a slower candidate never looks faster, an incumbent counts only when every
one of its calls passed, a new best needs >= MIN_SPEEDUP on every case. The host's judgement of
raw measurements, tested on canned measurements; no runner."""

from __future__ import annotations

from typing import Any

import pytest

from harnesslab.tools.integrity.verify import MIN_SPEEDUP, compare_incumbent, incumbent_score


def calls(role: str, walls: list[float], passed: bool = True) -> list[dict[str, Any]]:
    return [{"role": role, "kind": "check", "wall_us": w, "passed": passed} for w in walls]


def case(cand: list[float], inc: list[float] | None, *, inc_passed=True) -> dict[str, Any]:
    """A CPU-interpreter case: the parent's wall clock around each checked call."""
    out = calls("candidate", cand)
    if inc is not None:
        out += calls("incumbent", inc, inc_passed)
    return {"calls": out}


def gpu_case(cand: list[float] | None, inc: list[float] | None) -> dict[str, Any]:
    """A GPU case: replay timing records per role; the incumbent's checked calls passed."""
    timing = {}
    if cand is not None:
        timing["candidate"] = {"samples_us": cand}
    if inc is not None:
        timing["incumbent"] = {"samples_us": inc}
    return {"calls": calls("incumbent", [1.0]) + calls("candidate", [1.0]), "timing": timing}


def compare(*cases: dict[str, Any], meaningful: bool = False, **raw: Any) -> dict[str, Any]:
    return compare_incumbent({"cases": list(cases), **raw}, meaningful, "abc123")


def test_a_faster_candidate_is_faster_by_the_incumbents_time_over_its_own() -> None:
    out = compare(case([10.0, 12.0, 11.0], [22.0, 20.0, 24.0]))
    assert out["speedup"] == pytest.approx(2.0)
    assert out["faster"] is True
    assert out["cases"] == [{"candidate_us": 11.0, "incumbent_us": 22.0, "incumbent_passed": True}]
    assert (out["hash"], out["meaningful"], out["error"]) == ("abc123", False, None)


def test_a_slower_candidate_never_looks_faster() -> None:
    out = compare(case([20.0], [10.0]))
    assert out["speedup"] == pytest.approx(0.5) and out["faster"] is False


def test_the_speedup_is_the_geomean_over_cases() -> None:
    out = compare(case([10.0], [40.0]), case([10.0], [10.0]))
    assert out["speedup"] == pytest.approx(2.0) and out["faster"] is True


def test_a_new_best_needs_at_least_min_speedup() -> None:
    assert MIN_SPEEDUP == 1.01
    assert compare(case([100.0], [101.0]))["faster"] is True  # exactly 1.01
    assert compare(case([100.0], [100.9]))["faster"] is False
    assert compare(case([100.0], [100.0]))["faster"] is False


def test_an_incumbent_with_any_failed_call_is_not_compared() -> None:
    mixed = case([10.0], [40.0])
    mixed["calls"] += calls("incumbent", [40.0], passed=False)
    out = compare(mixed)
    assert out["cases"] == [{"candidate_us": 10.0, "incumbent_us": None, "incumbent_passed": False}]
    assert out["speedup"] is None and out["faster"] is False


def test_an_incumbent_without_calls_is_not_compared() -> None:
    out = compare(case([10.0], None))
    assert out["cases"][0]["incumbent_passed"] is False
    assert out["cases"][0]["incumbent_us"] is None and out["faster"] is False


def test_every_case_must_be_compared_for_a_new_best() -> None:
    out = compare(case([10.0], [40.0]), case([10.0], [40.0], inc_passed=False))
    assert out["speedup"] == pytest.approx(4.0)  # from the case that compared
    assert out["faster"] is False


def test_a_case_without_candidate_timing_has_no_ratio() -> None:
    out = compare(gpu_case(None, [40.0]), gpu_case([10.0], [20.0]), meaningful=True)
    assert out["cases"][0] == {"candidate_us": None, "incumbent_us": 40.0, "incumbent_passed": True}
    assert out["speedup"] == pytest.approx(2.0) and out["faster"] is False


def test_on_a_gpu_the_replay_timing_records_are_compared_not_the_checked_calls() -> None:
    out = compare(gpu_case([10.0, 10.0, 10.0], [30.0, 30.0, 30.0]), meaningful=True)
    assert out["cases"][0]["candidate_us"] == 10.0 and out["cases"][0]["incumbent_us"] == 30.0
    assert out["speedup"] == pytest.approx(3.0) and out["meaningful"] is True
    assert compare(gpu_case([10.0], None), meaningful=True)["cases"][0]["incumbent_us"] is None


def test_the_incumbents_error_is_carried() -> None:
    assert compare(case([1.0], [2.0]), incumbent_error="it crashed")["error"] == "it crashed"
    assert compare()["cases"] == [] and compare()["faster"] is False


def test_the_incumbent_score_is_the_sum_of_its_case_times_when_every_case_has_one() -> None:
    assert incumbent_score(compare(case([10.0], [40.0]), case([5.0], [2.5]))) == 42.5
    assert incumbent_score(compare(case([10.0], [40.0]), case([5.0], None))) is None
    assert incumbent_score(compare()) is None
    assert incumbent_score({}) is None
