"""The replay process's requests in process on the CPU (tools/gpu/verify/step_replay.py): what
it answers (step_child.py's protocol), which programs, kernels and graphs it keeps, which
program a step runs, when a result reaches the logits slot, and the tensors it rebuilds (on its
own device, inside their storage). A GPU's driver and CUDA graphs are stood in for (they run in
tests/gpu/test_decode_step_gpu.py)."""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu.step_record_support import EAGER, Arena
from harnesslab.tools.gpu.verify import step_replay, step_schema


class Replay:
    """A replayer over a fresh arena whose replies are kept."""

    def __init__(self) -> None:
        self.arena = Arena()
        self.rep = self.arena.replayer()
        self.rep.arena = types.SimpleNamespace(views=lambda layout: self.arena.views)
        self.replies: list[dict[str, Any]] = []
        self.rep.reply = lambda **fields: self.replies.append(fields)  # type: ignore[method-assign]

    def load(self, key: int, prog: dict[str, Any] | None = None, **msg: Any) -> dict[str, Any]:
        """Program `key` (the eager step's unless `prog`) sent as the parent sends it: the
        reply."""
        self.rep.program({"key": key, "program": copy.deepcopy(prog or EAGER_PROGRAM), **msg})
        return self.replies[-1]


EAGER_PROGRAM = step_schema.validate(Arena().record(EAGER.step, [1, 2, 3, 4]), "cpu", {})


@pytest.fixture
def r() -> Replay:
    return Replay()


def test_a_new_trace_is_acknowledged_and_leaves_no_program_of_the_last(r: Replay) -> None:
    assert r.load(0, kernels=[]) == {"error": ""}
    r.rep.trace({"layout": {}})
    assert r.replies[-1] == {"ok": True}
    assert r.rep.programs == {} and r.rep.alias == {}
    assert r.rep.run_step({"program": 0}) == ("KeyError", False)


def test_each_kernel_is_loaded_once_a_process(r: Replay, monkeypatch) -> None:
    loaded: list[str] = []

    def load_kernel(drv: Any, k: dict[str, Any]) -> str:
        loaded.append(k["id"])
        return f"loaded {k['id']}"

    monkeypatch.setattr(step_replay, "load_kernel", load_kernel)
    assert r.load(0, kernels=[{"id": "k0"}]) == {"error": ""}
    assert r.load(1, kernels=[{"id": "k0"}, {"id": "k1"}]) == {"error": ""}
    assert loaded == ["k0", "k1"] and r.rep.kernels == {"k0": "loaded k0", "k1": "loaded k1"}


@pytest.mark.parametrize("msg", [{}, {"kernels": None}], ids=["absent", "null"])
def test_a_program_that_brings_no_kernels_loads(r: Replay, msg: dict[str, Any]) -> None:
    assert r.load(0, **msg) == {"error": ""} and list(r.rep.programs) == [0]


def test_a_repeated_recording_and_a_drop_are_acknowledged(r: Replay) -> None:
    r.load(0, kernels=[])
    r.rep.program({"key": 1, "same_as": 0, "kernels": []})
    r.rep.drop({"keys": [0, 1]}, reply=True)
    assert r.replies == [{"error": ""}] * 3 and r.rep.programs == {}


class Graph:
    """Stands for a CUDA graph the replay captured of a program."""

    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def test_a_step_with_a_captured_graph_replays_it_and_a_drop_frees_it(r: Replay) -> None:
    r.load(0, kernels=[])
    r.rep.graphs[0] = (graph := Graph(), True)
    r.arena.views["logits"].fill_(float("nan"))
    assert r.rep.run_step({"program": 0}) == ("", True)
    assert graph.replays == 1 and r.arena.views["logits"].isnan().all()  # the graph ran, not calls
    r.rep.graphs[0] = (graph, False)
    assert r.rep.run_step({"program": 0}) == ("", False)  # whether the graph copies its result
    r.rep.drop({"keys": [0]})
    assert r.rep.graphs == {}


def test_a_programs_launches_run_in_their_place_among_its_calls(r: Replay) -> None:
    """Each launch from its recorded binary (stood in for: the driver's), with the step's
    storages as they are at that point."""
    prog = copy.deepcopy(EAGER_PROGRAM)
    launch = {"op": "launch", "kernel": "k0", "grid": [1, 1, 1], "params": [], "scratch": {}}
    prog["ops"][1:1] = [launch]
    made_first = [key for _, key in prog["ops"][0]["new"]]
    seen: list[tuple[int, list[str]]] = []
    r.rep.launch = lambda n, op, storages: seen.append((n, sorted(storages)))  # type: ignore[method-assign]
    r.load(0, prog, kernels=[])
    assert r.rep.run_step({"program": 0}) == ("", True)
    assert seen == [(1, sorted(["arena", "tokens", *made_first]))]


def test_a_step_request_that_names_no_program_runs_none(r: Replay) -> None:
    r.load(0, kernels=[])
    assert r.rep.run_step({}) == ("KeyError", False)


@pytest.mark.parametrize(
    "step",
    [
        lambda state, tokens: EAGER.step(state, tokens)[:1],  # broadcast would fill the slot
        lambda state, tokens: EAGER.step(state, tokens).float(),  # copy_ would cast it
    ],
    ids=["shape", "dtype"],
)
def test_a_result_of_another_shape_or_dtype_than_the_slots_is_not_copied(r: Replay, step) -> None:
    prog = step_schema.validate(r.arena.record(step, [1, 2, 3, 4]), "cpu", {})
    r.load(0, prog, kernels=[])
    r.arena.views["logits"].fill_(float("nan"))
    assert r.rep.run_step({"program": 0}) == ("", False)
    assert r.arena.views["logits"].isnan().all()


# -- tensors ------------------------------------------------------------------------------------
def on_meta() -> step_replay.StepReplay:
    """A replayer whose device is not the default one ("meta" stands for a GPU)."""
    rep = Arena().replayer()
    rep.dev = "meta"
    return rep


def test_the_tensors_the_replay_makes_are_on_its_device() -> None:
    rep = on_meta()
    storage = torch.empty(64, dtype=torch.uint8, device="meta").untyped_storage()
    ref = {"t": "arena", "o": 2, "s": [2, 3], "st": [3, 1], "d": "float16"}
    assert rep.tensor(ref, {"arena": storage}).device.type == "meta"
    empty = rep.tensor({"empty": [0, 3], "d": "float16"}, {})
    assert (empty.device.type, empty.shape, empty.dtype) == ("meta", (0, 3), torch.float16)
    assert rep.value({"device": "cpu"}, {}) == torch.device("meta")


def test_the_replay_refuses_a_tensor_whose_shape_and_strides_disagree() -> None:
    """Itself, not only through the schema: every dimension is in its bounds check."""
    rep = Arena().replayer()
    storage = torch.empty(64, dtype=torch.uint8).untyped_storage()
    with pytest.raises(ValueError):
        rep.tensor({"t": "arena", "o": 0, "s": [2, 2], "st": [1], "d": "uint8"},
                   {"arena": storage})  # fmt: skip


def test_a_tensor_kept_by_value_may_have_no_elements() -> None:
    got = Arena().replayer().const({"const": "", "s": [0, 3], "d": "float16"})
    assert (got.shape, got.dtype) == ((0, 3), torch.float16)
