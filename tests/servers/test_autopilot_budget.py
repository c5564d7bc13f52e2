"""The autopilot's attempt within the turn's limit (servers/autopilot.py): its sweeps try only
the configs that leave time for the probe and the verify, and with no room for two it stops
after run_objective and says how to give it room. On an H100 the decode-step attempt ran out
its 300 s in a 24-config sweep of 61 s objective calls, so no iteration ever finished. A stand-in
session answers the tools and a stand-in clock advances by each call's cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from harnesslab.servers import autopilot
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace


@pytest.mark.parametrize(
    ("left_s", "per_config_s", "reserve_s", "cap", "fit"),
    [
        (None, 60.0, 180.0, 24, 24),  # no limit known: the cap
        (300.0, 10.0, 30.0, 24, 24),  # room for 27: the cap
        (100.0, 10.0, 30.0, 24, 7),
        (40.0, 10.0, 30.0, 24, 1),  # exactly one
        (39.9, 10.0, 30.0, 24, 0),
        (20.0, 10.0, 30.0, 24, 0),  # past the reserve: none, never negative
        (10.0, 0.0, 0.0, 5, 5),  # a free config: the cap
    ],
)
def test_configs_that_fit_leave_the_reserve(left_s, per_config_s, reserve_s, cap, fit) -> None:
    assert autopilot.configs_that_fit(left_s, per_config_s, reserve_s, cap) == fit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class FakeSession:
    """The tools an attempt calls, each advancing the clock by its cost."""

    COST_S: ClassVar[dict[str, float]] = {"inspect_context": 0.0, "run_objective": 60.0, "numerical_probe": 30.0,
              "guarded_final_verify": 120.0}  # fmt: skip

    def __init__(self, clock: Clock, limit_s: float | None, per_config_s: float) -> None:
        self.clock, self.per_config_s = clock, per_config_s
        self.deadline = clock.now + limit_s if limit_s is not None else None
        self.args = type("Args", (), {"max_configs": None})()
        self.result: dict[str, Any] = {}
        self.notes: dict[str, Any] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.logged: list[dict[str, Any]] = []

    def left_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - self.clock.now

    async def connect(self, name: str, entry: dict[str, Any]) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        self.logged.append(record)

    def save(self) -> None:
        pass

    async def call(self, server: str, tool: str, **args: Any) -> dict[str, Any]:
        self.calls.append((tool, args))
        if tool == "sweep_kernel_config":
            configs = [dict(zip(args["space"], vals, strict=True))
                       for vals in _product(list(args["space"].values()))][: args["max_configs"]]  # fmt: skip
            self.clock.now += self.per_config_s * len(configs)
            return {"tried": len(configs), "results": [
                {"status": "ok", "config": c, "score_us": 100.0 - i} for i, c in enumerate(configs)
            ]}  # fmt: skip
        self.clock.now += self.COST_S[tool]
        if tool == "inspect_context":
            return {"executor": {"interpreted": False}}
        if tool == "run_objective":
            return {"score": 100.0}
        return {"status": "passed", "verdict": "passed", "score_us": 90.0}


def _product(lists: list[list[Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for values in lists:
        out = [(*o, v) for o in out for v in values]
    return out


def run_attempt(tmp_path: Path, monkeypatch, limit_s: float | None,
                per_config_s: float = 60.0) -> FakeSession:  # fmt: skip
    clock = Clock()
    monkeypatch.setattr(autopilot.time, "monotonic", clock.monotonic)
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", Settings(state_dir=tmp_path / "state"))
    s = FakeSession(clock, limit_s, per_config_s)
    anyio.run(autopilot.attempt, s, {autopilot.TASK_SERVER: {}}, ws)
    return s


def tools(s: FakeSession) -> list[str]:
    return [t for t, _ in s.calls]


def test_with_no_room_for_two_configs_the_attempt_stops_after_run_objective(
    tmp_path, monkeypatch
) -> None:
    """300 s, a 60 s objective: 240 s left, 180 s kept for the probe and the verify, one config
    fits (the decode step on an H100)."""
    s = run_attempt(tmp_path, monkeypatch, limit_s=300.0)
    assert tools(s) == ["inspect_context", "run_objective"]
    assert s.result["status"] == "no_change"
    assert "run_objective took 60 s and 240 s" in s.result["summary"]
    assert "--attempt-timeout" in s.result["summary"]
    assert s.logged == [{"event": "no_time", "objective_s": 60.0, "left_s": 240.0}]


def test_the_sweeps_try_only_what_leaves_the_probe_and_the_verify_their_time(
    tmp_path, monkeypatch
) -> None:
    """600 s: 540 left after the objective, 180 kept: 6 configs of 60 s in the coarse sweep,
    then around its best only what is left (540 - 360 - 180 = 0: no second sweep); the probe
    and the verify run before the limit."""
    s = run_attempt(tmp_path, monkeypatch, limit_s=600.0)
    sweeps = [a for t, a in s.calls if t == "sweep_kernel_config"]
    assert [a["max_configs"] for a in sweeps] == [6]
    assert tools(s)[-2:] == ["numerical_probe", "guarded_final_verify"]
    assert s.left_s() >= 0


def test_the_refining_sweep_is_sized_by_what_the_coarse_one_measured(tmp_path, monkeypatch) -> None:
    """Configs cheaper than an objective call (5 s against 60): the coarse sweep is sized by
    the objective's 60 s (6 configs, 30 s), the second by the measured 5 s: (510 - 180) / 5 is
    past the cap of 24, where the 60 s estimate would allow 5."""
    s = run_attempt(tmp_path, monkeypatch, limit_s=600.0, per_config_s=5.0)
    sweeps = [a for t, a in s.calls if t == "sweep_kernel_config"]
    assert [a["max_configs"] for a in sweeps] == [6, 24]
    assert tools(s)[-2:] == ["numerical_probe", "guarded_final_verify"]


def test_without_a_limit_the_sweeps_take_their_cap(tmp_path, monkeypatch) -> None:
    s = run_attempt(tmp_path, monkeypatch, limit_s=None)
    sweeps = [a for t, a in s.calls if t == "sweep_kernel_config"]
    assert sweeps[0]["max_configs"] == 24
    assert tools(s)[-2:] == ["numerical_probe", "guarded_final_verify"]
