"""softmax task content: reference.py's interface, the baseline and the reference solutions on the
Triton CPU interpreter (irregular and wide rows, every probe), and probes that catch known bugs. The checks every task shares
are in test_task_contract.py."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from harnesslab.tests.tasks.kernel_check import load_reference, passes
from harnesslab.tools.task.spec import load_task

SPEC = load_task("softmax")
REF = load_reference(SPEC)


def _softmax_torch(x: torch.Tensor, *, subtract_max: bool = True, pad_with: float | None = None,
                   pad_to: int = 1024) -> torch.Tensor:  # fmt: skip
    xf = x.float()
    if pad_with is not None:  # a block padded past dim with the wrong value
        xf = torch.nn.functional.pad(xf, (0, pad_to - xf.shape[-1]), value=pad_with)
    if subtract_max:
        xf = xf - xf.amax(-1, keepdim=True)
    e = torch.exp(xf)
    y = e / e.sum(-1, keepdim=True)
    return y[..., : x.shape[-1]].to(x.dtype)


@pytest.mark.parametrize(
    ("probe", "flaw"),
    [
        ("large_logits", {"subtract_max": False}),
        ("negative_logits_odd_dim", {"pad_with": 0.0}),
        ("constant_rows", {"pad_with": 0.0, "pad_to": 4096}),
    ],
)
def test_probe_rejects_a_kernel_with_its_bug_in_fp16(probe: str, flaw: dict[str, Any]) -> None:
    assert passes(SPEC, REF, probe, torch.float16, _softmax_torch)
    assert not passes(SPEC, REF, probe, torch.float16, functools.partial(_softmax_torch, **flaw))


def test_tolerance_rejects_an_all_zero_output_on_wide_rows() -> None:
    assert not passes(SPEC, REF, "wide_dim_32768", torch.float16, torch.zeros_like)


def test_reference_interface_sizes_and_interpreter_shapes() -> None:
    shape = {"rows": 5, "dim": 3000}
    (x,), kwargs = REF.make_inputs(shape, torch.float16, "cpu", torch.Generator().manual_seed(7))
    (x2,), _ = REF.make_inputs(shape, torch.float16, "cpu", torch.Generator().manual_seed(7))
    assert kwargs == {} and x.shape == (5, 3000) and torch.equal(x, x2)
    assert REF.reference(x).dtype == torch.float32
    assert REF.output_spec(x) == ((5, 3000), torch.float16)
    assert REF.bytes_moved({"rows": 2048, "dim": 32768}, 2) == 2 * 2048 * 32768 * 2
    assert set(REF.PROBES) == set(REF.PROBE_NOTES)
    for case in SPEC.dev_cases:
        small = REF.interpreter_shape(case.shape)
        assert small["dim"] == case.shape["dim"] and 2 <= small["rows"] <= 9
