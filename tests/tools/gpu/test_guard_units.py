"""The guarded verify's trusted parent (tools/gpu/verify/guard.py) rule by rule, on the CPU and without
a sandbox: how one call is judged from the candidate's reply (codes only) and this process's own
checks, which texts it keeps of what the candidate sent, what a null output must do, which
inputs a recording depends on, and what an incumbent's failure costs (the comparison, never the
verdict). A Verify is built without its __init__ (no runner, no lock, no children): each test
sets the few attributes the method it calls reads. The whole guarded verify runs in
tests/tools/integrity/test_judge.py and test_cheats.py.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import correctness
from harnesslab.tools.gpu.verify import guard
from harnesslab.tools.gpu.verify.guard_kid import KidFailed

TOL = {"atol": 1e-3, "rtol": 1e-3}
RT = types.SimpleNamespace(compare=correctness.compare)


class Double:
    """A reference: twice its input, in fp32, of the input's shape."""

    @staticmethod
    def reference(x: Any, *args: Any, **kwargs: Any) -> Any:
        return x.float() * 2

    @staticmethod
    def output_spec(x: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return tuple(x.shape), torch.float32


def variant(kind: str = "check", x: Any = None, *rest: Any, **kwargs: Any) -> guard.Variant:
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) if x is None else x
    return guard.Variant(kind, [x, *rest], kwargs, torch, Double)


def verify(*kids: Any) -> guard.Verify:
    v = guard.Verify.__new__(guard.Verify)
    v.torch, v.rt, v.kids = torch, RT, list(kids)
    return v


def plain(**extra: Any) -> dict[str, Any]:
    """A reply of a call that ran one of the candidate's kernels and copied its output."""
    return {"plain": True, "own_launches": 1, "copied": True, **extra}


def judge(reply: dict[str, Any], out: Any = "right", var: guard.Variant | None = None,
          inputs: list[Any] | None = None) -> dict[str, Any]:  # fmt: skip
    var = var or variant()
    if isinstance(out, str):
        out = var.expected.clone()
    if inputs is None:  # the inputs as the call left them: unchanged
        inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in var.pristine]
    return verify().judge_call(reply, out, var, TOL, "check call 0", inputs)


def codes(call: dict[str, Any]) -> list[str]:
    return [c[0] for c in call["codes"]]


# -- what is kept of the candidate's reply -------------------------------------------------------
def test_child_codes_keeps_known_codes_with_the_harness_text() -> None:
    """Rule: only codes the harness knows are kept, each with a sentence composed here."""
    reply = {"codes": ["torch_compute", "made_up", 7, "side_stream", "HIDDEN 4096"]}
    got = guard.child_codes(reply, "at import")
    assert [c for c, _ in got] == ["torch_compute", "side_stream"]
    assert got[0][1] == f"at import: {guard.CHILD_CODES['torch_compute']} (seen in the " \
        "candidate's process)"  # fmt: skip
    assert guard.child_codes({"codes": "torch_compute"}, "x") == []
    assert guard.child_codes({"codes": [["torch_compute"], {"a": 1}]}, "x") == []  # unhashable
    assert guard.child_codes({}, "x") == []


@pytest.mark.parametrize(
    "kind, shown",
    [
        ("ValueError", "ValueError"),
        ("torch.cuda.OutOfMemoryError", "torch.cuda.OutOfMemoryError"),
        ("my_mod.Err_2", "my_mod.Err_2"),
        ("E" * 80, "E" * 80),
        ("E" * 81, "CandidateDefinedError"),
        ("Shape 4096x17", "CandidateDefinedError"),
        ("a-b", "CandidateDefinedError"),
        ("", ""),
        (None, ""),
        (3, ""),
    ],
)
def test_error_text_keeps_only_a_short_dotted_name(kind: Any, shown: str) -> None:
    """Rule: the exception's name is kept when it is a dotted identifier of at most 80
    characters; anything else could carry what the candidate chose to say."""
    assert guard.error_text({"error": kind}) == shown


