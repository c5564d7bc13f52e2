"""The runner's correctness checks (tools/gpu/correctness.py) and what a failed case says
(tools/gpu/failures.py), rule by rule, on the CPU: each way an output can be wrong, inputs left
as they were, freed memory poisoned (on a stand-in torch that records what it is asked), the
per-case deadline, and the one-line reason.
"""

from __future__ import annotations

import math
import time
import types
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import correctness as cr
from harnesslab.tools.gpu import failures as fl

TOL = {"atol": 1e-2, "rtol": 1e-2}


def compare(out: Any, ref: Any, inputs: list[Any] | None = None, shape: Any = None,
            dtype: Any = torch.float32, tol: dict[str, float] = TOL) -> tuple[bool, str, Any]:  # fmt: skip
    shape = tuple(ref.shape) if shape is None else shape
    return cr.compare(torch, out, ref, tol, shape, dtype, inputs or [])


# -- correctness.py ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "x, kept",
    [
        (1.5, 1.5),
        (0.0, 0.0),
        (None, None),
        (math.inf, None),
        (-math.inf, None),
        (math.nan, None),
    ],
)
def test_finite_or_none(x: float | None, kept: float | None) -> None:
    """Rule: a figure that is not finite is reported as none, never as inf or nan (JSON)."""
    assert cr.finite_or_none(x) == kept


def test_dtype_of_names_the_three_task_dtypes() -> None:
    assert cr.dtype_of(torch, "float16") is torch.float16
    assert cr.dtype_of(torch, "bfloat16") is torch.bfloat16
    assert cr.dtype_of(torch, "float32") is torch.float32
    with pytest.raises(KeyError):
        cr.dtype_of(torch, "float64")


class RecordingTorch:
    """Stands for torch in poison_allocator: records the block it is asked for and its fill."""

    float16 = "f16"

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []

    def empty(self, n: int, dtype: Any, device: str) -> Any:
        self.asked.append(("empty", n, dtype, device))
        return types.SimpleNamespace(fill_=lambda v: self.asked.append(("fill", v)))


def test_poison_fills_a_cuda_block_the_size_freed_with_nan() -> None:
    """Rule: on CUDA, at least `nbytes` of fp16 NaN are allocated and filled (then freed)."""
    t = RecordingTorch()
    cr.poison_allocator(t, "cuda", 10)
    assert t.asked[0] == ("empty", 6, "f16", "cuda")  # 6 halves = 12 bytes >= 10
    assert t.asked[1][0] == "fill" and math.isnan(t.asked[1][1])
    t = RecordingTorch()
    cr.poison_allocator(t, "cuda", 1)
    assert t.asked[0][1] == 1


@pytest.mark.parametrize("device, nbytes", [("cpu", 100), ("cuda", 0), ("cuda", -4)])
def test_poison_only_on_cuda_and_for_a_size(device: str, nbytes: int) -> None:
    t = RecordingTorch()
    cr.poison_allocator(t, device, nbytes)
    assert t.asked == []


def test_compare_a_right_output_passes_with_its_figures() -> None:
    ref = torch.tensor([1.0, 2.0, 4.0])
    ok, why, stats = compare(ref + torch.tensor([0.0, 0.01, 0.0]), ref)
    assert (ok, why) == (True, "")
    assert stats["max_abs_err"] == pytest.approx(0.01, rel=1e-3)
    assert stats["max_rel_err"] == pytest.approx(0.005, rel=1e-3)
    assert stats["nan"] == 0 and stats["inf"] == 0


def test_compare_the_tolerance_boundary_is_included() -> None:
    """Rule: within atol + rtol * |ref| passes, the bound itself included."""
    tol = {"atol": 0.25, "rtol": 0.5}
    ref = torch.tensor([1.0])
    assert compare(torch.tensor([1.75]), ref, tol=tol)[0] is True  # 0.75 == 0.25 + 0.5
    assert compare(torch.tensor([0.25]), ref, tol=tol)[0] is True
    assert compare(torch.tensor([1.875]), ref, tol=tol)[0] is False
    ok, why, stats = compare(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 1.0]), tol=tol)
    assert not ok and why.startswith(
        "1 of 2 elements out of tolerance (first at [1], max abs err 2"
    )
    assert stats["worst_index"] == [1]


def test_compare_refuses_what_is_not_a_plain_tensor() -> None:
    class Sub(torch.Tensor):
        pass

    ref = torch.ones(2)
    for out in (ref.clone().as_subclass(Sub), [1.0, 1.0], None):
        ok, why, _ = compare(out, ref)
        assert not ok and why.startswith("output is ") and "plain torch.Tensor" in why


