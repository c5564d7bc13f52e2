"""The guarded verify times its cases in one window after every case passed its checks
(tools/gpu/verify/guard.py `time_cases`). A rejected verify therefore has cases that passed their
checks with no timing: that is a rejection, not a runner failure; a verify that rejected
nothing must have timing for every case."""

from __future__ import annotations

from typing import Any

from harnesslab.tools.execution.launcher import RunnerCall
from harnesslab.tools.integrity.verify import judge
from harnesslab.tools.task.spec import load_task

CASES = load_task("rmsnorm_gate").final.draw(7)[:2]  # type: ignore[union-attr]


def raw_case(passed: bool, timed: bool) -> dict[str, Any]:
    calls = [{"role": "candidate", "kind": "check", "passed": passed,
              "codes": [] if passed else [["wrong_output", "out of tolerance"]]}]  # fmt: skip
    case: dict[str, Any] = {"calls": calls}
    if timed:
        case["timing"] = {"candidate": {"samples_us": [10.0] * 16, "parent_wall_us": [10.0] * 16,
                                        "wake_wall_us": [1.0] * 16, "checked_calls": 32,
                                        "method": "cuda_graph_replay"}}  # fmt: skip
    return case


def verdict_of(*cases: dict[str, Any]) -> tuple[str, list[str]]:
    result = {"status": "measured", "nonce": "n", "cases": list(cases), "copy_gbps": 3000.0,
              "env": {"meaningful": True}}  # fmt: skip
    call = RunnerCall(result=result, events=[], exit_code=0, timed_out=False, stderr_tail="",
                      host="local", gpu_index=0, wall_s=0.0)  # fmt: skip
    verdict, reasons, _, _ = judge(call, CASES, "n")
    return verdict, [r["code"] for r in reasons]


def test_a_case_checked_but_untimed_before_a_rejection_is_a_rejection() -> None:
    verdict, codes = verdict_of(raw_case(True, False), raw_case(False, False))
    assert verdict == "rejected"
    assert codes == ["wrong_output"]


def test_without_a_rejection_every_case_must_be_timed() -> None:
    verdict, codes = verdict_of(raw_case(True, False), raw_case(True, True))
    assert verdict == "error"
    assert codes == ["runner_failed"]


def test_a_crashed_case_is_a_rejection_too() -> None:
    crashed = {
        "calls": [],
        "error": "candidate: the process died",
        "error_code": "candidate_crashed",
    }
    verdict, codes = verdict_of(raw_case(True, False), crashed)
    assert verdict == "rejected"
    assert codes == ["candidate_crashed"]


def test_one_failed_call_among_passed_ones_is_a_rejection() -> None:
    mixed = raw_case(True, False)
    mixed["calls"].append({**raw_case(False, False)["calls"][0]})
    verdict, codes = verdict_of(raw_case(True, False), mixed)
    assert (verdict, codes) == ("rejected", ["wrong_output"])


def test_the_incumbents_failed_call_does_not_excuse_a_missing_timing() -> None:
    """Only the candidate's calls decide whether the verify reached its timed window."""
    timed = raw_case(True, True)
    timed["calls"].append({"role": "incumbent", "kind": "check", "passed": False, "codes": []})
    verdict, codes = verdict_of(raw_case(True, False), timed)
    assert (verdict, codes) == ("error", ["runner_failed"])