# -- the checks of one output --------------------------------------------------------------------
def test_output_check_reasons_carry_no_figures() -> None:
    """Rule: a failed check says which kind of failure, with no size, index or error value."""
    exp = torch.ones(2, 3)
    spec = ((2, 3), torch.float32)
    assert guard.output_check(RT, torch, exp.clone(), exp, TOL, spec)[:2] == (True, "")
    shape = "output shape or dtype differs from the reference's"
    assert guard.output_check(RT, torch, torch.ones(3, 2), exp, TOL, spec)[:2] == (False, shape)
    assert guard.output_check(RT, torch, exp.half(), exp, TOL, spec)[:2] == (False, shape)
    nan = exp.clone()
    nan[1, 2] = float("nan")
    unwritten = "output has NaN or Inf values (unwritten or overflowed)"
    assert guard.output_check(RT, torch, nan, exp, TOL, spec)[:2] == (False, unwritten)
    inf = exp.clone()
    inf[0, 0] = float("inf")
    assert guard.output_check(RT, torch, inf, exp, TOL, spec)[:2] == (False, unwritten)
    off = exp.clone()
    off[0, 1] = 5.0
    ok, why, stats = guard.output_check(RT, torch, off, exp, TOL, spec)
    assert (ok, why) == (False, "output out of tolerance")
    assert stats["max_abs_err"] == pytest.approx(4.0)  # the figure stays for the operator


def test_null_control_zeros_and_an_input_copy_must_fail() -> None:
    """Rule: a checker that accepts zeros or a copy of the input proves nothing for the case."""
    x = torch.arange(1, 7, dtype=torch.float32).reshape(2, 3)
    spec = ((2, 3), torch.float32)
    assert guard.null_control(torch, [x], x * 2, TOL, spec) == {
        "zeros_rejected": True, "input_copy_rejected": True}  # fmt: skip
    assert guard.null_control(torch, [x], torch.zeros(2, 3), TOL, spec) == {
        "zeros_rejected": False, "input_copy_rejected": True}  # fmt: skip
    assert guard.null_control(torch, [x], x.clone(), TOL, spec) == {
        "zeros_rejected": True, "input_copy_rejected": False}  # fmt: skip


def test_null_control_copies_the_first_input() -> None:
    x, y = torch.ones(2, 3), torch.full((2, 3), 5.0)
    spec = ((2, 3), torch.float32)
    got = guard.null_control(torch, [x, y], x.clone(), TOL, spec)
    assert got == {"zeros_rejected": True, "input_copy_rejected": False}
    got = guard.null_control(torch, [torch.ones(6), y], y.clone(), TOL, spec)
    assert got == {"zeros_rejected": True, "input_copy_rejected": True}


def test_null_control_an_input_of_another_shape_is_not_copied() -> None:
    """The input copy is the input only when it has the output's shape (else zeros)."""
    x = torch.arange(1, 7, dtype=torch.float32)
    spec = ((2, 3), torch.float32)
    got = guard.null_control(torch, [x], x.reshape(2, 3), TOL, spec)
    assert got == {"zeros_rejected": True, "input_copy_rejected": True}
    got = guard.null_control(torch, [x], torch.zeros(2, 3), TOL, spec)
    assert got == {"zeros_rejected": False, "input_copy_rejected": False}


def test_null_control_uses_the_checkers_tolerance_at_its_boundary() -> None:
    """Rule: accepted means within atol + rtol * |expected|, the boundary included."""
    tol = {"atol": 0.25, "rtol": 0.5}
    spec = ((1,), torch.float32)
    at = torch.tensor([0.5])  # zeros are 0.5 off, the bound is 0.25 + 0.5 * 0.5 = 0.5
    assert guard.null_control(torch, [torch.ones(2)], at, tol, spec)["zeros_rejected"] is False
    edge = torch.tensor([1.5])  # the bound is 1.0: zeros (1.5 off) fail, the copy (0.5) passes
    got = guard.null_control(torch, [torch.ones(1)], edge, tol, spec)
    assert got == {"zeros_rejected": True, "input_copy_rejected": False}


