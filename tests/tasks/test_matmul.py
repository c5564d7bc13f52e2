"""matmul task content: reference.py's interface, the baseline and the reference solutions (tiled
and TMA persistent) on the Triton CPU interpreter (sizes that are no multiple of any tile, every
probe), and probes that catch known bugs."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from harnesslab.tests.tasks.kernel_check import failures, interpret, load_reference, passes
from harnesslab.tools.task.spec import load_task

SPEC = load_task("matmul")
REF = load_reference(SPEC)
# No size a multiple of 32 (masks / TMA bounds on m, n, k); k = 1000 is not a multiple of the
# CPU tile's BLOCK_K; n = 72 keeps the TMA path (16-byte rows), 1001 in the probes leaves it.
IRREGULAR_SHAPES = [{"m": 37, "n": 72, "k": 1000}, {"m": 100, "n": 40, "k": 88}]


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    kernels = {"baseline": SPEC.workspace_template / "kernel.py", **SPEC.solutions()}
    return interpret(SPEC, kernels, IRREGULAR_SHAPES)


def test_baseline_and_solutions_match_the_reference_on_irregular_shapes(results) -> None:
    assert {"fast", "tma"} <= set(SPEC.solutions())
    for label in ["baseline", *SPEC.solutions()]:
        assert failures(results, f"{label}/", probes=False) == []


def test_baseline_and_solutions_pass_every_probe(results) -> None:
    assert {k.split("probe:")[1] for k in results if "/probe:" in k} == set(REF.PROBES)
    for label in ["baseline", *SPEC.solutions()]:
        assert failures(results, f"{label}/", probes=True) == []


def test_outputs_have_the_declared_shape_and_dtype(results) -> None:
    assert [k for k, v in results.items() if not v["spec_ok"]] == []


def _accumulate_in(dtype: torch.dtype, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """K in steps of 64 with the running sum rounded to `dtype` (a 16-bit accumulator)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=dtype)
    for k in range(0, a.shape[1], 64):
        acc = (acc.float() + a[:, k : k + 64].float() @ b[k : k + 64].float()).to(dtype)
    return acc.to(a.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cancellation_probe_rejects_a_16_bit_accumulator(dtype: torch.dtype) -> None:
    assert passes(
        SPEC,
        REF,
        "accumulation_cancellation",
        dtype,
        lambda a, b: (a.float() @ b.float()).to(a.dtype),
    )
    assert not passes(
        SPEC, REF, "accumulation_cancellation", dtype, lambda a, b: _accumulate_in(dtype, a, b)
    )


def test_tolerance_rejects_an_all_zero_output() -> None:
    assert not passes(SPEC, REF, "odd_sizes_37x53x71", torch.bfloat16,
                      lambda a, b: torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype))  # fmt: skip


def test_reference_interface_sizes_and_interpreter_shapes() -> None:
    shape = {"m": 5, "n": 24, "k": 300}
    (a, b), kwargs = REF.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(7))
    assert kwargs == {} and a.shape == (5, 300) and b.shape == (300, 24)
    c = REF.reference(a, b)
    assert c.dtype == torch.float32 and 0.5 < float(c.std()) < 2.0  # B scaled by 1/sqrt(k)
    assert REF.output_spec(a, b) == ((5, 24), torch.bfloat16)
    assert REF.flops({"m": 2, "n": 3, "k": 4}) == 48
    assert REF.bytes_moved({"m": 2, "n": 3, "k": 4}, 2) == (8 + 12 + 6) * 2
    assert set(REF.PROBES) == set(REF.PROBE_NOTES)
    for case in SPEC.dev_cases:
        small = REF.interpreter_shape(case.shape)
        assert all(1 <= v <= 112 for v in small.values())
        assert all(small[k] == v for k, v in case.shape.items() if v <= 112)


def test_baseline_config_is_inside_the_declared_space() -> None:
    config = json.loads((SPEC.workspace_template / "kernel_config.json").read_text())
    assert set(config) == set(SPEC.space)
    SPEC.validate_config(config, source="kernel_config.json")
