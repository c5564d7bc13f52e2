"""The step verify's timed pass (tools/gpu/verify/step_timed.py) and its score, on the Triton CPU
interpreter's tiny decode_step (a verify costs ~4-8 s of CPU on a loaded 2-core machine).

- A passed verdict has a score: the sum over the hidden traces of the timed pass's p50 step
  latency (scores.score_of), each trace's p50 as its row's median, p95 and the steps timed in
  its "all" bucket; the ledger records that score like a kernel verify's (the best pointer
  moves). On the interpreter the timing is not meaningful and the verdict says so.
- The timed pass is checked like the checked passes: a step that is right there but gives wrong
  logits only in the timed pass is rejected (wrong_output), and so is one whose logits are right
  in the timed pass but that leaves the harness's cache unwritten there (wrong_kv_cache). Both
  candidates tell the passes apart by the op the verify's child serves (a frame up the stack).
- The time is the step's: a step that sleeps scores higher than the honest one (an ordering,
  never an absolute time).
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import verify_step
from harnesslab.tools.integrity.verdict import Verdict
from harnesslab.tools.state import Workspace
from harnesslab.tools.task import load_task

BASELINE = load_task("decode_step").workspace_template / "kernel.py"
CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "step"
STEPS = {"final0_float16": 6, "final1_float16": 9, "final2_bfloat16": 9}  # the interpreter's

# Which op of the verify's child (step_child.py) runs this call: the candidate looks up the
# stack, as any candidate that knows this repository could.
IN_TIMED_PASS = """

import sys as _sys


def _timed():
    f = _sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "timed_step":
            return True
        f = f.f_back
    return False
"""


def honest_as(name: str, source: Path = BASELINE) -> str:
    """`source`'s step renamed `name` (a candidate built on it calls it)."""
    return source.read_text().replace("\ndef step(state", f"\ndef {name}(state")


def verify(tmp_path: Path, kernel: str) -> tuple[Workspace, Verdict]:
    return verify_step(tmp_path, kernel)


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, Verdict]:
    return verify(tmp_path_factory.mktemp("honest"), BASELINE.read_text())


def test_a_passed_step_verdict_is_scored_by_the_sum_of_its_traces_p50(honest) -> None:
    ws, v = honest
    assert v.verdict == "passed", v.reasons
    rows = v.result.cases
    assert {r.name: r.buckets[0].steps for r in rows if r.buckets} == STEPS
    for r in rows:
        (whole,) = r.buckets or []
        assert whole.bucket == "all" and r.median_us == whole.p50_us and r.median_us > 0
        assert whole.p95_us is not None and whole.p95_us >= whole.p50_us
        assert whole.checked_steps == 2 * STEPS[r.name]  # the two checked passes
    assert v.score_us == math.fsum(r.median_us for r in rows if r.median_us) > 0
    assert v.result.score_us == v.score_us and v.is_new_best
    assert not v.meaningful and "speed" in v.unverified  # the interpreter's clock
    (rec,) = ws.ledger().records()
    assert rec["score"] == v.score_us and rec["status"] == "passed" and rec["mode"] == "final"
    best = ws.ledger().best("final", case_set=v.case_set)
    assert best is not None and best["score"] == v.score_us


def test_a_step_wrong_only_in_the_timed_pass_is_rejected(tmp_path: Path) -> None:
    kernel = (
        honest_as("_honest")
        + IN_TIMED_PASS
        + """

def step(state, tokens):
    out = _honest(state, tokens)
    return out + 1.0 if _timed() else out
"""
    )
    _, v = verify(tmp_path, kernel)
    assert v.verdict == "rejected" and v.score_us is None, v.reasons
    assert v.reasons[0]["code"] == "wrong_output" and "timed pass" in v.reasons[0]["detail"]


def test_a_step_that_leaves_the_cache_unwritten_only_in_the_timed_pass_is_rejected(
    tmp_path: Path,
) -> None:
    """The corpus's unwritten_kv_cache (right logits, the harness's cache never written) in the
    timed pass only: only the cache's check after the timed pass can see it."""
    kernel = (
        honest_as("_unwritten", CORPUS / "unwritten_kv_cache.py")
        + honest_as("_honest")
        + IN_TIMED_PASS
        + """

def step(state, tokens):
    return _unwritten(state, tokens) if _timed() else _honest(state, tokens)
"""
    )
    _, v = verify(tmp_path, kernel)
    assert v.verdict == "rejected" and v.score_us is None, v.reasons
    assert v.reasons[0]["code"] == "wrong_kv_cache", v.reasons
    assert "after the timed pass" in v.reasons[0]["detail"]


def test_a_step_that_sleeps_scores_higher_than_the_honest_one(tmp_path: Path, honest) -> None:
    kernel = (
        honest_as("_honest")
        + """

import time as _time


def step(state, tokens):
    _time.sleep(0.03)
    return _honest(state, tokens)
"""
    )
    _, slow = verify(tmp_path, kernel)
    _, fast = honest
    assert slow.verdict == "passed" and fast.verdict == "passed", slow.reasons
    assert slow.score_us is not None and fast.score_us is not None
    assert slow.score_us > fast.score_us
    for a, b in zip(slow.result.cases, fast.result.cases, strict=True):
        assert a.median_us is not None and b.median_us is not None and a.median_us > b.median_us
