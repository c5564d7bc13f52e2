"""The warm runner on a GPU, in process (tools/gpu/runner.py): a second request on an unchanged
candidate asks Triton for no kernel, because the candidate's module (and with it every compiled
specialization) is imported once a process (runner._IMPORTED); a changed candidate is imported,
and looked up, afresh. Under the interpreter Triton compiles nothing, so only a GPU shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import triton.runtime.jit as jit

from harnesslab.tools.gpu import runner
from harnesslab.tools.task.spec import load_task

TASK = load_task("rmsnorm_gate")


def request() -> dict[str, Any]:
    return {
        "reference": str(TASK.root / "reference.py"),
        "tolerances": {k: v.model_dump() for k, v in TASK.tolerances.items()},
        "cases": [c.model_dump() for c in TASK.dev_cases],
        "entry": "fast.py:rmsnorm_gate",
        "config_file": TASK.config_file,
        "seed": 7,
        "case_timeout_s": 300,
    }


def test_a_second_request_on_an_unchanged_candidate_compiles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cand = tmp_path / "cand"
    cand.mkdir()
    source = (TASK.root / "solutions" / "fast.py").read_text()
    (cand / "fast.py").write_text(source + f"\n# {tmp_path.name}\n")  # new to this process
    compiles: list[str] = []
    do_compile = jit.JITFunction._do_compile

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        compiles.append(self.fn.__name__)
        return do_compile(self, *args, **kwargs)

    monkeypatch.setattr(jit.JITFunction, "_do_compile", counted)
    env = runner.Env(interpret=False)
    first = runner.Evaluator(env, request()).evaluate(str(cand), timing=False)
    looked_up = len(compiles)
    second = runner.Evaluator(env, request()).evaluate(str(cand), timing=False)
    unchanged = len(compiles) - looked_up
    (cand / "fast.py").write_text((cand / "fast.py").read_text() + "# changed\n")
    third = runner.Evaluator(env, request()).evaluate(str(cand), timing=False)
    assert first["status"] == second["status"] == third["status"] == "passed"
    assert looked_up >= 1 and unchanged == 0
    assert len(compiles) - looked_up == looked_up  # the changed candidate: every one again
