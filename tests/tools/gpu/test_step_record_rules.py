"""The step recorder's rules on the CPU (tools/gpu/verify/step_record.py), each through what
the schema (step_schema.py) and the replay (step_replay.py) then make of the recording: every
argument kind comes back as it went in; what the step made before it, or moved off its device,
or ran outside ATen is named and refused; host data is kept by value up to the task's limit;
the recorder stops at its cap; its hooks pass calls through. A GPU's launches are stood in for
(Triton's launcher records them there: tests/gpu/test_decode_step_gpu.py)."""

from __future__ import annotations

import gc
import re
import sys
import weakref
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu.step_record_support import (
    CONFIG,
    EAGER,
    RECORDER,
    Arena,
    record_plain,
    replayer,
    tensors,
)
from harnesslab.tools.gpu.verify import step_record, step_schema
from harnesslab.tools.gpu.verify.guard_schema import DTYPES, Bad
from harnesslab.tools.task import load_task

WORDS = step_schema.STEP_UNREPLAYABLE
# The largest tensor from host data kept by value, as the task tells the agent ("up to 64 KiB").
KIB = int(re.search(r"up to\s+(\d+)\s+KiB", load_task("decode_step").brief_path().read_text())[1])


def refusal(rec: dict[str, Any]) -> Bad:
    with pytest.raises(Bad) as exc:
        step_schema.validate(rec, "cpu", {})
    return exc.value


# -- arguments ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "back"),
    [
        (None, None), (True, True), (7, 7), ("floor", "floor"), (-1.5, -1.5),
        ((3, 4), [3, 4]), ([(1, 2), [3.5]], [[1, 2], [3.5]]),
        (torch.float16, torch.float16), (torch.bool, torch.bool),
        (torch.device("cpu"), torch.device("cpu")), (torch.strided, torch.strided),
        (torch.contiguous_format, torch.contiguous_format),
        (torch.preserve_format, torch.preserve_format),
        (torch.channels_last, torch.channels_last),
    ],
)  # fmt: skip
def test_every_argument_kind_comes_back_in_the_replay_as_the_step_passed_it(value, back) -> None:
    """Recorded, sent as JSON, checked, and rebuilt by the replay: the same object (a tuple as
    a list, as ATen takes either)."""
    rec = record_plain(lambda state, tokens: tokens + 0)
    rec["ops"].insert(0, {"op": "aten", "fn": "add.Tensor", "args": [RECORDER.encode(value)],
                          "kwargs": {}, "new": []})  # fmt: skip
    arg = step_schema.validate(rec, "cpu", {})["ops"][0]["args"][0]
    got = replayer().value(arg, {})
    assert got == back and type(got) is type(back)


def test_an_argument_of_no_kind_the_replay_knows_is_named() -> None:
    rec = record_plain(lambda state, tokens: torch.full((2,), 1 + 2j))  # a complex scalar
    assert rec["unsupported"] == ["argument"]
    assert str(refusal(rec)) == WORDS["argument"]


def odd_kinds(state, tokens):
    """The eager step, then calls of kinds it never makes, none changing the logits: a call
    that returns a list of new tensors, one that returns nothing, a tensor with no bytes in a
    list, dtype, device, layout and memory format arguments."""
    out = EAGER.step(state, tokens)
    half, other = torch._foreach_mul([out, out], 0.5)
    torch._foreach_add_([other], 0.0)
    out = torch.cat([half + other, out.new_zeros(0, out.shape[1])])
    square = out.reshape(1, 1, *out.shape).contiguous(memory_format=torch.channels_last)
    zeros = torch.zeros(out.shape, dtype=out.dtype, device=out.device, layout=torch.strided)
    return square.reshape(out.shape) + zeros