def test_compare_refuses_another_shape_or_dtype() -> None:
    ref = torch.ones(2, 3)
    ok, why, _ = compare(torch.ones(3, 2), ref)
    assert (ok, why) == (False, "wrong shape (3, 2), expected (2, 3)")
    ok, why, _ = compare(torch.ones(2, 3, dtype=torch.float16), ref)
    assert not ok and why.startswith("wrong dtype torch.float16")
    ok, _, _ = compare(torch.ones(2, 3), ref, dtype=torch.float16)
    assert not ok


def test_compare_refuses_an_output_aliasing_an_input() -> None:
    """Rule: an output that is an input's storage is refused (unless that input is empty)."""
    x = torch.ones(3)
    ok, why, _ = compare(x, torch.ones(3), inputs=[7, x])
    assert (ok, why) == (False, "output aliases an input buffer")
    assert compare(x, torch.ones(3), inputs=[x.clone()])[0] is True
    empty = torch.ones(0)
    assert compare(empty, torch.ones(0), inputs=[empty])[0] is True


def test_compare_nan_or_inf_fail_and_are_counted() -> None:
    ref = torch.ones(4)
    out = torch.tensor([1.0, math.nan, math.inf, 1.0])
    ok, why, stats = compare(out, ref)
    assert (ok, why) == (False, "output has 1 NaN and 1 Inf values")
    assert (stats["nan"], stats["inf"]) == (1, 1)
    assert stats["max_abs_err"] == 0.0  # of the finite elements
    ok, why, stats = compare(torch.full((2,), math.inf), torch.ones(2))
    assert not ok and stats["max_abs_err"] is None and stats["max_rel_err"] is None


def test_compare_relative_error_near_zero_uses_atol() -> None:
    """The relative error divides by max(|ref|, atol): a zero reference gives no infinity."""
    ok, _, stats = compare(torch.tensor([0.005]), torch.tensor([0.0]))
    assert ok and stats["max_rel_err"] == pytest.approx(0.5, rel=1e-3)
    tiny = {"atol": 0.0, "rtol": 0.5}
    ok, _, stats = compare(torch.tensor([1e-31]), torch.tensor([0.0]), tol=tiny)
    assert not ok and stats["max_rel_err"] == pytest.approx(1e-31 / 1e-30, rel=1e-3)


def test_inputs_unchanged_compares_every_snapshot() -> None:
    a, b = torch.ones(2), torch.zeros(3)
    saved = cr.snapshot_inputs(torch, [a, 5, b])
    assert saved[1] is None and saved[0] is not a and torch.equal(saved[0], a)
    assert cr.inputs_unchanged(torch, [a, 5, b], saved) is True
    b[2] = 1.0
    assert cr.inputs_unchanged(torch, [a, 5, b], saved) is False
    a2 = torch.ones(2)
    saved = cr.snapshot_inputs(torch, [a2])
    a2[0] = 2.0
    assert cr.inputs_unchanged(torch, [a2], saved) is False


# -- failures.py ------------------------------------------------------------------------------------
def test_caused_by_follows_causes_and_contexts_and_stops_on_a_cycle() -> None:
    root = fl.CaseTimeout("exceeded 1s")
    try:
        try:
            raise root
        except fl.CaseTimeout as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as e:
        wrapped = e
    assert fl.caused_by(wrapped, fl.CaseTimeout) is root
    assert fl.caused_by(wrapped, RuntimeError) is wrapped
    try:
        try:
            raise ValueError("a")
        except ValueError:
            raise KeyError("b") from None
    except KeyError as e:
        ctx = e
    assert fl.caused_by(ctx, ValueError) is not None  # the context, when no cause is set
    a, b = ValueError("a"), TypeError("b")
    a.__cause__, b.__cause__ = b, a
    assert fl.caused_by(a, KeyError) is None  # a cycle ends the search


def test_the_deadline_raises_a_case_timeout_and_clears_its_alarm() -> None:
    with pytest.raises(fl.CaseTimeout, match="exceeded 0s"), fl.deadline(0.05):
        time.sleep(2)
    with fl.deadline(0.05):
        pass
    time.sleep(0.1)  # an alarm left armed would raise here
    with fl.deadline(None):
        time.sleep(0.01)
    with fl.deadline(0):
        time.sleep(0.01)


def test_one_line_a_timeout_however_wrapped() -> None:
    try:
        try:
            raise fl.CaseTimeout("exceeded 5s")
        except fl.CaseTimeout as e:
            raise RuntimeError("interpreter") from e
    except RuntimeError as e:
        assert fl.one_line(e) == "timeout: case exceeded 5s"


def test_one_line_points_at_the_candidates_own_line() -> None:
    """Rule: the innermost frame in the candidate's folder is named by file name and line."""
    code = compile(
        "def f():\n    raise ValueError('bad\\nsecond line')\n", "/cand/kernel.py", "exec"
    )
    ns: dict[str, Any] = {}
    exec(code, ns)
    try:
        ns["f"]()
    except ValueError as e:
        assert fl.one_line(e, "/cand") == "ValueError at kernel.py:2: bad"
        assert fl.one_line(e, "/other") == "ValueError: bad"
        assert fl.one_line(e) == "ValueError: bad"


