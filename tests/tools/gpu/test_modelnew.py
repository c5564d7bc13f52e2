"""A KernelBench `ModelNew` class as a candidate entry (tools/gpu/modelnew.py): built once per
constructor arguments, in their declared order, under the task's seed; the task's weights bound
to its parameters without a copy (a kernel reads the very tensors the caller passed), by name,
or in order when the names differ and the shapes agree; a mismatch is the candidate's error."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import ClassVar

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


def test_only_a_module_class_is_a_module_entry() -> None:
    assert modelnew.is_module_class(Same) is True
    assert modelnew.is_module_class(int) is False
    assert modelnew.is_module_class(lambda x: x) is False
    assert modelnew.is_module_class(Same(3, 5)) is False  # an instance, not the class


class Recorder(nn.Module):
    """Records its constructor's arguments, the device it is built on and a draw of the RNG."""

    seen: ClassVar[list[tuple]] = []

    def __init__(self, *args):
        super().__init__()
        draw = torch.rand(1)
        Recorder.seen.append((args, draw.device, draw.item() if draw.device.type == "cpu" else 0))
        self.w = nn.Parameter(torch.zeros(3))

    def forward(self, *xs):
        return self.w, xs


def test_constructor_arguments_lists_as_tuples_in_the_declared_order_only_for_the_declared_set():
    Recorder.seen.clear()
    w = torch.ones(3)
    modelnew.ModuleEntry(Recorder, {"params": ["w"], "init": ["a", "b"]})(w, b=[1, 2], a=3)
    modelnew.ModuleEntry(Recorder, {"params": ["w"], "init": ["a", "b"]})(w, b=[4], c=5)
    modelnew.ModuleEntry(Recorder, None)(w, b=[6], a=7)  # no module table: kwargs' order
    assert [s[0] for s in Recorder.seen] == [(3, (1, 2)), ((4,), 5), ((6,), 7)]


def test_the_module_is_built_under_the_tasks_seed_without_moving_the_callers_rng() -> None:
    Recorder.seen.clear()
    w = torch.ones(3)
    torch.manual_seed(123)
    modelnew.ModuleEntry(Recorder, {"params": ["w"]})(w)  # seed 0 by default
    after = torch.rand(1).item()
    modelnew.ModuleEntry(Recorder, {"params": ["w"], "seed": 7})(w)
    torch.manual_seed(0)
    zero = torch.rand(1).item()
    torch.manual_seed(7)
    seven = torch.rand(1).item()
    torch.manual_seed(123)
    assert after == torch.rand(1).item()  # the caller's stream as if nothing was built
    assert [s[2] for s in Recorder.seen] == [zero, seven]


def test_one_build_per_constructor_arguments_and_device() -> None:
    Recorder.seen.clear()
    entry = modelnew.ModuleEntry(Recorder, {"params": ["w"]})
    w = torch.ones(3)
    first = entry.build({"a": 1}, torch.device("cpu"))
    assert entry.build({"a": 1}, torch.device("cpu")) is first
    assert entry.build({"a": 2}, torch.device("cpu")) is not first
    entry(w, a=1)
    assert len(Recorder.seen) == 2


def test_the_module_is_built_on_the_inputs_device() -> None:
    Recorder.seen.clear()
    w = torch.ones(3, device="meta")
    modelnew.ModuleEntry(Recorder, {"params": ["w"]})(2.0, w)  # a number first: no device
    modelnew.ModuleEntry(Recorder, {"params": []})(2.0)  # no tensor at all: the CPU
    assert [s[1].type for s in Recorder.seen] == ["meta", "cpu"]


def test_a_cuda_build_forks_the_rng_of_the_inputs_card(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    forked: list[object] = []

    @contextlib.contextmanager
    def fork_rng(**kw):
        forked.append(kw.get("devices", "all"))
        yield

    class Card:  # a stand-in for torch.device("cuda", index): only what build reads
        type = "cuda"

        def __init__(self, index):
            self.index = index

        def __str__(self):
            return f"cuda:{self.index}"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.random, "fork_rng", fork_rng)
    entry = modelnew.ModuleEntry(Recorder, {"params": ["w"]})
    for index in (None, 0, 1):
        entry.build({}, Card(index))
    entry.build({}, torch.device("cpu"))
    assert forked == [[0], [0], [1], []]


def test_bound_weights_take_no_gradient_and_must_all_be_given() -> None:
    (x, w, b), kw = _args()
    got_w, got_b, _ = modelnew.ModuleEntry(Same, MODULE)(x, w, b, **kw)
    assert got_w.requires_grad is False and got_b.requires_grad is False
    with pytest.raises(ValueError):
        modelnew.ModuleEntry(Same, {**MODULE, "params": ["x", *MODULE["params"]]})(w, b, **kw)


def test_parameters_are_bound_by_name_whatever_their_order() -> None:
    (x, w, b), kw = _args()
    module = {**MODULE, "params": ["lin.bias", "lin.weight"]}
    got_w, got_b, _ = modelnew.ModuleEntry(Same, module)(x, b, w, **kw)
    assert got_w.data_ptr() == w.data_ptr() and got_b.data_ptr() == b.data_ptr()


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.training, self.bn.running_mean, x


def test_an_eval_task_binds_buffers_too_and_a_training_one_only_parameters() -> None:
    x, w, b, mean = torch.randn(2, 3), torch.randn(3), torch.randn(3), torch.randn(3)
    params = ["bn.weight", "bn.bias", "bn.running_mean"]
    training, got_mean, _ = modelnew.ModuleEntry(Normed, {"params": params, "train": False})(
        x, w, b, mean
    )
    assert training is False and got_mean is mean
    training, _, _ = modelnew.ModuleEntry(Normed, {"params": params[:2]})(x, w, b)
    assert training is True  # train by default
    with pytest.raises(TypeError, match="do not match"):  # a buffer is no parameter in training
        modelnew.ModuleEntry(Normed, {"params": params})(x, w, b, mean)


def test_a_modelnew_with_fewer_parameters_than_the_reference_is_the_candidates_error() -> None:
    class One(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.w = nn.Parameter(torch.empty(n_out, n_in))

        def forward(self, x):
            return x

    (x, w, b), kw = _args()
    with pytest.raises(TypeError, match="do not match the reference Model's"):
        modelnew.ModuleEntry(One, MODULE)(x, w, b, **kw)


def test_parameters_as_many_as_the_references_but_shaped_otherwise_are_the_candidates_error():
    class Swapped(nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.b = nn.Parameter(torch.empty(n_out))  # bias first: the shapes disagree in order
            self.w = nn.Parameter(torch.empty(n_out, n_in))

        def forward(self, x):
            return x

    (x, w, b), kw = _args()
    with pytest.raises(TypeError, match="do not match the reference Model's"):
        modelnew.ModuleEntry(Swapped, MODULE)(x, w, b, **kw)
