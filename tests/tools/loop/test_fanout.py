"""The loop's scoring fanned out over the executor's GPU slots: compare runs its trials at once,
one per slot (the local executor pretends two GPUs with --gpus 0,1), each trial and each score
naming its slot; a launcher view pinned to one slot; a run's wall-clock budget."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import anyio
import pytest

from harnesslab.servers import compare_cmd, run_cmd
from harnesslab.servers.cli import parse
from harnesslab.tests.conftest_shared import small_rmsnorm
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.execution.launcher import build_launcher
from harnesslab.tools.loop import compare as compare_mod
from harnesslab.tools.loop.compare import Arm, CompareConfig, Trial, compare, finished_trials
from harnesslab.tools.loop.driver import Loop
from harnesslab.tools.loop.runners import build_runner
from harnesslab.tools.loop.state import RunConfig, RunState, RunStore
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace

FAKE = Path(__file__).resolve().parent / "fake_agents" / "scripted.py"


def two_gpus(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", gpus="0,1", interpret="always")


def config(tmp_path: Path, **kw) -> CompareConfig:
    arms = [Arm(name="plain"), Arm(name="b", runner="exec", agent_cmd="x")]
    return CompareConfig(task="rmsnorm_gate", out=tmp_path / "cmp", arms=arms, trials=2, **kw)


class PairedTrials:
    """run_trial standing in for the loop: each trial waits (bounded) for a second one to be
    running at the same time, so trials that only ever run one at a time fail with a timeout.
    Records which slot each trial's launcher was pinned to."""

    def __init__(self, fail: str = "") -> None:
        self.fail = fail
        self.running = 0
        self.most = 0
        self.waiting: anyio.Event | None = None
        self.slots: dict[tuple[str, int], str] = {}

    async def __call__(self, config, arm, index, secret, settings, *, launcher=None):
        assert launcher is not None and len(launcher.slots) == 1
        label = launcher.slots[0].label
        self.slots[(arm.name, index + 1)] = label
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            ws = init_workspace(config.task, compare_mod.trial_root(config, arm, index), settings)
            if f"{arm.name}{index + 1}" == self.fail:
                raise ExecutorError("the GPU host went away", kind="dropped")
            if self.waiting is None:  # the first of a pair waits for the second
                self.waiting = anyio.Event()
                with anyio.fail_after(20):
                    await self.waiting.wait()
            else:
                self.waiting.set()
                self.waiting = None
            return Trial(arm=arm.name, index=index + 1, workspace=str(ws.root), score=10.0 + index,
                         valid=True, verdict="passed", slot=label)  # fmt: skip
        finally:
            self.running -= 1


def test_compare_runs_one_trial_per_gpu_slot_at_once_and_each_names_its_gpu(
    tmp_path: Path, monkeypatch
):
    fake = PairedTrials()
    monkeypatch.setattr(compare_mod, "run_trial", fake)
    report = anyio.run(compare, config(tmp_path), two_gpus(tmp_path))
    assert fake.most == 2  # two trials ran at the same time
    # Trial i of arm j on slot (i + j) mod 2: each arm's trials alternate between the GPUs.
    assert fake.slots == {
        ("plain", 1): "local:gpu0",
        ("b", 1): "local:gpu1",
        ("plain", 2): "local:gpu1",
        ("b", 2): "local:gpu0",
    }
    assert [(t.arm, t.index, t.slot) for t in report.trials] == [
        ("plain", 1, "local:gpu0"),
        ("b", 1, "local:gpu1"),
        ("plain", 2, "local:gpu1"),
        ("b", 2, "local:gpu0"),
    ]
    assert len(finished_trials(tmp_path / "cmp")) == 4


def test_parallel_1_runs_the_trials_one_after_another_in_a_b_order(tmp_path: Path, monkeypatch):
    seen: list[tuple[str, int, int]] = []

    async def one_at_a_time(config, arm, index, secret, settings, *, launcher=None):
        seen.append((arm.name, index + 1, len(launcher.slots)))
        ws = init_workspace(config.task, compare_mod.trial_root(config, arm, index), settings)
        return Trial(arm=arm.name, index=index + 1, workspace=str(ws.root), score=1.0, valid=True)

    monkeypatch.setattr(compare_mod, "run_trial", one_at_a_time)
    anyio.run(compare, config(tmp_path, parallel=1), two_gpus(tmp_path))
    # one after another, with the whole launcher (both slots): the loop picks a free GPU
    assert seen == [("plain", 1, 2), ("b", 1, 2), ("plain", 2, 2), ("b", 2, 2)]