def test_null_control_an_empty_output_voids_nothing() -> None:
    """An empty expected output has nothing to get wrong: both count as rejected."""
    spec = ((0, 3), torch.float32)
    got = guard.null_control(torch, [torch.ones(0, 3)], torch.ones(0, 3), TOL, spec)
    assert got == {"zeros_rejected": True, "input_copy_rejected": True}


@pytest.mark.parametrize(
    "kind, precision",
    [
        ("precision", True),
        ("precision:large_magnitude", True),
        ("edge:wide_range", True),
        ("edge:tiny_values", True),
        ("edge:big_magnitude", True),
        ("edge:zero_rows", False),
        ("edge:odd_sizes", False),
        ("check", False),
        ("recheck", False),
        ("edge:a:range", True),
        ("edge:range:a", True),
    ],
)
def test_precision_kind(kind: str, precision: bool) -> None:
    """Rule: precision inputs (and task edges named for range, tiny or magnitude) fail as
    `precision`; every other input fails as `wrong_output`."""
    assert guard._precision_kind(kind) is precision


# -- what a recording depends on -----------------------------------------------------------------
def test_signature_names_shapes_dtypes_scalars_and_kwargs() -> None:
    """Rule: two variants share a recording only when every shape, dtype and value agrees."""
    x = torch.ones(2, 3)
    sig = variant("check", x, 4, None, b=1, a=2).signature()
    assert sig == 'T[2, 3]:float32|4|None|{"a": 2, "b": 1}'
    assert variant("check", x, 4, None, a=2, b=1).signature() == sig
    assert variant("check", x.half(), 4, None, b=1, a=2).signature() != sig
    assert variant("check", torch.ones(3, 2), 4, None, b=1, a=2).signature() != sig
    assert variant("check", x, 5, None, b=1, a=2).signature() != sig
    typed = variant("check", x, dtype=torch.float16).signature()  # a value JSON cannot hold
    assert typed == 'T[2, 3]:float32|{"dtype": "torch.float16"}'


def test_arg_specs_describe_tensors_and_plain_values_only() -> None:
    """Rule: a replayed call's inputs are tensors (shape, dtype) and plain scalars; anything
    else is refused."""
    v = variant("check", torch.ones(2, 3, dtype=torch.float16), 3, 0.5, True, None)
    assert guard.arg_specs(torch, v) == [
        {"tensor": {"shape": [2, 3], "dtype": "float16"}},
        {"value": 3}, {"value": 0.5}, {"value": True}, {"value": None},
    ]  # fmt: skip
    with pytest.raises(TypeError, match="unsupported input argument type str"):
        guard.arg_specs(torch, variant("check", torch.ones(1), "x"))


# -- judging one call -----------------------------------------------------------------------------
def test_a_right_call_passes_with_its_error_figures() -> None:
    call = judge(plain())
    assert call == {"passed": True, "codes": [], "max_abs_err": 0.0, "max_rel_err": 0.0}


def test_a_raised_call_is_candidate_error_and_nothing_more() -> None:
    """Rule: a call that raised is candidate_error (the name only), not also an unwritten or a
    non-plain output, nor a missing launch."""
    call = judge({"plain": False, "error": "ValueError", "own_launches": 0}, out=None)
    assert call["codes"] == [["candidate_error", "check call 0: the entry function raised "
                              "ValueError"]]  # fmt: skip
    assert call["passed"] is False
    call = judge({"plain": True, "error": "Boom 4096", "own_launches": 0}, out=None)
    assert codes(call) == ["candidate_error"]
    assert "CandidateDefinedError" in call["codes"][0][1] and "4096" not in call["codes"][0][1]


