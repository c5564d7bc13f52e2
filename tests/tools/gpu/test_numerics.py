"""The generic adversarial inputs (tools/gpu/numerics.py): what each family does to a task's own
inputs, when a family is refused (the reference cannot take it, or cannot judge it), a task's
[numerics] table, and that the guarded verify gives every hidden case every size edge."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tools import gpu
from harnesslab.tools.errors import UsageError
from harnesslab.tools.gpu import numerics
from harnesslab.tools.task.spec import load_task, parse_task

SPEC = load_task("rmsnorm_gate")
TOL = SPEC.tolerances["float16"].model_dump()


def reference_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"_numerics_{name}", load_task(name).reference_path
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RMS = reference_module("rmsnorm_gate")


def suite(ref: Any = RMS, numerics_cfg: dict[str, Any] | None = None) -> numerics.Suite:
    return numerics.Suite(torch, ref, "cpu", numerics_cfg or SPEC.numerics_request(),
                          interpret=True, scale=ref.interpreter_shape)  # fmt: skip


def edge(name: str, dtype: torch.dtype = torch.float16, *, ref: Any = RMS, seed: int = 0,
         shape: dict[str, int] | None = None, tol: dict[str, float] = TOL) -> numerics.Edge:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    return suite(ref).edge(name, shape or {"rows": 8, "dim": 1024}, dtype, gen, tol)


def fake_reference(fn: Any, make: Any = None) -> types.SimpleNamespace:
    """A reference module of one input (rows, dim) computing `fn` (fp64 given fp64)."""

    def make_inputs(shape, dtype, device, g):
        return (torch.randn(shape["rows"], shape["dim"], generator=g).to(dtype),), {}

    return types.SimpleNamespace(
        make_inputs=make or make_inputs,
        reference=lambda x: fn(x if x.dtype == torch.float64 else x.float()),
        output_spec=lambda x: (tuple(x.shape), x.dtype),
        interpreter_shape=lambda s: s,
    )


def test_every_name_has_a_note_and_the_precision_families_are_families() -> None:
    assert set(numerics.NOTES) == set(numerics.NAMES)
    assert numerics.PRECISION <= set(numerics.FAMILIES)


def test_families_transform_floating_inputs_only_and_keep_shapes_and_dtypes() -> None:
    def make(shape, dtype, device, g):
        x = torch.randn(shape["rows"], shape["dim"], generator=g).to(dtype)
        return (x, torch.arange(shape["dim"])), {}

    ref = fake_reference(lambda x: x * 2.0, make)
    ref.reference = lambda x, idx: (x if x.dtype == torch.float64 else x.float()) * 2.0
    ref.output_spec = lambda x, idx: (tuple(x.shape), x.dtype)
    for name in numerics.FAMILIES:
        e = edge(name, ref=ref, tol={"atol": 1e-6, "rtol": 4e-3})
        assert e.applicable, (name, e.why)
        x, idx = e.args
        assert x.shape == (3, 1024) and x.dtype == torch.float16 and x.is_contiguous()
        assert torch.equal(idx, torch.arange(1024)), name  # an index input is never touched
        assert e.inputs == [0]


def test_offset_rows_have_a_large_mean_and_a_spread_of_about_an_ulp() -> None:
    e = edge("offset")
    x = e.args[0].float()
    mean, std = x.mean(dim=1).abs(), x.std(dim=1)
    assert bool((mean / std > 300).all())  # the rows: mean 30, spread 0.01
    assert bool((std > 0).all())  # the spread survives rounding to fp16


def test_column_scales_are_largest_at_both_ends_of_the_row() -> None:
    x = edge("column_scales").args[0].float().abs()
    cols, energy = x.shape[1], x.pow(2).sum(dim=1)
    for end in (x[:, : cols // 32], x[:, -cols // 32 :]):  # what a reduction skipping 1/32 misses
        assert bool((end.pow(2).sum(dim=1) > 0.25 * energy).all())
    assert float(x.max()) > 1e3 and float(x[x > 0].min()) < 1e-3  # spans the dtype's range


def test_row_scales_and_outliers_vary_along_the_right_axis() -> None:
    rows = edge("row_scales").args[0].float().abs().amax(dim=1)
    assert float(rows.max() / rows.min()) > 1e4
    x = edge("column_outliers").args[0].float().abs()
    for col in (0, x.shape[1] - 1):
        assert bool((x[:, col] > 100 * x[:, 1 : x.shape[1] - 1].median()).all())


def test_near_overflow_reaches_60000_in_fp16_and_stays_finite_in_fp32_for_bf16() -> None:
    x = edge("near_overflow").args[0].float()
    assert 59000 < float(x.abs().max()) <= 60000
    b = edge("near_overflow", torch.bfloat16, tol=SPEC.tolerances["bfloat16"].model_dump())
    peak = float(b.args[0].float().abs().max())
    assert 1e15 < peak and peak**2 * 2**20 < torch.finfo(torch.float32).max  # sums of squares


def test_subnormals_zeros_and_ties() -> None:
    x = edge("subnormals").args[0].float()
    assert 0 < float(x.abs().max()) < torch.finfo(torch.float16).tiny
    z = edge("zeros").args[0]
    zero_rows = (z == 0).all(dim=1)
    assert 0 < int(zero_rows.sum()) < z.shape[0]
    assert bool(torch.signbit(z[:, -1]).all())  # the last column is -0.0
    t = edge("ties").args[0]
    assert all(len(set(row.tolist())) < t.shape[1] // 10 for row in t)
    assert all(int((row == row.max()).sum()) > 1 for row in t)  # the maximum itself ties


def test_a_family_whose_output_would_overflow_backs_off_to_the_first_input_then_a_level() -> None:
    matmul = reference_module("matmul")
    tol = load_task("matmul").tolerances["float16"].model_dump()
    e = edge("near_overflow", ref=matmul, shape={"m": 8, "n": 64, "k": 64}, tol=tol)
    assert e.applicable and e.inputs == [0]  # a and b both at 60000 overflow C
    e = edge("near_overflow", ref=fake_reference(lambda x: x * 4.0))
    assert e.applicable and e.level < 1.0  # 4 * 60000 does not fit fp16
    assert float(e.expected.abs().max()) <= 0.9 * 65504


def test_a_family_the_reference_cannot_take_is_inapplicable_and_says_why() -> None:
    e = edge("near_overflow", ref=fake_reference(torch.exp))
    assert not e.applicable and "exceeds" in e.why
    e = edge("subnormals", ref=fake_reference(lambda x: x * 1e-3))
    assert not e.applicable and "atol" in e.why  # an all-zero output would pass: proves nothing


def test_a_draw_the_fp32_reference_cannot_judge_is_refused() -> None:
    # fp32 rounds x + 1e8 to a multiple of 8: the fp64 reference disagrees by up to 4
    e = edge("offset", ref=fake_reference(lambda x: x + 1e8 - 1e8))
    assert not e.applicable and "fp32 reference" in e.why
    assert edge("offset", ref=fake_reference(lambda x: x * 3.0)).applicable


def test_size_edges_come_from_the_case_and_the_hidden_domain() -> None:
    s, gen = suite(), torch.Generator().manual_seed(3)
    shape = {"rows": 8, "dim": 1024}
    odd = s.edge_shape("odd_dims", shape, gen)
    assert odd is not None and all(v % 2 for v in odd.values()) and odd["dim"] < 1024
    assert s.edge_shape("single_row", shape, gen) == {"rows": 1, "dim": 1024}
    assert s.edge_shape("empty_batch", shape, gen) == {"rows": 0, "dim": 1024}
    assert s.edge_shape("long_reduction", shape, gen) == {"rows": 2, "dim": 8192}
    assert s.edge("empty_batch", shape, torch.float16, gen, TOL).args[0].shape == (0, 1024)


def test_a_task_skips_what_its_numerics_table_names() -> None:
    text = (SPEC.root / "task.toml").read_text() + '\n[numerics]\nskip = ["empty_batch"]\n'
    task = parse_task(text, SPEC.root)
    assert task.numerics_request()["skip"] == ["empty_batch"]
    assert "empty_batch" not in suite(RMS, task.numerics_request()).names()
    with pytest.raises(UsageError, match=r"numerics.skip: 'nope'"):
        parse_task(text.replace("empty_batch", "nope"), SPEC.root)


# The guarded verify's own variants, from a staged copy of the harness (its files import each
# other by bare name; Verify makes its scratch beside the stage), in a fresh interpreter.
_VARIANTS = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import guard, runner
    req = json.loads(sys.argv[2])
    v = guard.Verify(runner.Env(interpret=True), req, runner)
    out = []
    for i, case in enumerate(req["cases"]):
        out.append([list(x.args[0].shape) for x in v.variants(case, i)])
    print(json.dumps(out))
    """
)


def test_every_hidden_case_gets_every_size_edge(tmp_path: Path) -> None:
    """Issue 25.7: one size edge drawn per case let a kernel wrong only on odd dims pass 9% of
    verifies; now each case has an odd-dims, a single-row, an empty-batch and a long one."""
    harness = gpu.copy_flat(tmp_path / "stage" / "harness")  # as on the GPU host
    cases = [c.model_dump() for c in SPEC.final.draw("numerics")]  # type: ignore[union-attr]
    req = {
        "reference": str(SPEC.reference_path),
        "tolerances": {k: v.model_dump() for k, v in SPEC.tolerances.items()},
        "cases": cases,
        "seed": 1,
        "numerics": SPEC.numerics_request(),
    }
    run = subprocess.run([sys.executable, "-c", _VARIANTS, str(harness), json.dumps(req)],
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    for shapes in json.loads(run.stdout.strip().splitlines()[-1]):
        assert any(s[0] % 2 and s[1] % 2 for s in shapes), shapes  # odd rows and odd dim
        assert any(s[0] == 1 for s in shapes), shapes
        assert any(s[0] == 0 for s in shapes), shapes
        assert any(s[1] == 8192 for s in shapes), shapes  # the domain's longest row