def test_a_step_of_argument_kinds_the_eager_step_never_makes_replays_to_the_reference() -> None:
    a = Arena()
    rec = a.record(odd_kinds, [1, 2, 3, 4])
    assert rec["unsupported"] == []
    prog = step_schema.validate(rec, "cpu", {})
    listed = [t for o in prog["ops"] for a in o["args"] if isinstance(a, list) for t in a]
    assert {"empty": [0, CONFIG.vocab], "d": "float16"} in listed  # no bytes: by its shape
    assert a.close_to_reference(a.replay(prog, [8, 1, 4, 2]), [8, 1, 4, 2])


# -- what the step did not make in the step -----------------------------------------------------
KEPT_ROW = torch.zeros(1, CONFIG.vocab, dtype=torch.float16)  # a module's, made before any step
KEPT_LOGITS = torch.zeros(CONFIG.batch, CONFIG.vocab, dtype=torch.float16)


def kept_in_a_list(state, tokens):
    return torch.cat([EAGER.step(state, tokens), KEPT_ROW])[: CONFIG.batch]


def kept_as_the_result(state, tokens):
    return KEPT_LOGITS


@pytest.mark.parametrize("step", [kept_in_a_list, kept_as_the_result])
def test_a_tensor_made_before_the_step_is_refused_wherever_the_step_passes_it(step) -> None:
    """Small, and not from host data in the step: not kept by value, in a list as in a single
    argument, and as the step's result."""
    rec = Arena().record(step, [1, 2, 3, 4])
    assert rec["unsupported"] == ["foreign_tensor"]
    assert (refusal(rec).code, str(refusal(rec))) == ("unreplayable", WORDS["foreign_tensor"])


def through_lift_fresh(state, tokens):
    return EAGER.step(state, torch.ops.aten.lift_fresh.default(tokens))


def test_a_tensor_of_the_steps_storages_is_named_by_them_where_one_by_value_could_stand() -> None:
    """lift_fresh takes host data (kept by value), but the step's own tokens passed to it stay
    the tokens: the replay reads the new ones."""
    a = Arena()
    prog = step_schema.validate(a.record(through_lift_fresh, [1, 2, 3, 4]), "cpu", {})
    assert not [t for o in prog["ops"] for t in tensors(o["args"]) if "const" in t]
    assert a.close_to_reference(a.replay(prog, [7, 5, 3, 1]), [7, 5, 3, 1])


@pytest.mark.parametrize(("extra", "by_value"), [(0, True), (1, False)])
def test_host_data_is_kept_by_value_up_to_the_tasks_limit(extra: int, by_value: bool) -> None:
    """float32 elements: the limit is in bytes, not elements."""
    n = KIB * 1024 // 4 + extra
    rec = record_plain(lambda state, tokens: torch.tensor([0.5] * n) * 2)
    if by_value:
        prog = step_schema.validate(rec, "cpu", {})
        (kept,) = [t for o in prog["ops"] for t in tensors(o["args"]) if "const" in t]
        assert kept["s"] == [n] and replayer().const(kept).equal(torch.full((n,), 0.5))
    else:
        assert rec["unsupported"] == ["foreign_tensor"]
        assert f"over {KIB} KiB" in str(refusal(rec))


VALUES = {"bool": [True, False, True], "uint8": [1, 2, 255]}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_host_data_of_every_dtype_the_replay_knows_comes_back_with_its_values(dtype: str) -> None:
    """Its bytes checked against its shape by the element size torch gives the dtype."""
    want = torch.tensor(VALUES.get(dtype, [1, -2, 3]), dtype=getattr(torch, dtype))
    rec = record_plain(lambda state, tokens: torch.tensor(want.tolist(), dtype=want.dtype) + 0)
    prog = step_schema.validate(rec, "cpu", {})
    (kept,) = [t for o in prog["ops"] for t in tensors(o["args"]) if "const" in t]
    rep = replayer()
    rep.program({"key": 0, "program": prog, "kernels": []})
    got = rep.value(kept, {})
    assert got.dtype == want.dtype and got.equal(want)


