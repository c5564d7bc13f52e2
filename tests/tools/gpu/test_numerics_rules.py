"""The rules of the generic adversarial inputs (tools/gpu/numerics.py) one by one, on small fake
references: which size each edge gets, what a task's [numerics] table changes, which inputs and
levels a family tries and in what order, and each check that makes a draw unusable (the
reference fails, overflows, is all near zero, is inaccurate in fp32, is ill-conditioned or
cancels), with the boundary of each. What the families do to real tasks' inputs is
test_numerics.py."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import numerics

TOL = {"atol": 1e-3, "rtol": 1e-3}


def make_ref(fn: Any, *, make: Any = None, out_dtype: Any = None, batch: Any = None) -> Any:
    """A reference of one (rows, dim) input computing `fn` (fp64 given fp64)."""

    def make_inputs(shape, dtype, device, g):
        return (torch.randn(shape["rows"], shape["dim"], generator=g).to(dtype),), {}

    ref = types.SimpleNamespace(
        make_inputs=make or make_inputs,
        reference=fn,
        output_spec=lambda *a, **k: ((), out_dtype or torch.float32),
    )
    if batch is not None:
        ref.BATCH_DIM = batch
    return ref


def suite(ref: Any, cfg: dict[str, Any] | None = None, *, interpret: bool = True,
          device: str = "cpu", scale: Any = None) -> numerics.Suite:  # fmt: skip
    return numerics.Suite(torch, ref, device, cfg, interpret=interpret,
                          scale=scale or (lambda s: s))  # fmt: skip


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def expect(ref: Any, args: list[Any], *, trivial_ok: bool = False, tol=TOL) -> tuple[Any, str]:
    return suite(ref)._expect(args, {}, tol, trivial_ok=trivial_ok)


# -- an edge, the batch dim, the table ---------------------------------------------------------


def test_an_edge_describes_its_family_inputs_and_level_only_when_applicable() -> None:
    fam = numerics.Edge("offset", [1], {}, torch.ones(1), inputs=[0, 2], level=0.45)
    assert fam.applicable and fam.precision
    assert fam.describe() == {"family": "offset", "inputs": [0, 2], "level": 0.45}
    size = numerics.Edge("odd_dims", [1], {}, torch.ones(1), inputs=[0])
    assert size.describe() == {"family": "odd_dims"} and not size.precision
    off = numerics.Edge("ties", why="no floating-point input")
    assert not off.applicable and off.inputs == [] and off.level == 1.0
    assert off.describe() == {"family": "ties", "not_applicable": "no floating-point input"}
    assert numerics.Edge("zeros", expected=torch.zeros(0)).applicable  # an empty output too
    assert not numerics.Edge("zeros").precision


def test_the_batch_dim_is_the_references_when_it_names_one_of_the_shape() -> None:
    assert numerics.batch_key(make_ref(None, batch="m"), {"k": 4, "m": 8}) == "m"
    assert numerics.batch_key(make_ref(None, batch="x"), {"k": 4, "m": 8}) == "k"
    assert numerics.batch_key(make_ref(None, batch=3), {"k": 4, "m": 8}) == "k"
    assert numerics.batch_key(make_ref(None), {"m": 4, "k": 8}) == "m"


def test_the_table_skips_names_and_caps_family_rows_per_device() -> None:
    s = suite(make_ref(None), {"skip": ["zeros", "odd_dims"], "max_dims": {"dim": "64"}})
    assert s.names() == [n for n in numerics.NAMES if n not in ("zeros", "odd_dims")]
    assert s.max_dims == {"dim": 64}
    assert s.rows == 3 and suite(make_ref(None), interpret=False).rows == 64
    bare = suite(make_ref(None), None)
    assert bare.names() == list(numerics.NAMES) and bare.max_dims == {} and bare.skip == set()
    assert suite(make_ref(None), {"skip": None, "max_dims": None}).names() == list(numerics.NAMES)
    assert s.family_shape({"rows": 8, "dim": 5}) == {"rows": 3, "dim": 5}
    assert s.family_shape({"rows": 2, "dim": 5}) == {"rows": 2, "dim": 5}
    assert s.family_shape({"rows": 3, "dim": 5}) == {"rows": 3, "dim": 5}


# -- size edges ------------------------------------------------------------------------------


def test_each_size_edge_has_its_shape() -> None:
    s = suite(make_ref(None, batch="rows"), {"max_dims": {"dim": 4096, "rows": 99}},
              scale=lambda d: {k: v // 2 for k, v in d.items()})  # fmt: skip
    shape = {"dim": 100, "rows": 8}
    assert s.edge_shape("single_row", shape, gen()) == {"dim": 100, "rows": 1}
    assert s.edge_shape("empty_batch", shape, gen()) == {"dim": 100, "rows": 0}
    # every dim at the domain's maximum (scaled to this device), the batch at 2 at most
    assert s.edge_shape("long_reduction", shape, gen()) == {"dim": 2048, "rows": 2}
    assert s.edge_shape("long_reduction", {"dim": 8192, "rows": 1}, gen()) == {
        "dim": 4096, "rows": 1,
    }  # fmt: skip
    assert s.edge_shape("long_reduction", {"dim": 100, "rows": 2}, gen())["rows"] == 2
    assert s.edge_shape("long_reduction", {"dim": 100, "rows": 3}, gen())["rows"] == 2
    odd = s.edge_shape("odd_dims", {"dim": 100, "rows": 5}, gen())
    assert odd is not None and odd["rows"] == 3 and odd["dim"] % 2 == 1  # batch capped first
    with pytest.raises(KeyError):
        s.edge_shape("offset", shape, gen())
    assert suite(make_ref(None)).edge_shape("long_reduction", shape, gen()) is None


def test_an_odd_size_is_odd_below_v_and_at_most_an_eighth_lower() -> None:
    s = suite(make_ref(None))
    assert s._odd(1, gen()) == 1 and s._odd(2, gen()) == 1 and s._odd(0, gen()) == 1
    assert s._odd(3, gen()) == 3  # v // 8 is 0: one step of 0
    assert s._odd(4, gen()) == 3
    for v in (9, 16, 17, 64, 100, 1024):
        seen = {s._odd(v, gen(seed)) for seed in range(40)}
        top = v if v % 2 else v - 1
        assert all(x % 2 == 1 and top - 2 * (v // 8 - 1) <= x <= top for x in seen), (v, seen)
        if v >= 16:
            assert len(seen) > 1  # drawn, not fixed


def test_a_size_edge_keeps_a_trivial_output_and_says_why_it_has_none() -> None:
    ref = make_ref(lambda x: torch.zeros_like(x, dtype=torch.float32))
    s = suite(ref)
    e = s.edge("single_row", {"rows": 8, "dim": 16}, torch.float32, gen(), TOL)
    assert e.applicable and e.args[0].shape == (1, 16) and e.kwargs == {}
    e = s.edge("long_reduction", {"rows": 8, "dim": 16}, torch.float32, gen(), TOL)
    assert not e.applicable and e.why == "the hidden domain declares no larger dims"
    bad = suite(make_ref(lambda x: torch.full_like(x, float("inf"))))
    e = bad.edge("single_row", {"rows": 8, "dim": 16}, torch.float32, gen(), TOL)
    assert not e.applicable and "not finite" in e.why


def test_edges_are_every_name_in_order_or_the_ones_asked() -> None:
    s = suite(make_ref(lambda x: x.float() * 3.0), {"skip": ["empty_batch"]})
    shape = {"rows": 4, "dim": 8}
    got = s.edges(shape, torch.float32, gen(), TOL)
    assert [e.name for e in got] == s.names()
    got = s.edges(shape, torch.float32, gen(), TOL, names=["zeros", "empty_batch"])
    assert [e.name for e in got] == ["zeros", "empty_batch"]
    assert s.edges(shape, torch.float32, gen(), TOL, names=[]) == []


def test_an_edge_runs_torch_on_one_thread_on_the_cpu_and_restores_it() -> None:
    seen = []
    ref = make_ref(lambda x: (seen.append(torch.get_num_threads()), x.float() * 2.0)[1])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        suite(ref).edge("single_row", {"rows": 4, "dim": 8}, torch.float32, gen(), TOL)
        assert seen == [1] and torch.get_num_threads() == 2
        seen.clear()
        # another device keeps torch's threads (its tensors are on the GPU)
        suite(ref, device="cuda:0").edge("single_row", {"rows": 4, "dim": 8}, torch.float32,
                                         gen(), TOL)  # fmt: skip
        assert seen == [2] and torch.get_num_threads() == 2
        with pytest.raises(KeyError):
            suite(ref).edge("nope", {"rows": 4, "dim": 8}, torch.float32, gen(), TOL)
        assert torch.get_num_threads() == 2  # restored on an error too
    finally:
        torch.set_num_threads(before)


# -- which inputs and levels a family tries ----------------------------------------------------


def two_inputs(shape, dtype, device, g):
    x = torch.randn(shape["rows"], shape["dim"], generator=g).to(dtype)
    w = torch.randn(shape["dim"], generator=g).to(dtype)
    return (x, w), {"scale": 2.0}


def test_a_family_goes_to_every_floating_input_then_the_first_then_a_lower_level() -> None:
    tried: list[tuple[int, int]] = []

    def fn(x, w, scale):
        if x.dtype != torch.float64:
            tried.append((int(x.abs().max() > 1e3), int(w.abs().max() > 1e3)))
        out = (x.double().abs().amax() + w.double().abs().amax()).reshape(1)
        return out.to(torch.float64 if x.dtype == torch.float64 else torch.float32) / scale

    ref = make_ref(fn, make=two_inputs, out_dtype=torch.float16)
    ref.output_spec = lambda *a, **k: ((), torch.float16)
    e = suite(ref).edge("near_overflow", {"rows": 4, "dim": 8}, torch.float16, gen(), TOL)
    # both at 60000 overflow fp16 (their mean), the first alone at 60000 does not
    assert e.applicable and e.inputs == [0] and e.level == 1.0 and e.kwargs == {"scale": 2.0}
    assert tried[:2] == [(1, 1), (1, 0)]


def test_a_family_without_levels_is_tried_once_per_subset_and_says_the_last_why() -> None:
    calls = []

    def fn(x, w, scale):
        calls.append(1)
        raise ValueError("never")

    ref = make_ref(fn, make=two_inputs)
    e = suite(ref).edge("zeros", {"rows": 4, "dim": 8}, torch.float32, gen(), TOL)
    assert not e.applicable and e.why == "the reference raised ValueError"
    assert len(calls) == 2  # all floating inputs, then the first: no levels for zeros
    calls.clear()
    e = suite(ref).edge("offset", {"rows": 4, "dim": 8}, torch.float32, gen(), TOL)
    assert len(calls) == 2 * len(numerics.LEVELS)


def test_a_single_floating_input_is_one_subset_and_levels_go_down_in_order() -> None:
    levels = []

    def fn(x):
        if x.dtype != torch.float64:
            levels.append(float(x.abs().max()))
        return x.float() * 10.0  # fits fp16 from the second level on (2209 * 10)

    ref = make_ref(fn, out_dtype=torch.float16)
    e = suite(ref).edge("near_overflow", {"rows": 4, "dim": 8}, torch.float16, gen(), TOL)
    assert e.applicable and e.inputs == [0] and e.level == numerics.LEVELS[1]
    assert levels[0] > levels[1] and len(levels) == 2
    assert float(e.expected.abs().max()) <= 0.9 * 65504


def test_only_nonempty_floating_tensors_with_a_dim_are_transformed() -> None:
    def make(shape, dtype, device, g):
        return (torch.arange(4), torch.tensor(2.0), torch.zeros(0, 3),
                torch.randn(3, 4, generator=g).to(dtype)), {}  # fmt: skip

    ref = make_ref(lambda i, s, e, x: x.float() * 2 if x.dtype != torch.float64 else x * 2,
                   make=make)  # fmt: skip
    e = suite(ref).edge("offset", {"rows": 3, "dim": 4}, torch.float32, gen(), TOL)
    assert e.applicable and e.inputs == [3]
    none = make_ref(lambda i: i.float(), make=lambda *a: ((torch.arange(4),), {}))
    e = suite(none).edge("offset", {"rows": 3, "dim": 4}, torch.float32, gen(), TOL)
    assert not e.applicable and e.why == "no floating-point input to transform"


# -- when a draw's expected values are usable ------------------------------------------------


def test_a_reference_that_fails_or_returns_no_tensor_is_unusable() -> None:
    def boom(x):
        raise ZeroDivisionError

    assert expect(make_ref(boom), [torch.ones(2, 2)]) == (
        None,
        "the reference raised ZeroDivisionError",
    )
    ref = make_ref(lambda x: x)
    ref.output_spec = lambda *a: 1 / 0
    assert expect(ref, [torch.ones(2, 2)])[1] == "the reference raised ZeroDivisionError"
    assert expect(make_ref(lambda x: 3.0), [torch.ones(2, 2)]) == (
        None, "the reference returned no tensor",
    )  # fmt: skip


def test_an_integer_or_empty_output_is_kept_as_is() -> None:
    out, why = expect(make_ref(lambda x: torch.zeros(2, dtype=torch.int64)), [torch.ones(2, 2)])
    assert out is not None and out.dtype == torch.int64 and why == ""
    out, why = expect(make_ref(lambda x: torch.zeros(0)), [torch.ones(2, 2)])
    assert out is not None and out.numel() == 0 and why == ""


def test_a_non_finite_output_is_unusable() -> None:
    for bad in (float("nan"), float("inf"), float("-inf")):
        out, why = expect(make_ref(lambda x, b=bad: torch.tensor([1.0, b])), [torch.ones(2)],
                          trivial_ok=True)  # fmt: skip
        assert out is None and why == "the reference's output is not finite"


def test_an_output_past_nine_tenths_of_its_dtypes_max_is_unusable() -> None:
    limit = 0.9 * 65504

    def at(v: float, dtype=torch.float16) -> tuple[Any, str]:
        ref = make_ref(lambda x: torch.tensor([v, 1.0], dtype=torch.float64), out_dtype=dtype)
        return expect(ref, [torch.ones(2)], trivial_ok=True)

    assert at(limit)[0] is not None
    assert at(-limit)[0] is not None
    out, why = at(limit * 1.001)
    assert out is None and why == "the reference's output exceeds torch.float16's range"
    assert at(-limit * 1.001)[0] is None  # the magnitude counts
    assert at(limit * 1.001, torch.float32)[0] is not None  # another dtype, another max
    ints = make_ref(lambda x: torch.tensor([1e30]), out_dtype=torch.int32)
    assert expect(ints, [torch.ones(2)], trivial_ok=True)[0] is not None  # no range to check


def test_a_family_whose_output_is_all_within_atol_of_zero_is_unusable() -> None:
    def at(v: float, trivial_ok: bool = False) -> tuple[Any, str]:
        return expect(make_ref(lambda x: torch.tensor([v, -v, 0.0])), [torch.ones(2)],
                      trivial_ok=trivial_ok)  # fmt: skip

    out, why = at(1e-3)  # exactly atol: not above it
    assert out is None and why == "every expected value is within atol of zero"
    assert at(-2e-3)[0] is not None and at(2e-3)[0] is not None
    assert at(0.0, trivial_ok=True)[0] is not None  # a size edge may be all zero


def fp64_ref(fn32: Any, fn64: Any) -> Any:
    return make_ref(lambda x: fn64(x) if x.dtype == torch.float64 else fn32(x))


def test_the_fp32_reference_must_agree_with_fp64_within_a_quarter_of_the_tolerance() -> None:
    x = torch.ones(4) * 10.0  # bound: 0.25 * (1e-3 + 1e-3 * 10) = 2.75e-3
    for delta, ok in ((2.7e-3, True), (2.8e-3, False), (-2.8e-3, False)):
        ref = fp64_ref(lambda t, d=delta: t.float() + d, lambda t: t)
        out, why = expect(ref, [x])
        assert (out is not None) is ok, (delta, why)
        if not ok:
            assert why == "the fp32 reference is not accurate to the tolerance here"
    # rtol counts the fp64 value's magnitude
    ref = fp64_ref(lambda t: t.float() * (1 + 1e-4) + 5e-4, lambda t: t)
    assert expect(ref, [torch.ones(4) * 10.0], tol={"atol": 0.0, "rtol": 1e-2})[0] is not None
    assert expect(ref, [torch.ones(4) * 10.0], tol={"atol": 1e-2, "rtol": 0.0})[0] is not None
    assert expect(ref, [torch.ones(4) * 10.0], tol={"atol": 1e-3, "rtol": 0.0})[0] is None


def test_an_fp64_reference_of_another_shape_or_dtype_is_not_compared() -> None:
    ref = fp64_ref(lambda t: t.float() + 1.0, lambda t: torch.zeros(7, dtype=torch.float64))
    assert expect(ref, [torch.ones(4)])[0] is not None  # another shape: no fp64 check
    ref = fp64_ref(lambda t: t.float() + 1.0, lambda t: t.float())
    assert expect(ref, [torch.ones(4)])[0] is not None  # no fp64 answer: fp32 is all there is

    def only32(t):
        if t.dtype == torch.float64:
            raise TypeError("fp32 only")
        return t.float()

    assert expect(make_ref(only32), [torch.ones(4)])[0] is not None


def test_an_op_that_moves_past_the_bound_when_its_inputs_move_an_ulp_is_ill_conditioned() -> None:
    # x - 1e8 with x ~ 1e8: a relative move of 2^-23 moves the output by ~12; fp32 = fp64 here
    x = torch.full((4,), 1e8, dtype=torch.float32) + torch.arange(4.0) * 800 + 800
    ref = fp64_ref(lambda t: t.float() - 1e8, lambda t: t - 1e8)
    out, why = expect(ref, [x], tol={"atol": 1.0, "rtol": 0.0})
    assert out is None and why == "the op is ill-conditioned at these values (cancellation)"
    assert expect(ref, [x], tol={"atol": 100.0, "rtol": 0.0})[0] is not None  # 12 < 25


def test_the_perturbation_moves_every_floating_element_by_one_part_in_2_to_23() -> None:
    s = suite(make_ref(None))
    x = torch.linspace(1.0, 2.0, 64)
    idx = torch.arange(5)
    moved = s._perturbed([x, idx])
    assert moved[1] is idx  # not a floating input: as given
    rel = (moved[0] - x.double()) / x.double()
    assert moved[0].dtype == torch.float64
    assert torch.allclose(rel.abs(), torch.full_like(rel, 2.0**-23), rtol=1e-9, atol=0)
    assert bool((rel > 0).any()) and bool((rel < 0).any())  # each element its own sign
    assert torch.equal(s._perturbed([x])[0], moved[0])  # a fixed draw: judged alike everywhere


def matmul_like(scale_terms: float) -> Any:
    """sum(x * w) over a row: linear in x and in w; terms of size `scale_terms` cancel."""

    def make(shape, dtype, device, g):
        return (torch.tensor([[scale_terms, -scale_terms, 1.0]]),
                torch.tensor([[1.0], [1.0], [1.0]])), {}  # fmt: skip

    return make_ref(lambda x, w: x @ w if x.dtype == torch.float64 else x.float() @ w.float(),
                    make=make)  # fmt: skip


def test_a_linear_op_whose_terms_dwarf_its_result_cancels_too_much_to_judge() -> None:
    # output 1.0; bound 0.25 * (1e-3 + 1e-3) = 5e-4; terms 2 * T + 1: T * 2^-16 * 2 > 5e-4
    args = list(matmul_like(32.0).make_inputs({}, None, None, None)[0])
    out, why = suite(matmul_like(32.0))._expect(args, {}, TOL, trivial_ok=False)
    assert out is None and why == "the op cancels at these values (its terms dwarf its result)"
    args = list(matmul_like(10.0).make_inputs({}, None, None, None)[0])
    assert suite(matmul_like(10.0))._expect(args, {}, TOL, trivial_ok=False)[0] is not None


def test_the_terms_check_is_only_for_an_op_linear_in_every_input() -> None:
    # softmax-like: the reference of |x| is another function; large terms prove nothing
    x = torch.tensor([[40.0, -40.0, 1.0]])
    ref = fp64_ref(lambda t: torch.exp(t.float() - 40.0), lambda t: torch.exp(t - 40.0))
    assert expect(ref, [x], tol={"atol": 1e-9, "rtol": 1e-3})[0] is not None


def test_multilinear_means_doubling_each_floating_input_doubles_the_fp64_output() -> None:
    x, w = torch.ones(2, 3), torch.ones(3, 1)
    s = suite(matmul_like(1.0))
    exact = s._reference64([x, w], {})
    assert s._multilinear([x, w], {}, exact)
    square = suite(make_ref(lambda a: a * a))
    assert not square._multilinear([x], {}, square._reference64([x], {}))
    affine = suite(make_ref(lambda a: a + 1.0))
    assert not affine._multilinear([x], {}, affine._reference64([x], {}))
    # linear in the first, not in the second: every input must be
    part = suite(make_ref(lambda a, b: a * b * b))
    assert not part._multilinear([x, x], {}, part._reference64([x, x], {}))
    ints = suite(make_ref(lambda i: i * 2))
    assert not ints._multilinear([torch.arange(3)], {}, None)  # no floating input: not linear
    # an fp64 answer only for the original inputs, or of another shape: not shown linear
    shifty = suite(make_ref(lambda a: a.sum(0) if float(a.abs().max()) > 1 else a))
    assert not shifty._multilinear([x], {}, shifty._reference64([x], {}))
    fails = suite(make_ref(lambda a: a if float(a.abs().max()) <= 1 else 1 / 0))
    assert not fails._multilinear([x], {}, fails._reference64([x], {}))
    # the doubled input is fp64 (exactly twice the value)
    seen = []
    rec = suite(make_ref(lambda a: (seen.append(a.dtype), a)[1]))
    rec._multilinear([torch.ones(2)], {}, torch.ones(2, dtype=torch.float64))
    assert seen == [torch.float64]


def test_kwargs_go_to_every_fp64_reference() -> None:
    got = []

    def fn(x, *, scale):
        got.append(scale)
        return x.float() * scale if x.dtype != torch.float64 else x * scale

    s = suite(make_ref(fn))
    out, _ = s._expect([torch.ones(4)], {"scale": 3.0}, TOL, trivial_ok=False)
    assert out is not None and got == [3.0] * len(got) and len(got) >= 4


def test_the_tolerance_ratio_is_the_worst_error_in_tolerances() -> None:
    ref = torch.tensor([1.0, -2.0, 0.0])
    tol = {"atol": 0.5, "rtol": 0.25}
    out = torch.tensor([1.5, -2.0, 0.25])  # 0.5 / 0.75, 0, 0.25 / 0.5
    assert numerics.tolerance_ratio(torch, out, ref, tol) == pytest.approx(2 / 3)
    assert numerics.tolerance_ratio(torch, out.half(), ref, tol) == pytest.approx(2 / 3, rel=1e-3)
    assert numerics.tolerance_ratio(torch, -ref, ref, tol) == pytest.approx(4 / 1.0)
    assert numerics.tolerance_ratio(torch, out[:2], ref, tol) is None
    assert numerics.tolerance_ratio(torch, out.tolist(), ref, tol) is None

    class Sub(torch.Tensor):
        pass

    assert numerics.tolerance_ratio(torch, out.as_subclass(Sub), ref, tol) is None
    assert numerics.tolerance_ratio(torch, torch.zeros(0), torch.zeros(0), tol) is None


# -- boundaries and odd inputs (each kills a mutant the tests above let through) ---------------


def test_a_batch_dim_that_is_no_string_is_ignored_even_unhashable() -> None:
    assert numerics.batch_key(make_ref(None, batch=["m"]), {"k": 4, "m": 8}) == "k"


def test_an_odd_size_is_drawn_from_the_verifys_generator_only() -> None:
    s = suite(make_ref(None))
    sizes = range(16, 400, 7)
    torch.manual_seed(1)
    first = [s._odd(v, gen(5)) for v in sizes]
    torch.manual_seed(2)
    assert [s._odd(v, gen(5)) for v in sizes] == first  # torch's global generator plays no part


def test_a_non_tensor_input_is_never_transformed_or_widened() -> None:
    seen = []

    def fn(x, scale, idx):
        seen.append((type(scale), idx.dtype))
        return x * scale if x.dtype == torch.float64 else x.float() * scale

    make = lambda shape, dtype, device, g: (  # noqa: E731
        (torch.randn(3, 4, generator=g).to(dtype), 2.0, torch.arange(3)),
        {},
    )
    e = suite(make_ref(fn, make=make)).edge(
        "offset", {"rows": 3, "dim": 4}, torch.float32, gen(), TOL
    )
    assert e.applicable and e.inputs == [0] and e.args[1] == 2.0
    assert set(seen) == {(float, torch.int64)}  # every fp64 run too: only floats are widened
    s = suite(make_ref(fn))
    moved = s._perturbed([torch.ones(2), 3.0])
    assert moved[1] == 3.0
    assert s._multilinear([torch.ones(3, 4), 2.0, torch.arange(3)], {}, s._reference64(
        [torch.ones(3, 4), 2.0, torch.arange(3)], {}))  # fmt: skip


def test_an_fp64_reference_that_returns_no_tensor_is_no_fp64_answer() -> None:
    assert suite(make_ref(lambda x: 3.0))._reference64([torch.ones(2)], {}) is None


def test_the_fp32_check_accepts_a_difference_of_exactly_the_bound() -> None:
    ref = fp64_ref(lambda t: t.float() + 1.0, lambda t: t)  # bound 0.25 * 4 = 1: exactly off by 1
    assert expect(ref, [torch.full((4,), 8.0)], tol={"atol": 4.0, "rtol": 0.0})[0] is not None
    assert expect(ref, [torch.full((4,), 8.0)], tol={"atol": 3.9, "rtol": 0.0})[0] is None


def test_the_conditioning_check_accepts_a_move_of_exactly_the_bound() -> None:
    # x = 8 moves by 8 * 2^-23 = 2^-20 exactly; x + 1 is not linear (no terms check applies)
    ref = fp64_ref(lambda t: t.float() + 1.0, lambda t: t + 1.0)
    x = torch.full((4,), 8.0)
    assert expect(ref, [x], tol={"atol": 4 * 2.0**-20, "rtol": 0.0})[0] is not None
    out, why = expect(ref, [x], tol={"atol": 3.9 * 2.0**-20, "rtol": 0.0})
    assert out is None and "ill-conditioned" in why


def test_the_terms_check_accepts_terms_of_exactly_the_bound() -> None:
    # a row sum (linear): terms 4 + 4 + 1 = 9, result 1; ACCUMULATION * 9 = 9 * 2^-16
    ref = fp64_ref(lambda t: t.float().sum(-1), lambda t: t.sum(-1))
    x = torch.tensor([[4.0, -4.0, 1.0]])
    assert expect(ref, [x], tol={"atol": 36 * 2.0**-16, "rtol": 0.0})[0] is not None
    out, why = expect(ref, [x], tol={"atol": 35 * 2.0**-16, "rtol": 0.0})
    assert out is None and "cancels" in why


def test_an_fp64_answer_missing_or_of_another_shape_skips_that_check() -> None:
    x = torch.tensor([1.0, -2.0, 3.0, 4.0])

    def moved_fails(t):  # fp64 only for the exact inputs (integers), not the perturbed ones
        if t.dtype == torch.float64 and not bool((t == t.round()).all()):
            raise ValueError("not integral")
        return t.float() * 3 + 1 if t.dtype != torch.float64 else t * 3 + 1

    assert expect(make_ref(moved_fails), [x])[0] is not None

    def moved_elsewhere(t):  # perturbed inputs answer in another shape, far off
        if t.dtype == torch.float64 and not bool((t == t.round()).all()):
            return torch.full((1,), 1e9, dtype=torch.float64)
        return t.float() * 3 + 1 if t.dtype != torch.float64 else t * 3 + 1

    assert expect(make_ref(moved_elsewhere), [x])[0] is not None

    def no_terms(t):  # no fp64 answer on |inputs| (all non-negative)
        if t.dtype == torch.float64 and bool((t >= 0).all()):
            raise ValueError("needs a negative")
        return t.float() * 3 if t.dtype != torch.float64 else t * 3

    assert expect(make_ref(no_terms), [x])[0] is not None

    def terms_elsewhere(t):
        if t.dtype == torch.float64 and bool((t >= 0).all()):
            return torch.full((7,), 1e9, dtype=torch.float64)
        return t.float() * 3 if t.dtype != torch.float64 else t * 3

    assert expect(make_ref(terms_elsewhere), [x])[0] is not None


def test_multilinear_boundaries() -> None:
    x = torch.ones(2, 3)

    def linear(fn):
        s = suite(make_ref(fn))
        return s._multilinear([x], {}, s._reference64([x], {}))

    assert linear(lambda a: a * 3.0) is True  # one input: doubling it doubles the output
    assert linear(lambda a: a + 1.0) is False
    assert linear(lambda a: a if float(a.abs().max()) <= 1 else a[:1]) is False  # another shape
    assert linear(lambda a: a * (1 + 1e-7 * a)) is False  # linear to 1e-5, not to 1e-9
    assert linear(lambda a: a * (1 + 1.5e-9 * a)) is False  # off by 1.5e-9 relative
    assert linear(lambda a: a * 1e-6 + 1e-9) is False  # tiny outputs: no absolute slack
    s = suite(make_ref(lambda a: 1 / 0 if float(a.abs().max()) > 1 else a))
    assert s._multilinear([x], {}, s._reference64([x], {})) is False