def test_the_childs_codes_are_kept() -> None:
    assert codes(judge(plain(codes=["host_compute"]))) == ["host_compute"]


@pytest.mark.parametrize(
    "extra, code",
    [
        ({"plain": False}, "not_plain_tensor"),
        ({"aliases_input": True}, "output_aliases_input"),
        ({"reused_output": True}, "output_reused"),
        ({"own_launches": 0}, "no_triton_launch"),
        ({"own_launches": None}, "no_triton_launch"),
    ],
)
def test_each_reported_breach_rejects_the_call(extra: dict[str, Any], code: str) -> None:
    """Rule: a non-plain output, an output sharing an input's or an earlier call's storage, a
    call that launched none of the candidate's kernels: each is its code, and the call fails."""
    call = judge(plain(**extra))
    assert code in codes(call) and call["passed"] is False


def test_a_non_plain_output_is_not_also_a_missing_launch() -> None:
    assert codes(judge(plain(plain=False, own_launches=0))) == ["not_plain_tensor"]


def test_an_empty_output_needs_no_launch() -> None:
    """Nothing to compute: a call on an empty input may launch no kernel."""
    var = variant("check", torch.ones(0, 3))
    assert judge(plain(own_launches=0), var=var)["passed"] is True


def test_a_wrong_output_fails_as_its_kind() -> None:
    """Rule: a wrong output on a precision input is `precision`, on any other `wrong_output`."""
    for kind, code in (("check", "wrong_output"), ("edge:zero_rows", "wrong_output"),
                       ("precision", "precision"), ("edge:wide_range", "precision")):  # fmt: skip
        var = variant(kind)
        call = judge(plain(), out=var.expected + 1, var=var)
        assert call["codes"] == [[code, "check call 0: output out of tolerance"]]
        assert call["max_abs_err"] == pytest.approx(1.0)
        assert call["max_rel_err"] is not None and call["max_rel_err"] > 0


def test_an_output_that_never_reached_the_checker_is_wrong() -> None:
    """Rule: a plain call that raised nothing but whose output was not copied fails."""
    call = judge(plain(copied=False), out=None)
    assert call["codes"] == [["wrong_output", "check call 0: the output never reached the checker"]]
    assert codes(judge({"plain": False, "own_launches": 1}, out=None)) == ["not_plain_tensor"]


def test_a_changed_input_is_named_by_its_position() -> None:
    """Rule: every tensor input is compared with its pristine copy; scalars are not tensors."""
    var = variant("check", torch.ones(2, 3), 7, torch.zeros(4))
    now = [var.pristine[0].clone(), 8, var.pristine[2].clone()]
    assert judge(plain(), var=var, inputs=now)["passed"] is True
    now[2][1] = 1.0
    call = judge(plain(), var=var, inputs=now)
    assert call["codes"] == [["inputs_modified", "check call 0: input(s) [2] changed by the call"]]


# -- the incumbent ---------------------------------------------------------------------------------
class FakeKid:
    def __init__(self, role: str) -> None:
        self.role, self.closed = role, False

    def close(self) -> None:
        self.closed = True


def fail(role: str) -> KidFailed:
    return KidFailed("timeout", "no answer in time", role)


def test_an_incumbents_failure_loses_the_comparison_only() -> None:
    """Rule: the incumbent is closed and dropped and its failure recorded; the candidate stays."""
    cand, inc = FakeKid("candidate"), FakeKid("incumbent")
    v, result = verify(cand, inc), {}
    v.lose_incumbent(result, fail("incumbent"))
    assert result == {"incumbent_error": "timeout: no answer in time"}
    assert v.kids == [cand] and inc.closed and not cand.closed


def test_a_candidates_failure_goes_on_to_the_verdict() -> None:
    cand, inc = FakeKid("candidate"), FakeKid("incumbent")
    v, result = verify(cand, inc), {}
    exc = fail("candidate")
    with pytest.raises(KidFailed) as raised:
        v.lose_incumbent(result, exc)
    assert raised.value is exc
    assert result == {} and v.kids == [cand, inc] and not inc.closed