def test_host_data_copied_in_by_lift_fresh_copy_is_kept_by_value_too() -> None:
    """lift_fresh_copy is what torch.tensor(data) calls where a functional pass rewrote it."""
    host = torch.arange(4.0)  # stands for the tensor torch.tensor builds from host data
    rec = record_plain(lambda state, tokens: torch.ops.aten.lift_fresh_copy.default(host) + 0)
    prog = step_schema.validate(rec, "cpu", {})
    (kept,) = [t for o in prog["ops"] for t in tensors(o["args"]) if "const" in t]
    assert replayer().const(kept).equal(host)


def off_the_device(state, tokens):
    moved = tokens.to("meta")  # stands for a host tensor on a GPU: a device not the step's
    moved + 1
    return tokens + 0


def test_a_tensor_that_leaves_the_steps_device_or_comes_from_another_is_named() -> None:
    rec = record_plain(off_the_device)
    assert rec["unsupported"] == ["host_read", "host_tensor"]
    assert str(refusal(rec)) == "; ".join(sorted([WORDS["host_read"], WORDS["host_tensor"]]))


torch.library.define("harnesslab_step_test::twice", "(Tensor x) -> Tensor")
torch.library.impl("harnesslab_step_test::twice", "CompositeExplicitAutograd", lambda x: x * 2)


def test_an_operator_outside_aten_is_named_and_not_recorded() -> None:
    rec = record_plain(lambda state, tokens: torch.ops.harnesslab_step_test.twice(tokens) + 0)
    assert rec["unsupported"] == ["custom_op"]
    assert [o["fn"] for o in rec["ops"]] == ["add.Tensor"]
    assert str(refusal(rec)) == WORDS["custom_op"]


def calls(n: int):
    def step(state, tokens):
        for _ in range(n):
            tokens = torch.neg(tokens)
        return tokens

    return step


def test_the_recorder_stops_at_20000_operator_calls_and_names_a_step_past_them() -> None:
    rec = record_plain(calls(20000))
    assert len(rec["ops"]) == 20000 and rec["unsupported"] == []
    rec = record_plain(calls(20001))
    assert len(rec["ops"]) == 20000 and rec["unsupported"] == ["too_many_ops"]
    exc = refusal(rec)
    assert (exc.code, str(exc)) == ("unreplayable", "more than 20000 operator calls in one step")


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("set_", lambda state, tokens: tokens.clone().set_(tokens)),
        ("resize_", lambda state, tokens: tokens.clone().resize_(2)),
        ("resize_as_", lambda state, tokens: tokens.clone().resize_as_(tokens[:2])),
        ("_assert_async", lambda state, tokens: torch._assert_async(tokens.sum() > -1)),
        ("_assert_scalar", lambda state, tokens: torch.ops.aten._assert_scalar(True, "fine")),
        ("_print", lambda state, tokens: torch.ops.aten._print("recorded")),
    ],
)
def test_a_step_calling_an_operator_the_replay_does_not_run_is_refused_by_its_name(
    name: str, step
) -> None:
    """The names the recorder writes for these calls are the ones the schema refuses."""

    def then(state, tokens):
        step(state, tokens)
        return tokens + 0

    exc = refusal(record_plain(then))
    assert (exc.code, str(exc)) == (
        "unreplayable", f"the step called {name}, which the replay does not run")  # fmt: skip


def test_the_recorder_lets_go_of_the_steps_tensors_once_it_is_recorded() -> None:
    made: list[weakref.ref] = []

    def step(state, tokens):
        scratch = tokens * 3
        made.append(weakref.ref(scratch))
        return tokens + scratch

    record_plain(step)
    gc.collect()
    assert made[0]() is None


