"""matmul task content: reference.py's interface, the baseline and the reference solutions (tiled
and TMA persistent) on the Triton CPU interpreter (sizes that are no multiple of any tile, every
probe), and probes that catch known bugs. The checks every task shares
are in test_task_contract.py."""

from __future__ import annotations

import pytest
import torch

from harnesslab.tests.tasks.kernel_check import load_reference, passes
from harnesslab.tools.task.spec import load_task

SPEC = load_task("matmul")
REF = load_reference(SPEC)


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


def test_matmul_ships_the_fast_and_tma_solutions() -> None:
    assert {"fast", "tma"} <= set(SPEC.solutions())
