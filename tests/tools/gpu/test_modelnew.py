"""A KernelBench `ModelNew` class as a candidate entry (tools/gpu/modelnew.py): built once per
constructor arguments, in their declared order, under the task's seed; the task's weights bound
to its parameters without a copy (a kernel reads the very tensors the caller passed), by name,
or in order when the names differ and the shapes agree; a mismatch is the candidate's error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from harnesslab.tools import gpu

spec = importlib.util.spec_from_file_location("_modelnew", Path(gpu.__path__[0]) / "modelnew.py")
assert spec is not None and spec.loader is not None
modelnew = importlib.util.module_from_spec(spec)
spec.loader.exec_module(modelnew)

MODULE = {"params": ["lin.weight", "lin.bias"], "init": ["n_in", "n_out"], "seed": 0, "train": True}
BUILT: list[tuple] = []


class Same(nn.Module):
    def __init__(self, n_out, n_in):  # its own order: built from the declared order by position
        super().__init__()
        BUILT.append((n_out, n_in))
        self.lin = nn.Linear(n_out, n_in)  # (n_in, n_out) positionally, as KernelBench builds

    def forward(self, x):
        return self.lin.weight, self.lin.bias, x


class Renamed(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.w = nn.Parameter(torch.empty(n_out, n_in))
        self.b = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return self.w, self.b, x


def _args(n_in: int = 5, n_out: int = 3):
    x, w, b = torch.randn(2, n_in), torch.randn(n_out, n_in), torch.randn(n_out)
    return (x, w, b), {"n_out": n_out, "n_in": n_in}


def test_the_weights_are_bound_without_a_copy_and_the_module_built_once() -> None:
    BUILT.clear()
    entry = modelnew.ModuleEntry(Same, MODULE)
    for _ in range(2):
        (x, w, b), kw = _args()
        got_w, got_b, got_x = entry(x, w, b, **kw)
        assert got_w.data_ptr() == w.data_ptr() and got_b.data_ptr() == b.data_ptr()
        assert got_x is x
    assert BUILT == [(5, 3)]  # once, with the declared order (n_in, n_out) by position


def test_parameters_named_otherwise_are_bound_in_order_when_the_shapes_agree() -> None:
    (x, w, b), kw = _args()
    got_w, got_b, _ = modelnew.ModuleEntry(Renamed, MODULE)(x, w, b, **kw)
    assert got_w.data_ptr() == w.data_ptr() and got_b.data_ptr() == b.data_ptr()


def test_parameters_that_do_not_match_are_the_candidates_error() -> None:
    class Wrong(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.w = nn.Parameter(torch.empty(n_in, n_out))  # transposed

        def forward(self, x):
            return x

    (x, w, b), kw = _args()
    with pytest.raises(TypeError, match="do not match the reference Model's"):
        modelnew.ModuleEntry(Wrong, MODULE)(x, w, b, **kw)


def test_a_module_task_falls_back_to_modelnew_and_a_function_wins() -> None:
    class Mod:
        ModelNew = Same

    assert modelnew.resolve(Mod, "model_new", MODULE) is Same
    assert modelnew.resolve(Mod, "model_new", None) is None  # not a module task: no fallback
    Mod.model_new = staticmethod(lambda x: x)  # type: ignore[attr-defined]
    assert modelnew.resolve(Mod, "model_new", MODULE) is not Same
