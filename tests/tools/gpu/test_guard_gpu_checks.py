"""The GPU verify's parent side (tools/gpu/verify/guard_gpu.py) on the CPU: the untimed checks of
every call (each replayed on its own arena and judged here, poison and changed inputs, what the
recorded output says) and one case with its record (who gets a timer: only what passed every
call). With the stand-ins of guard_gpu_support.py; the real record -> replay -> check -> time
path: tests/gpu/ (needs a GPU)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu import guard_gpu_support as support
from harnesslab.tests.tools.gpu.guard_gpu_support import (
    RECORDING,
    TOL,
    Driver,
    Kid,
    Lock,
    Replayer,
    cpu_count_bad,
    double,
    f32,
    variant,
    verify,
)
from harnesslab.tools.gpu.verify import guard_gpu, guard_kid

drv = support.drv  # the fixtures


def test_every_call_is_replayed_on_its_own_arena_and_judged_here(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    variants = [variant("dev"), variant("edge", seed=2)]
    recs = {v.signature(): RECORDING for v in variants}
    rec: dict[str, Any] = {"calls": []}
    guard_gpu.check_calls(vf, rp, rec, variants, recs, TOL, 3)
    assert rec["calls"] == [
        {"passed": True, "role": "candidate", "kind": "dev", "set": 0, "wall_us": 1.0},
        {"passed": True, "role": "candidate", "kind": "edge", "set": 1, "wall_us": 1.0},
    ]
    assert rp.ops() == ["kernels", "arena", "program", "run", "close_arena",
                        "arena", "program", "run", "close_arena"]  # fmt: skip
    assert rp.asked[0]["kernels"] == [RECORDING["kernels"]["k0"]] and vf.loaded == {
        "candidate": {"k0"}
    }
    ids = [m["id"] for m in rp.asked if m["op"] == "program"]
    assert ids == ["c3_0", "c3_1"]
    prog = rp.asked[2]
    assert prog["steps"] == RECORDING["steps"] and prog["calls"] == [rp.programs["c3_0"][0]]
    assert {m["op"]: m.get("calls") for m in rp.asked if m["op"] == "run"} == {"run": [0]}
    first = vf.judged[0]
    assert first["facts"] == {"plain": True, "own_launches": 1}
    assert torch.equal(first["out"], variants[0].pristine[0] * 2) and first["where"] == "dev call 0"
    assert torch.equal(first["now"][0], variants[0].pristine[0]) and first["tol"] is TOL
    assert len(drv.freed) == 2 and len(drv.sizes) == 2


def test_an_unwritten_output_is_poison_and_a_changed_input_is_seen(drv: Driver) -> None:
    def lazy(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
        f32(u8, binding, "in0").zero_()  # writes no output, changes its input

    rp = Replayer(drv, "candidate", lazy)
    vf = verify(drv, rp)
    v = variant()
    rec: dict[str, Any] = {"calls": []}
    guard_gpu.check_calls(vf, rp, rec, [v], {v.signature(): RECORDING}, TOL, 0)
    judged = vf.judged[0]
    assert judged["out"].isnan().all() and judged["now"][0].eq(0).all()
    assert rec["calls"][0]["passed"] is False


@pytest.mark.parametrize(
    ("output", "steps", "facts", "out"),
    [
        ({"empty": True, "shape": [0, 3], "dtype": "float16"}, [{"op": "x"}], {"plain": True, "own_launches": 1}, (0, 3)),
        ({"buf": "in0", "offset": 0, "shape": [64], "strides": [1], "dtype": "float32"}, [{"op": "x"}],
         {"plain": True, "own_launches": 1, "aliases_input": True}, None),
        (None, [{"op": "x"}], {"plain": False, "own_launches": 1}, None),
        (RECORDING["output"], [], {"plain": True, "own_launches": 0}, (64,)),
    ],
)  # fmt: skip
def test_what_the_recorded_output_says_reaches_the_judge(
    drv: Driver, output: Any, steps: list[Any], facts: dict[str, Any], out: Any
) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    v = variant()
    r = {**RECORDING, "output": output, "steps": steps}
    guard_gpu.check_calls(vf, rp, {"calls": []}, [v], {v.signature(): r}, TOL, 0)
    judged = vf.judged[0]
    assert judged["facts"] == facts
    assert (None if judged["out"] is None else tuple(judged["out"].shape)) == out
    if out == (0, 3):
        assert judged["out"].dtype == torch.float16


def test_an_empty_expected_output_with_no_steps_is_still_its_own_launch(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    v = variant(n=0)
    r = {**RECORDING, "output": {"empty": True, "shape": [0], "dtype": "float32"}, "steps": []}
    guard_gpu.check_calls(vf, rp, {"calls": []}, [v], {v.signature(): r}, TOL, 0)
    assert vf.judged[0]["facts"]["own_launches"] == 1


def test_kernels_are_sent_to_a_replayer_once(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    k1 = {"id": "k1", "name": "other"}
    assert guard_gpu._load(vf, "candidate", {"k0": RECORDING["kernels"]["k0"]}) is rp
    guard_gpu._load(vf, "candidate", {"k0": RECORDING["kernels"]["k0"], "k1": k1})
    guard_gpu._load(vf, "candidate", {"k1": k1})
    assert [m["kernels"] for m in rp.asked] == [[RECORDING["kernels"]["k0"]], [k1]]


def test_a_failed_replay_still_frees_every_arena(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    rp.fail = "run"
    vf = verify(drv, rp)
    vs = [variant(), variant("edge", seed=4)]
    with pytest.raises(guard_kid.KidFailed):
        guard_gpu.check_calls(vf, rp, {"calls": []}, vs, {v.signature(): RECORDING for v in vs}, TOL, 0)  # fmt: skip
    assert len(drv.freed) == 2


def test_a_case_records_checks_and_hands_a_timer_only_to_what_passed(
    drv: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    good = {"recording": {"kernels": [], "steps": [{"op": "memset", "buf": "a0", "offset": 0, "width": 1,
                                                    "value": 0, "count": 1}],
                          "output": RECORDING["output"], "allocs": [{"nbytes": 256}]}}  # fmt: skip
    half = {"recording": {**good["recording"], "output": {**RECORDING["output"], "shape": [32]}}}
    cand, inc = (
        Kid("candidate", good, half),
        Kid("incumbent", {"error": "KeyError"}, {"error": "KeyError"}),
    )
    reps = {"candidate": Replayer(drv, "candidate"), "incumbent": Replayer(drv, "incumbent")}
    vf = verify(drv)
    vf.kids, vf.replayers, vf.lock = [cand, inc], reps, Lock()
    phases: list[str] = []

    @contextmanager
    def phase(name: str) -> Any:
        phases.append(name)
        yield

    vf.phases = phase
    vf.case_record = lambda case, variants: {"name": case["name"], "calls": []}
    case = {"name": "c", "dtype": "float32", "shape": {"n": 64}}
    rec, timer = guard_gpu.gpu_case(vf, case, 5, [variant(), variant("edge", n=32)])
    assert phases == ["record", "check"] and vf.lock.held == 1
    assert vf.ev.salts == [5 * 1009 + 991]
    assert [(c["role"], c["kind"], c["passed"]) for c in rec["calls"]] == [
        ("incumbent", "record", False), ("candidate", "dev", True), ("candidate", "edge", True),
        ("candidate", "recheck", True)]  # fmt: skip
    assert rec["calls"][0]["set"] == -1 and rec["calls"][0]["codes"][0][0] == "candidate_error"
    assert [m["op"] for m in cand.asked] == ["record", "record", "end_case"]  # two signatures
    assert inc.asked[-1] == {"op": "end_case"}
    out = timer()  # at the first variant's shape (the case's), not the edge's
    assert set(out) == {"candidate"} and out["candidate"]["bad_calls"] == 0
    vf.kids = [inc, cand]  # the order of the verify's roles, not the timer's, at the window
    assert set(timer()) == {"candidate"}


def test_a_case_the_candidate_fails_has_no_timer(drv: Driver) -> None:
    cand = Kid("candidate", {"error": "KeyError"}, {"error": "KeyError"})
    vf = verify(drv)
    vf.kids, vf.lock = [cand], Lock()
    vf.phases = lambda name: Lock().work()
    vf.case_record = lambda case, variants: {"calls": []}
    rec, timer = guard_gpu.gpu_case(vf, {"dtype": "float32", "shape": {"n": 64}}, 0, [variant()])
    assert timer is None and rec["calls"][0]["role"] == "candidate"


def test_a_candidate_must_pass_every_call_to_be_timed_and_so_must_an_incumbent(
    drv: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    good = {"recording": {"kernels": [], "steps": [], "output": RECORDING["output"], "allocs": [{"nbytes": 256}]}}  # fmt: skip

    def wrong_second() -> Callable[..., None]:
        """Right on its first call, wrong on its second."""
        runs: list[int] = []

        def kernel(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
            runs.append(1)
            double(u8, binding, call)
            if len(runs) == 2:
                f32(u8, binding, "a0")[0] += 1

        return kernel

    def case(kernels: dict[str, Any], kids: list[str]) -> Any:
        vf = verify(drv)
        vf.kids = [Kid(role, good, good) for role in kids]
        vf.replayers = {role: Replayer(drv, role, k) for role, k in kernels.items()}
        vf.lock, vf.phases = Lock(), lambda name: Lock().work()
        vf.case_record = lambda case, variants: {"calls": []}
        return vf, guard_gpu.gpu_case(vf, {"dtype": "float32", "shape": {"n": 64}}, 1, [variant()])

    _, (rec, timer) = case({"candidate": wrong_second()}, ["candidate"])
    assert [c["passed"] for c in rec["calls"]] == [True, False] and timer is None
    vf, (rec, timer) = case(
        {"candidate": double, "incumbent": wrong_second()}, ["candidate", "incumbent"]
    )
    assert set(timer()) == {"candidate"}
    vf, (rec, timer) = case({"candidate": double, "incumbent": double}, ["candidate", "incumbent"])
    vf.kids = vf.kids[:1]  # the incumbent was dropped before the window
    assert set(timer()) == {"candidate"}
