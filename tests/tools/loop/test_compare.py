"""compare's statistics and arms, without running trials (tests/harnessgym runs real ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.servers.cli import parse
from harnesslab.servers.compare_cmd import arms_from
from harnesslab.tools.errors import UsageError
from harnesslab.tools.loop.compare import (
    Arm,
    Trial,
    bootstrap_difference,
    difference,
    quantile,
    summarize_arm,
)


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