def test_a_failed_trial_stops_the_others_and_is_raised_as_itself_then_resume_reruns_them(
    tmp_path: Path, monkeypatch
):
    settings = two_gpus(tmp_path)
    monkeypatch.setattr(compare_mod, "run_trial", PairedTrials(fail="b1"))
    with pytest.raises(ExecutorError, match="went away"):
        anyio.run(compare, config(tmp_path), settings)
    assert finished_trials(tmp_path / "cmp") == []  # plain 1 was cut short: not kept
    fake = PairedTrials()
    monkeypatch.setattr(compare_mod, "run_trial", fake)
    report = anyio.run(lambda: compare(config(tmp_path), settings, resume=True))
    assert len(report.trials) == 4 and fake.most == 2


def test_a_pinned_launcher_view_has_one_slot_and_shares_its_lock(tmp_path: Path):
    launcher = build_launcher(two_gpus(tmp_path))
    assert [s.label for s in launcher.slots] == ["local:gpu0", "local:gpu1"]
    view = launcher.pinned(launcher.slots[1])
    assert view.slots == [launcher.slots[1]] and view.pick() is launcher.slots[1]
    assert view.slots[0].lock is launcher.slots[1].lock  # one GPU, one lock, whoever asks
    assert view.compile_pool is launcher.compile_pool and launcher.pick() is launcher.slots[0]


def test_no_iteration_starts_once_the_budget_is_spent(tmp_path: Path):
    settings = Settings(state_dir=tmp_path / "state")
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    cfg = RunConfig(task="rmsnorm_gate", workspace=ws.root, iterations=5, budget_s=60.0)
    state = RunState(run_id="r1", config=cfg, created_at=time.time() - 30)
    runner = build_runner("exec", agent_cmd="true {workspace}", settings=settings)
    loop = Loop(state, RunStore(ws, "r1"), ws, settings, runner=runner)
    assert loop._current_iteration() is not None and len(state.iterations) == 1
    state.iterations[0].step = "done"
    state.created_at = time.time() - 61
    assert loop._current_iteration() is None
    assert state.status == "stopped" and "budget of 60 s spent after 1" in state.stop_reason


@pytest.mark.slow
def test_two_real_trials_run_at_once_each_scored_on_its_own_gpu_slot(tmp_path: Path):
    """The whole path: compare -> two loops at once, each with a launcher pinned to its slot
    and its agent's servers given that GPU; the scripted agents only finish once both are
    running, and each trial's guarded verify names the slot it ran on."""
    plan = tmp_path / "agents" / "plan.json"
    plan.parent.mkdir()
    plan.write_text(json.dumps({"attempt": ["rendezvous"], "rendezvous": 2}))
    cmd = f"{shlex.quote(sys.executable)} {FAKE} {{phase}} {{workspace}} {{result_file}} {plan}"
    arms = [Arm(name=n, runner="exec", agent_cmd=cmd) for n in ("a", "b")]
    task = small_rmsnorm(tmp_path / "rmsnorm_small")
    cfg = CompareConfig(task=str(task), out=tmp_path / "cmp", arms=arms, trials=1,
                        attempt_timeout_s=90)  # fmt: skip

    async def bounded():
        with anyio.fail_after(240):
            return await compare(cfg, two_gpus(tmp_path))

    report = anyio.run(bounded)
    a, b = report.trials
    assert (a.slot, b.slot) == ("local:gpu0", "local:gpu1")
    assert a.valid and b.valid and a.verdict == b.verdict == "passed"
    for t in (a, b):
        summary = json.loads(
            next((Path(t.workspace) / ".harnesslab" / "runs").glob("*/summary.json")).read_text()
        )
        it = summary["iterations"][0]
        assert it["attempt"]["claimed"]["summary"] == "met"  # both agents were running at once
        assert it["score"]["slot"] == t.slot


def test_the_cli_gives_run_its_budget_and_compare_its_parallel_width(tmp_path: Path, monkeypatch):
    seen: dict[str, object] = {}

    async def fake_start(config, settings, *, on_event=None, run_id=None, runner=None):
        seen["run"] = config
        return {"status": "completed", "final": {"verdict": "passed"}}

    async def fake_compare(config, settings, **kw):
        seen["compare"] = config
        raise LookupError("stop here")

    monkeypatch.setattr(run_cmd, "start_run", fake_start)
    monkeypatch.setattr(run_cmd, "print_summary", lambda summary: None)
    monkeypatch.setattr(compare_cmd, "compare", fake_compare)
    settings = Settings(state_dir=tmp_path / "state")
    argv = ["run", "--task", "rmsnorm_gate", "-w", str(tmp_path / "ws"), "--budget", "10m"]
    assert run_cmd.cmd_run(parse(argv), settings) == 0
    assert seen["run"].budget_s == 600.0  # type: ignore[attr-defined]
    argv = ["compare", "--task", "rmsnorm_gate", "--out", str(tmp_path / "o"), "--b-runner",
            "exec", "--b-agent-cmd", "x {workspace}", "--parallel", "2"]  # fmt: skip
    with pytest.raises(LookupError):
        compare_cmd.cmd_compare(parse(argv), settings)
    assert seen["compare"].parallel == 2  # type: ignore[attr-defined]