def test_incumbent_may_fail_swallows_only_the_incumbents_failure() -> None:
    v, result = verify(FakeKid("candidate"), FakeKid("incumbent")), {}
    with v.incumbent_may_fail(result):
        raise fail("incumbent")
    assert "incumbent_error" in result and [k.role for k in v.kids] == ["candidate"]
    with pytest.raises(KidFailed), v.incumbent_may_fail(result):
        raise fail("candidate")


def test_a_step_the_incumbent_failed_runs_again_without_it() -> None:
    """Rule: the attempt is run again once, without the incumbent; its answer is returned."""
    v, result = verify(FakeKid("candidate"), FakeKid("incumbent")), {}
    runs: list[list[str]] = []

    def attempt() -> str:
        runs.append([k.role for k in v.kids])
        if len(runs) == 1:
            raise fail("incumbent")
        return "second"

    assert v.without_failed_incumbent(result, attempt) == "second"
    assert runs == [["candidate", "incumbent"], ["candidate"]]
    assert v.without_failed_incumbent(result, lambda: "first") == "first"


def test_a_step_the_candidate_failed_is_not_run_again() -> None:
    v, calls = verify(FakeKid("candidate"), FakeKid("incumbent")), []

    def attempt() -> None:
        calls.append(1)
        raise fail("candidate")

    with pytest.raises(KidFailed):
        v.without_failed_incumbent({}, attempt)
    assert calls == [1]


# -- the cases, in order -----------------------------------------------------------------------------
class Cases:
    """A Verify whose one_case answers scripted records: each case's calls pass or fail, or
    a role's process fails (KidFailed); time_cases' windows are recorded, not taken."""

    def __init__(self, script: list[Any], *kids: Any) -> None:
        self.v = verify(*kids)
        self.v.req = {"cases": [{"name": f"c{i}"} for i in range(len(script))]}
        self.emitted: list[dict[str, Any]] = []
        self.timed: list[Any] = []
        self.v.rt = types.SimpleNamespace(emit=self.emitted.append)
        self.v.partial = None
        self.v.env = types.SimpleNamespace(copy_gbps=lambda: 3000.0, interpret=True)
        self.v.phases = lambda name: contextlib.nullcontext()
        self.v.lock = types.SimpleNamespace(exclusive=contextlib.nullcontext)
        self.script = script
        self.v.one_case = self.one_case  # type: ignore[method-assign]

    def one_case(self, case: dict[str, Any], idx: int, memfd: Any) -> tuple[Any, Any]:
        step = self.script[idx]
        if isinstance(step, KidFailed):
            self.v.partial = {"name": case["name"], "calls": [{"role": "candidate"}]}
            raise step
        calls = [{"role": role, "passed": ok} for role, ok in step]
        roles = [k.role for k in self.v.kids]

        def timer() -> dict[str, Any]:
            self.timed.append((case["name"], roles))
            return {"timed": case["name"]}

        return {"name": case["name"], "calls": calls}, timer


def test_every_case_is_checked_then_all_are_timed_in_one_window() -> None:
    c = Cases([[("candidate", True)], [("candidate", True), ("incumbent", False)]],
              FakeKid("candidate"))  # fmt: skip
    result: dict[str, Any] = {"cases": []}
    c.v.run_cases(result, None)
    assert [r["name"] for r in result["cases"]] == ["c0", "c1"]
    assert c.emitted == [{"event": "case", "index": 0, "status": "measured"},
                         {"event": "case", "index": 1, "status": "measured"}]  # fmt: skip
    assert [r["timing"] for r in result["cases"]] == [{"timed": "c0"}, {"timed": "c1"}]
    assert result["copy_gbps"] == 3000.0


