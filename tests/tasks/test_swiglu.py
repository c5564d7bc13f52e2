"""swiglu task content: reference.py's interface, the baseline and the reference solutions on the
Triton CPU interpreter (irregular shapes, every probe), and probes that catch known bugs. The checks every task shares
are in test_task_contract.py."""

from __future__ import annotations

import functools

import pytest
import torch

from harnesslab.tests.tasks.kernel_check import load_reference, passes
from harnesslab.tools.task.spec import load_task

SPEC = load_task("swiglu")
REF = load_reference(SPEC)


def _swiglu_torch(a: torch.Tensor, b: torch.Tensor, *, silu: str = "stable",
                  compute: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    x = a.to(compute)
    gated = x * torch.exp(x) / (1 + torch.exp(x)) if silu == "exp" else torch.nn.functional.silu(x)
    return (gated * b.to(compute)).to(a.dtype)


@pytest.mark.parametrize(
    ("probe", "dtype", "flaw"),
    [
        ("silu_saturation", torch.float16, {"silu": "exp"}),
        ("silu_saturation", torch.bfloat16, {"silu": "exp", "compute": torch.float32}),
        ("large_products", torch.bfloat16, {"compute": torch.float16}),
    ],
)
def test_probe_rejects_a_kernel_with_its_bug(probe: str, dtype: torch.dtype, flaw: dict) -> None:
    assert passes(SPEC, REF, probe, dtype, _swiglu_torch)
    assert not passes(SPEC, REF, probe, dtype, functools.partial(_swiglu_torch, **flaw))


def test_tolerance_rejects_an_all_zero_output() -> None:
    assert not passes(SPEC, REF, "tiny_values", torch.float16, lambda a, b: torch.zeros_like(a))


def test_reference_interface_sizes_and_interpreter_shapes() -> None:
    shape = {"rows": 5, "dim": 3000}
    (a, b), kwargs = REF.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(7))
    (a2, _), _ = REF.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(7))
    assert kwargs == {} and a.shape == b.shape == (5, 3000) and torch.equal(a, a2)
    assert REF.reference(a, b).dtype == torch.float32
    assert REF.output_spec(a, b) == ((5, 3000), torch.bfloat16)
    assert REF.bytes_moved({"rows": 4096, "dim": 4096}, 2) == 3 * 4096 * 4096 * 2
    assert REF.flops(shape) > 0
    assert set(REF.PROBES) == set(REF.PROBE_NOTES)
    for case in SPEC.dev_cases:
        small = REF.interpreter_shape(case.shape)
        assert small["dim"] == case.shape["dim"] and 2 <= small["rows"] <= 9
