"""The rules of tools/authoring/baseline_check.py: each new task's baseline runs once on its dev
cases (no warmup, one repeat, nothing saved), in its own workspace under a scratch store that is
gone afterwards (never the user's state folder), through one launcher that is always closed; a
task that cannot be evaluated gives its reason and the others still run. The evaluation itself is
faked here (the real path runs in tests/tasks/test_kernelbench.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tools.authoring import baseline_check
from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings


class FakeLauncher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.closed = False

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def calls(monkeypatch) -> dict[str, Any]:
    seen: dict[str, Any] = {"launchers": [], "workspaces": [], "runs": []}

    def build_launcher(settings: Settings) -> FakeLauncher:
        seen["launchers"].append(FakeLauncher(settings))
        return seen["launchers"][-1]

    def init_workspace(task_dir: Path, ws: Path, settings: Settings) -> Path:
        if task_dir.name == "broken":
            raise UsageError("task.toml: no such file", next_step="fix it")
        assert not ws.exists(), "two tasks shared a workspace"
        ws.mkdir(parents=True)
        seen["workspaces"].append((task_dir, ws, settings))
        return ws

    async def run_objective(ws: Path, launcher: FakeLauncher, **kw: Any) -> str:
        seen["runs"].append((ws, launcher, kw))
        return f"result of {ws.name}"

    monkeypatch.setattr(baseline_check, "build_launcher", build_launcher)
    monkeypatch.setattr(baseline_check, "init_workspace", init_workspace)
    monkeypatch.setattr(baseline_check, "run_objective", run_objective)
    return seen


def test_each_baseline_runs_once_in_its_own_scratch_workspace(calls, tmp_path) -> None:
    user = Settings(state_dir=tmp_path / "mine")
    tasks = [tmp_path / "a", tmp_path / "b"]
    got = anyio.run(baseline_check.check_baselines, tasks, user)
    assert got == ["result of ws0", "result of ws1"]
    (launcher,) = calls["launchers"]
    scratch = launcher.settings
    assert scratch.state_dir != user.state_dir and scratch.state_dir.name == "state"
    assert scratch.state_dir.parent.name.startswith("hl-check-")  # a leftover is recognisable
    assert not scratch.state_dir.parent.exists(), "the scratch store outlived the check"
    assert not (tmp_path / "mine").exists()
    assert [t for t, _, _ in calls["workspaces"]] == tasks
    assert all(s is scratch for _, _, s in calls["workspaces"])
    assert {ws.parent for _, ws, _ in calls["workspaces"]} == {scratch.state_dir.parent}
    assert [r[0] for r in calls["runs"]] == [w[1] for w in calls["workspaces"]]
    for _ws, run_launcher, kw in calls["runs"]:
        assert run_launcher is launcher
        assert kw == {"warmup": 0, "repeats": 1, "save": False}
    assert launcher.closed


def test_a_task_that_cannot_be_evaluated_gives_its_reason_and_the_rest_still_run(calls, tmp_path):
    tasks = [tmp_path / "broken", tmp_path / "b"]
    got = anyio.run(baseline_check.check_baselines, tasks, Settings(state_dir=tmp_path / "s"))
    assert got == ["task.toml: no such file", "result of ws1"]
    assert calls["launchers"][0].closed


def test_the_launcher_is_closed_when_a_check_crashes(calls, tmp_path, monkeypatch) -> None:
    async def crash(ws: Path, launcher: FakeLauncher, **kw: Any) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(baseline_check, "run_objective", crash)
    with pytest.raises(RuntimeError, match="boom"):
        anyio.run(baseline_check.check_baselines, [tmp_path / "a"], Settings())
    assert calls["launchers"][0].closed


def test_one_task_is_a_check_of_one(calls, tmp_path) -> None:
    got = anyio.run(baseline_check.check_baseline, tmp_path / "broken", Settings())
    assert got == "task.toml: no such file"
    got = anyio.run(baseline_check.check_baseline, tmp_path / "a", Settings())
    assert got == "result of ws0"
