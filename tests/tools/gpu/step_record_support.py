"""What the step verify's record and replay tests share (test_step_record.py,
test_step_record_rules.py, test_step_replay_units.py): the decode_step task's reference and eager
step, one recorder for the process (as in step_child.py), and an arena holding the reference's
State with a replayer over it."""

from __future__ import annotations

import json
import types
from typing import Any

import torch

from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.gpu.verify import step_arena, step_record, step_replay
from harnesslab.tools.task import load_task

TASK = load_task("decode_step")
REF = load_module(TASK.root / "reference.py", "decode_step_reference_record")
EAGER = load_module(TASK.workspace_template / "kernel.py", "decode_step_eager_record")
CONFIG = REF.Config(**TASK.step.interpreter.model_dump(), dtype="float16")  # type: ignore[union-attr]
TOL = TASK.tolerances["float16"]
RECORDER = step_record.StepRecorder(torch, "cpu")  # one per process, as in step_child.py


class Arena:
    """The parent's truth and the arena's State with the same weights and prompts."""

    def __init__(self) -> None:
        self.truth = REF.new_state(CONFIG, seed=3)
        layout, size = step_arena.layout(CONFIG)
        self.u8 = torch.zeros(size, dtype=torch.uint8)
        self.views = step_arena.views(torch, self.u8, layout)
        for name, w in self.truth.weights.items():
            self.views[f"w.{name}"].copy_(w)
        self.views["rope_cos"].copy_(self.truth.rope_cos)
        self.views["rope_sin"].copy_(self.truth.rope_sin)
        v = self.views
        self.state = REF.State(
            config=CONFIG, weights={k[2:]: t for k, t in v.items() if k[:2] == "w."},
            kv_cache=v["kv_cache"], lengths=v["lengths"], host_lengths=[0] * CONFIG.batch,
            rope_cos=v["rope_cos"], rope_sin=v["rope_sin"],
        )  # fmt: skip
        for b in range(CONFIG.batch):
            for s in (self.state, self.truth):
                REF.prefill(s, b, 5 + 3 * b, 11 + b)

    def record(self, step, tokens: list[int]) -> dict[str, Any]:
        self.views["tokens"].copy_(torch.tensor(tokens))
        _, rec = RECORDER.record(
            step, self.state, self.views["tokens"].clone(), self.views["logits"]
        )
        return json.loads(json.dumps(rec))  # as it travels

    def replayer(self) -> step_replay.StepReplay:
        rep = replayer()
        rep.views = self.views
        return rep

    def replay(self, prog: dict[str, Any], tokens: list[int]) -> torch.Tensor:
        """The program replayed on `tokens`: the logits slot (NaN first)."""
        rep = self.replayer()
        rep.program({"key": 0, "program": prog, "kernels": []})
        self.views["tokens"].copy_(torch.tensor(tokens))
        self.views["logits"].fill_(float("nan"))
        assert rep.run_step({"program": 0}) == ("", True)
        return self.views["logits"].clone()

    def close_to_reference(self, got: torch.Tensor, tokens: list[int]) -> bool:
        want = REF.reference_step(self.truth, torch.tensor(tokens))
        return bool((got.float() - want).abs().le(TOL.atol + TOL.rtol * want.abs()).all())


def tensors(args: Any) -> list[dict[str, Any]]:
    if isinstance(args, list):
        return [t for a in args for t in tensors(a)]
    if isinstance(args, dict) and ("t" in args or "const" in args):
        return [args]
    return []


def record_plain(step) -> dict[str, Any]:
    """`step(state, tokens)` recorded over a bare State (a scratch dict, four tokens, a small
    arena): for steps that use none of the model. The recording as it travels."""
    state = types.SimpleNamespace(scratch={})
    tokens = torch.arange(4)
    _, rec = RECORDER.record(step, state, tokens, torch.zeros(64, dtype=torch.uint8))
    return json.loads(json.dumps(rec))


def replayer() -> step_replay.StepReplay:
    """A replay process's state on the CPU, built without its __init__ (no arena, no driver)."""
    rep = object.__new__(step_replay.StepReplay)
    rep.torch, rep.cuda, rep.dev, rep.drv = torch, False, "cpu", None
    rep.kernels, rep.programs, rep.graphs, rep.alias = {}, {}, {}, {}
    rep.reply = lambda **fields: None  # type: ignore[method-assign]
    return rep
