"""compare's statistics, arms and reruns, without running the loop (tests/harnessgym runs real
trials)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from harnesslab.servers.cli import parse
from harnesslab.servers.compare_cmd import arms_from
from harnesslab.tools.errors import ExecutorError, UsageError
from harnesslab.tools.loop import compare as compare_mod
from harnesslab.tools.loop.compare import (
    Arm,
    CompareConfig,
    Trial,
    bootstrap_difference,
    compare,
    difference,
    finished_trials,
    quantile,
    summarize_arm,
)
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace


def trials(arm: str, scores: list[float | None], invalid: str = "no passing score") -> list[Trial]:
    return [
        Trial(
            arm=arm,
            index=i + 1,
            workspace="x",
            score=s,
            valid=s is not None,
            invalid_reason="" if s is not None else invalid,
        )
        for i, s in enumerate(scores)
    ]


def test_invalid_trials_are_counted_apart_and_never_scored():
    ts = trials("a", [10.0, None, 14.0, 12.0])
    s = summarize_arm(Arm(name="a"), ts, [], higher=False)
    assert (s.trials, s.valid, s.invalid) == (4, 3, 1)
    assert s.median == 12.0 and s.best == 10.0 and s.worst == 14.0
    assert quantile([10.0, 12.0, 14.0], 0.5) == 12.0 and quantile([1.0, 3.0], 0.25) == 1.5


def test_the_difference_has_a_direction_and_a_bootstrap_interval():
    ts = trials("plain", [100.0, 104.0, 98.0, 101.0]) + trials(
        "harnessed", [80.0, 83.0, 79.0, 81.0]
    )
    a = summarize_arm(Arm(name="plain"), ts[:4], [], higher=False)
    b = summarize_arm(Arm(name="harnessed"), ts[4:], ["srv"], higher=False)
    d = difference(a, b, ts, higher=False, seed=0)
    assert d["value"] == pytest.approx(80.5 - 100.5) and d["better"] == "harnessed"
    lo, hi = d["ci95"]
    assert lo <= d["value"] <= hi < 0 and "excludes 0" in d["verdict"]
    # Higher is better: the same numbers make plain the better arm.
    assert difference(a, b, ts, higher=True, seed=0)["better"] == "plain"
    # Same seed, same interval; overlapping arms: no clear difference.
    assert bootstrap_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], seed=1) == bootstrap_difference(
        [1.0, 2.0, 3.0], [1.5, 2.5, 3.5], seed=1
    )
    ts2 = trials("plain", [1.0, 5.0, 3.0]) + trials("harnessed", [2.0, 4.0, 3.5])
    a2 = summarize_arm(Arm(name="plain"), ts2[:3], [], higher=False)
    b2 = summarize_arm(Arm(name="harnessed"), ts2[3:], [], higher=False)
    assert "no clear difference" in difference(a2, b2, ts2, higher=False, seed=0)["verdict"]


def test_an_arm_without_valid_trials_gives_no_comparison():
    ts = trials("plain", [1.0, 2.0, 3.0]) + trials("harnessed", [None, None, None])
    a = summarize_arm(Arm(name="plain"), ts[:3], [], higher=False)
    b = summarize_arm(Arm(name="harnessed"), ts[3:], [], higher=False)
    assert difference(a, b, ts, higher=False, seed=0)["value"] is None


def test_the_cli_needs_two_different_arms(tmp_path: Path):
    base = ["compare", "--task", "rmsnorm_gate", "--out", str(tmp_path / "o")]
    with pytest.raises(UsageError, match="both arms are the same"):
        arms_from(parse(base))
    a, b = arms_from(parse([*base, "--harness-from", str(tmp_path)]))
    assert (a.name, b.name, b.servers_from) == ("plain", "harnessed", tmp_path)
    a, b = arms_from(parse([*base, "--b-runner", "exec", "--b-agent-cmd", "x {workspace}"]))
    assert (b.name, b.runner, a.runner) == ("b", "exec", "autopilot")


class FlakyTrials:
    """run_trial standing in for the loop: makes the trial's workspace, then fails the calls
    named in `fail` (a crash mid-trial leaves its folder behind, as the real one does)."""

    def __init__(self, fail: set[int]) -> None:
        self.fail, self.calls = fail, []

    async def __call__(self, config, arm, index, secret, settings, *, launcher=None):
        root = compare_mod.trial_root(config, arm, index)
        assert not root.exists(), f"{root} was not cleared before the trial ran again"
        self.calls.append((arm.name, index + 1))
        ws = init_workspace(config.task, root, settings)
        if len(self.calls) in self.fail:
            self.fail.clear()  # once
            raise ExecutorError("the GPU host went away", kind="dropped")
        return Trial(arm=arm.name, index=index + 1, workspace=str(ws.root), score=10.0 + index,
                     valid=True, verdict="passed")  # fmt: skip


def test_a_compare_cut_short_resumes_with_its_finished_trials_or_starts_over(
    tmp_path: Path, monkeypatch
):
    settings = Settings(state_dir=tmp_path / "state")
    config = CompareConfig(
        task="rmsnorm_gate", out=tmp_path / "cmp", arms=[Arm(name="plain"),
        Arm(name="b", runner="exec", agent_cmd="x")], trials=2,
    )  # fmt: skip
    flaky = FlakyTrials(fail={2})
    monkeypatch.setattr(compare_mod, "run_trial", flaky)
    with pytest.raises(ExecutorError):
        anyio.run(compare, config, settings)
    assert (tmp_path / "cmp" / "trials" / "b-1").is_dir()  # what broke the rerun before
    # The same command again says what happened and what to pass.
    with pytest.raises(UsageError, match=r"1 of 4 trials finished") as refused:
        anyio.run(compare, config, settings)
    assert "--resume" in (refused.value.next_step or "")
    assert "--force" in (refused.value.next_step or "")
    # --resume with other settings is refused; with the same, only the rest runs.
    other = config.model_copy(update={"iterations": 2})
    with pytest.raises(UsageError, match="other settings"):
        anyio.run(lambda: compare(other, settings, resume=True))
    flaky.calls.clear()
    report = anyio.run(lambda: compare(config, settings, resume=True))
    assert flaky.calls == [("b", 1), ("plain", 2), ("b", 2)]
    assert len(report.trials) == 4 and all(t.valid for t in report.trials)
    assert finished_trials(tmp_path / "cmp") == report.trials
    # --force starts over: every trial runs again.
    flaky.calls.clear()
    anyio.run(lambda: compare(config, settings, force=True))
    assert len(flaky.calls) == 4