def test_one_line_a_syntax_error_names_its_file_and_line() -> None:
    try:
        compile("x = (\n", "/cand/kernel.py", "exec")
    except SyntaxError as e:
        assert fl.one_line(e).startswith("SyntaxError at kernel.py:1: ")


def test_one_line_an_empty_message() -> None:
    assert fl.one_line(ValueError("   ")) == "ValueError: "


def test_one_line_says_how_much_it_cut() -> None:
    """Rule: a long reason keeps MAX_REASON characters and says how many more there were."""
    text = fl.one_line(ValueError("x" * fl.MAX_REASON))
    full = len("ValueError: ") + fl.MAX_REASON
    assert (
        text
        == "ValueError: "
        + "x" * (fl.MAX_REASON - 12)
        + f"... ({full - fl.MAX_REASON} more characters)"
    )
    exact = "x" * (fl.MAX_REASON - len("ValueError: "))
    assert fl.one_line(ValueError(exact)) == "ValueError: " + exact


def test_one_line_adds_the_hint_for_a_known_message() -> None:
    text = fl.one_line(RuntimeError("triton: out of resource: shared memory, required 99"))
    assert text.endswith(" (hint: lower num_stages or the block size)")
    assert "hint" not in fl.one_line(RuntimeError("something else"))


def test_compare_every_answer_carries_both_figures() -> None:
    """Rule: the figures are always there (None when the output was refused before them)."""
    for out in ([1.0], torch.ones(3)):
        _, _, stats = compare(out, torch.ones(2))
        assert stats == {"max_abs_err": None, "max_rel_err": None}


def test_compare_nan_alone_or_inf_alone_fails() -> None:
    """Rule: one NaN fails the output (a NaN compares false against every tolerance), and so
    does one Inf, each said as unwritten or overflowed values."""
    ok, why, _ = compare(torch.tensor([1.0, math.nan]), torch.ones(2))
    assert (ok, why) == (False, "output has 1 NaN and 0 Inf values")
    ok, why, _ = compare(torch.tensor([1.0, -math.inf]), torch.ones(2))
    assert (ok, why) == (False, "output has 0 NaN and 1 Inf values")


def test_compare_names_the_first_element_out_of_tolerance() -> None:
    out = torch.tensor([[1.0, 1.0], [3.0, 9.0]])
    ok, why, stats = compare(out, torch.ones(2, 2))
    assert not ok and "2 of 4 elements out of tolerance (first at [1, 0]" in why
    assert stats["worst_index"] == [1, 1]


def test_caused_by_follows_an_explicit_cause_without_context() -> None:
    late = fl.CaseTimeout("exceeded 3s")
    outer = RuntimeError("x")
    outer.__cause__ = late
    assert outer.__context__ is None and fl.caused_by(outer, fl.CaseTimeout) is late


def test_the_deadline_leaves_no_alarm_and_the_old_handler() -> None:
    """Rule: after the case, the timer is disarmed and the previous SIGALRM handler is back."""
    import signal

    def mine(signum: int, frame: Any) -> None:
        raise AssertionError("the case's alarm fired after the case")

    old = signal.signal(signal.SIGALRM, mine)
    try:
        with fl.deadline(5):
            assert signal.getsignal(signal.SIGALRM) is not mine
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, old)


def test_no_deadline_where_there_is_no_alarm_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    monkeypatch.delattr(signal, "SIGALRM")
    with fl.deadline(5):
        pass


def test_one_line_names_the_innermost_candidate_frame() -> None:
    src = "def f():\n    raise ValueError('bad')\n\ndef g():\n    f()\n"
    ns: dict[str, Any] = {}
    exec(compile(src, "/cand/kernel.py", "exec"), ns)
    try:
        ns["g"]()
    except ValueError as e:
        assert fl.one_line(e, "/cand") == "ValueError at kernel.py:2: bad"


def test_one_line_a_syntax_error_without_a_file() -> None:
    assert fl.one_line(SyntaxError("bad")) == "SyntaxError: bad"


def test_one_line_reasons_are_cut_at_two_thousand_characters() -> None:
    head = "ValueError: "
    assert fl.one_line(ValueError("x" * (2000 - len(head)))) == head + "x" * (2000 - len(head))
    assert fl.one_line(ValueError("x" * (2001 - len(head)))).endswith("... (1 more characters)")


def test_one_line_the_interpreters_mask_hint() -> None:
    text = fl.one_line(ValueError("mask has unsupported dtype int1"))
    assert "(hint: the Triton CPU interpreter (3.9) rejects a vector mask" in text