# -- the recorder's hooks -----------------------------------------------------------------------
class StandIn:
    """What the recorder wraps (torch's CUDA graph capture and replay, Triton's interpreter
    launch), stood in for: each call noted, each with its own result."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, name: str):
        def call(obj: Any, *args: Any, **kwargs: Any) -> str:
            self.calls.append(name)
            return f"{name} result"

        return call


@pytest.fixture
def fresh(monkeypatch):
    """A new recorder over stand-ins (the wrapped originals come back after the test)."""
    from triton.runtime.interpreter import GridExecutor

    stand_in = StandIn()
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", stand_in("capture"))
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", stand_in("replay"))
    monkeypatch.setattr(GridExecutor, "__call__", stand_in("interpret"))
    return step_record.StepRecorder(torch, "cpu"), stand_in, GridExecutor


def test_the_hooks_pass_calls_through_and_note_them_only_while_recording(fresh) -> None:
    rec, stand_in, grid = fresh
    graph = torch.cuda.CUDAGraph
    assert graph.capture_begin(None) == "capture result"  # not recording: torch's own
    assert graph.replay(None) == "replay result" and grid.__call__(None) == "interpret result"
    seen: list[str] = []

    def step(state, tokens):
        seen.extend([graph.replay(None), grid.__call__(None)])
        return tokens + 0

    _, recording = rec.record(step, Arena().state, torch.arange(4), torch.zeros(8))
    assert seen == ["replay result", "interpret result"]
    assert recording["unsupported"] == ["graph_replay", "interpreted_launch"]
    words = sorted([WORDS["graph_replay"], WORDS["interpreted_launch"]])
    assert str(refusal(recording)) == "; ".join(words)
    assert stand_in.calls == ["capture", "replay", "interpret", "replay", "interpret"]


@pytest.mark.usefixtures("fresh")  # its stand-ins: the new recorder's wraps are undone after
def test_a_recorder_where_triton_has_no_interpreter_still_watches_cuda_graphs(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "triton.runtime.interpreter", None)  # its import fails
    other = step_record.StepRecorder(torch, "cpu")

    def step(state, tokens):
        torch.cuda.CUDAGraph.replay(None)
        return tokens + 0

    _, recording = other.record(step, Arena().state, torch.arange(4), torch.zeros(8))
    assert recording["unsupported"] == ["graph_replay"]


@pytest.mark.usefixtures("fresh")  # its stand-ins: the new recorder's wraps are undone after
def test_a_cpu_recorder_leaves_tritons_gpu_launcher_alone(monkeypatch) -> None:
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.compiler.compiler import CompiledKernel

    launcher, handles = CudaLauncher.__call__, CompiledKernel._init_handles
    monkeypatch.setattr(CudaLauncher, "__call__", launcher)  # put back after, wrapped or not
    monkeypatch.setattr(CompiledKernel, "_init_handles", handles)
    assert step_record.StepRecorder(torch, "cpu").launches is None
    assert (CudaLauncher.__call__, CompiledKernel._init_handles) == (launcher, handles)


class Launches:
    """Stands for the recorder's launch recorder (guard_record.Recorder at Triton's launcher):
    what it holds of the kernels it saw, and the launches it appends to the step's calls."""

    def __init__(self) -> None:
        self.kernels = {k: {"id": k, "cubin": "AAAA", "_cubin": object()} for k in ("k0", "k1")}
        self.active, self.steps, self.unsupported = False, [], set()
        self.during: list[bool] = []

    def launch(self, kernel: str) -> None:
        self.during.append(self.active)
        self.steps.append({"op": "launch", "kernel": kernel, "grid": [1, 1, 1], "params": []})


def test_a_kernel_goes_with_the_first_recording_that_launches_it_without_its_handle(
    fresh,
) -> None:
    rec, _, _ = fresh
    rec.launches = launches = Launches()

    def step(state, tokens):
        launches.launch("k0")
        launches.unsupported.add("scalar")
        return tokens + 0

    def record() -> dict[str, Any]:
        return rec.record(step, Arena().state, torch.arange(4), torch.zeros(8))[1]

    first = record()
    assert [o["op"] for o in first["ops"]] == ["launch", "aten"]
    assert first["kernels"] == [{"id": "k0", "cubin": "AAAA"}]
    assert first["unsupported"] == ["scalar"]
    assert launches.during == [True] and not launches.active  # launches watched in the step only
    assert record()["kernels"] == []  # sent once a process