@pytest.mark.parametrize("interpret", [False, True])
def test_on_a_gpu_each_cases_inputs_are_dropped_after_its_checks(interpret: bool) -> None:
    """Rule: on a GPU one case's tensors live at a time (four verifies at once ran an H100
    out of memory holding all six), and the freed memory goes back to the device; the
    interpreter keeps them (its shared arena was sized for all of them)."""
    c = Cases([[("candidate", True)], [("candidate", True)]], FakeKid("candidate"))
    freed: list[int] = []
    c.v.env.interpret = interpret
    c.v.torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(empty_cache=lambda: freed.append(1))
    )
    c.v.variants_per_case = {0: ["v0"], 1: ["v1"]}
    c.v.run_cases({"cases": []}, None)
    if interpret:
        assert c.v.variants_per_case == {0: ["v0"], 1: ["v1"]} and freed == []
    else:
        assert c.v.variants_per_case == {} and freed == [1, 1]


def test_the_first_case_the_candidate_fails_ends_the_checks_and_nothing_is_timed() -> None:
    """Rule: a rejected candidate is not timed (it would change nothing), and the cases after
    its first failed one are not run."""
    c = Cases([[("candidate", True)], [("candidate", False)], [("candidate", True)]],
              FakeKid("candidate"))  # fmt: skip
    result: dict[str, Any] = {"cases": []}
    c.v.run_cases(result, None)
    assert [r["name"] for r in result["cases"]] == ["c0", "c1"]
    assert c.timed == [] and "timing" not in result["cases"][0]
    assert result["copy_gbps"] == 3000.0


def test_one_failed_call_of_the_candidate_fails_its_case() -> None:
    """Rule: every candidate call of a case must pass, not any one of them."""
    c = Cases([[("candidate", True), ("candidate", False)], [("candidate", True)]],
              FakeKid("candidate"))  # fmt: skip
    result: dict[str, Any] = {"cases": []}
    c.v.run_cases(result, None)
    assert [r["name"] for r in result["cases"]] == ["c0"] and c.timed == []


def test_a_candidates_process_failure_keeps_its_case_so_far() -> None:
    """Rule: the case's record so far goes to the verdict with the failure's code."""
    c = Cases([[("candidate", True)], KidFailed("timeout", "no answer in time", "candidate")],
              FakeKid("candidate"))  # fmt: skip
    result: dict[str, Any] = {"cases": []}
    with pytest.raises(KidFailed):
        c.v.run_cases(result, None)
    assert result["cases"][1] == {"name": "c1", "calls": [{"role": "candidate"}],
                                  "error": "no answer in time", "error_code": "timeout"}  # fmt: skip


def test_a_process_failure_before_any_record_keeps_no_calls() -> None:
    c = Cases([], FakeKid("candidate"))
    c.v.req = {"cases": [{"name": "c0"}]}

    def one_case(case: dict[str, Any], idx: int, memfd: Any) -> Any:
        raise KidFailed("candidate_crashed", "the process failed", "candidate")

    c.v.one_case = one_case  # type: ignore[method-assign]
    result: dict[str, Any] = {"cases": []}
    with pytest.raises(KidFailed):
        c.v.run_cases(result, None)
    assert result["cases"] == [
        {"calls": [], "error": "the process failed", "error_code": "candidate_crashed"}
    ]


def test_an_incumbent_that_fails_a_timing_is_dropped_and_the_timing_taken_again() -> None:
    c = Cases([[("candidate", True)]], FakeKid("candidate"), FakeKid("incumbent"))
    result: dict[str, Any] = {"cases": []}
    calls: list[list[str]] = []

    def timer() -> str:
        calls.append([k.role for k in c.v.kids])
        if len(calls) == 1:
            raise KidFailed("timeout", "slow", "incumbent")
        return "timed"

    res: dict[str, Any] = {"name": "c0"}
    c.v.time_cases(result, [(res, timer)])
    assert res["timing"] == "timed" and calls == [["candidate", "incumbent"], ["candidate"]]
    assert result["incumbent_error"] == "timeout: slow"
