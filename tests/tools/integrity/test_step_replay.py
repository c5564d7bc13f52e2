"""The step verify with its replay (task.toml's step.replay; "gpu" by default, "always" here: the
eager steps below are torch operators only, which the CPU replays too): every step of the last
checked pass recorded in the candidate's process, checked, and replayed in a sandboxed process of
the harness's (gpu/verify/step_replay.py) for the timed pass, every replayed step's logits and the
cache after it checked by the trusted parent.

The cheats in tools/integrity/cheats/step/replay/ are steps whose own steps are right in every
checked pass, so the candidate's own timed steps pass too (step.replay "never", as before the
replay): work hidden from the recorder, a forged recording. Replayed, their timed pass is wrong.
Each verify costs ~5 s of CPU on the interpreter's tiny decode_step; the ones that repeat a
mechanism are `slow`."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import make_workspace, verify_step
from harnesslab.tools.integrity import public_verdict
from harnesslab.tools.integrity.reasons import REASONS
from harnesslab.tools.integrity.verdict import Verdict
from harnesslab.tools.task import load_task

CORPUS = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "step" / "replay"
BASELINE = load_task("decode_step").workspace_template / "kernel.py"


def expect(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return next(ln.split(":", 1)[1].strip() for ln in doc.splitlines() if ln.startswith("expect:"))


def verify(tmp_path: Path, kernel: Path, replay: str = "always", ws=None) -> tuple[object, Verdict]:
    ws = ws or make_workspace(tmp_path, "decode_step")
    ws.task.step.replay = replay  # type: ignore[union-attr]
    return verify_step(tmp_path, kernel.read_text(), ws)


def test_an_honest_step_passes_with_its_timed_pass_replayed(tmp_path: Path) -> None:
    _, v = verify(tmp_path, BASELINE)
    assert v.verdict == "passed", v.reasons
    assert v.certifies == "step_replayed" and v.unverified == ["step_idle", "speed"]
    assert all(c.passed for c in v.result.cases) and v.score_us is not None and v.score_us > 0
    # every step of each trace's last checked pass recorded; the eager step's recordings repeat
    # (it reads the lengths on the device): one program per trace
    replay = v.evidence["replay"]
    assert set(replay) == {f"candidate:{c.name}" for c in v.result.cases}
    assert all(r["steps"] > 1 and r["programs"] == 1 for r in replay.values()), replay
    sandbox = v.evidence["sandbox"]
    assert set(sandbox) == {"candidate", "candidate_replay"}
    assert sandbox["candidate_replay"]["level"] == sandbox["candidate"]["level"] == "full"


@pytest.mark.parametrize(
    "name",
    [pytest.param("hidden_cache_append"),
     pytest.param("forged_empty_recording", marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_step_whose_recording_is_not_its_work_fails_its_replayed_timed_pass(
    tmp_path: Path, name: str
) -> None:
    path = CORPUS / f"{name}.py"
    _, v = verify(tmp_path, path)
    assert v.verdict == "rejected" and v.reasons[0]["code"] == expect(path) == "wrong_output"
    assert "timed pass" in v.reasons[0]["detail"]  # its checked passes (its own steps) passed
    shown = public_verdict(v)
    assert shown["reasons"] == [{"code": "wrong_output", "detail": REASONS["wrong_output"]}]


@pytest.mark.slow("the other half of test_a_step_whose_recording_is_not_its_work_...")
@pytest.mark.parametrize("name", ["hidden_cache_append", "forged_empty_recording"])
def test_without_the_replay_the_same_steps_pass(tmp_path: Path, name: str) -> None:
    _, v = verify(tmp_path, CORPUS / f"{name}.py", replay="never")
    assert v.verdict == "passed" and v.certifies == "step_outputs", v.reasons


@pytest.mark.slow("the incumbent's own mechanism: test_step_cheats; its replay: the GPU tests")
def test_the_best_checkpoint_is_replayed_beside_the_candidate(tmp_path: Path) -> None:
    ws, first = verify(tmp_path, BASELINE)
    assert first.verdict == "passed"
    honest = CORPUS.parent / "honest" / "host_positions.py"  # torch.tensor(host lengths)
    _, second = verify(tmp_path, honest, ws=ws)
    assert second.verdict == "passed" and second.certifies == "step_replayed", second.reasons
    inc = second.incumbent
    assert inc is not None and inc["error"] is None
    assert all(r["incumbent_passed"] and r["incumbent_us"] > 0 for r in inc["cases"])
    assert set(second.evidence["sandbox"]) == {"candidate", "candidate_replay", "incumbent",
                                                "incumbent_replay"}  # fmt: skip
