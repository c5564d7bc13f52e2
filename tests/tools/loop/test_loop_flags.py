"""HarnessGym's `run` flags as named conveniences: --attempt-timeouts, --artifact-repair-attempts,
--run-id, --task-text, --claude-bin/--codex-bin, --claude-model/--claude-max-budget-usd."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.servers import run_cmd
from harnesslab.servers.cli import parse
from harnesslab.tests.conftest_shared import small_rmsnorm
from harnesslab.tests.tools.evaluation.test_command_tasks import make_task
from harnesslab.tools.errors import UsageError
from harnesslab.tools.loop.driver import start_run
from harnesslab.tools.loop.state import RunConfig
from harnesslab.tools.settings import Settings

FAKE = Path(__file__).resolve().parent / "fake_agents" / "scripted.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`harnesslab run`'s config and settings, without running the loop."""
    seen: dict[str, Any] = {}

    async def fake_start(config, settings, *, on_event=None, run_id=None, runner=None):
        seen.update(config=config, settings=settings, run_id=run_id)
        return {"status": "completed", "final": {"verdict": "passed"}}

    monkeypatch.setattr(run_cmd, "start_run", fake_start)
    monkeypatch.setattr(run_cmd, "print_summary", lambda summary: None)
    return seen


def cli_run(tmp_path: Path, *flags: str) -> int:
    args = parse(["run", "--task", "rmsnorm_gate", "-w", str(tmp_path / "ws"), *flags])
    return run_cmd.cmd_run(args, Settings(state_dir=tmp_path / "state"))


def test_attempt_timeouts_give_each_iteration_its_limit_the_last_holding(tmp_path, captured):
    assert cli_run(tmp_path, "--iterations", "3", "--attempt-timeouts", "5m,8m") == 0
    config: RunConfig = captured["config"]
    assert config.attempt_timeouts_s == [300.0, 480.0]
    assert [config.attempt_limit_s(i) for i in (1, 2, 3)] == [300.0, 480.0, 480.0]
    with pytest.raises(SystemExit):
        cli_run(tmp_path, "--attempt-timeouts", "5m,soon")


def test_claude_conveniences_become_its_arguments_and_program(tmp_path, captured):
    flags = ("--runner", "claude", "--claude-model", "opus", "--claude-max-budget-usd", "2.5")
    assert cli_run(tmp_path, *flags, "--claude-bin", "/opt/claude") == 0
    assert captured["config"].agent_args == ["--model", "opus", "--max-budget-usd", "2.5"]
    assert captured["settings"].claude_command == "/opt/claude"
    assert cli_run(tmp_path, "--runner", "codex", "--codex-bin", "/opt/codex") == 0
    assert captured["settings"].codex_command == "/opt/codex"
    with pytest.raises(UsageError, match="--claude-model is for --runner claude"):
        cli_run(tmp_path, "--runner", "codex", "--claude-model", "opus")


def test_run_id_and_task_text_and_repair_attempts_reach_the_run(tmp_path, captured):
    flags = (
        "--run-id",
        "my-run",
        "--task-text",
        "Make it fast.",
        "--artifact-repair-attempts",
        "0",
    )
    assert cli_run(tmp_path, *flags) == 0
    assert captured["run_id"] == "my-run"
    assert (
        captured["config"].task_text == "Make it fast." and captured["config"].repair_attempts == 0
    )


def prompt_copier(tmp_path: Path) -> str:
    script = tmp_path / "copy_prompt.py"
    script.write_text(
        "import pathlib, shutil, sys\n"
        "shutil.copy(sys.argv[1], sys.argv[3])\n"
        'pathlib.Path(sys.argv[2]).write_text(\'{"status": "no_change"}\')\n'
    )
    seen = tmp_path / "prompt-seen.md"
    return f"{shlex.quote(sys.executable)} {script} {{prompt_file}} {{result_file}} {seen}"


@pytest.mark.anyio
async def test_task_text_is_the_brief_and_a_run_id_is_taken_once(tmp_path):
    settings = Settings(state_dir=tmp_path / "state")
    config = RunConfig(
        task=str(make_task(tmp_path / "task")),
        workspace=tmp_path / "ws",
        iterations=1,
        runner="exec",
        agent_cmd=prompt_copier(tmp_path),
        attempt_timeouts_s=[42.0],
        task_text="INLINE BRIEF: make best small.",
        build="never",
        score_baseline=False,
        final_verify=False,
    )
    with anyio.fail_after(120):
        summary = await start_run(config, settings, run_id="fixed-id")
    assert summary["run_id"] == "fixed-id"
    prompt = (tmp_path / "prompt-seen.md").read_text()
    assert "INLINE BRIEF: make best small." in prompt and "You have 42 seconds" in prompt
    assert "Make best good." not in prompt  # the task.md brief was replaced
    with pytest.raises(UsageError, match="already exists"):
        await start_run(config, settings, run_id="fixed-id")


# slow: the same repair loop (a failed qualification, a repair turn, requalify, quarantine) as
# test_driver's test_a_good_server_is_registered_and_a_broken_one_quarantined_after_one_repair
# (fast, the default of one turn), three ~7 s qualifications again; the flag reaching the run's
# config stays fast in test_run_id_and_task_text_and_repair_attempts_reach_the_run.
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(600)
async def test_artifact_repair_attempts_gives_a_failing_server_that_many_repair_turns(tmp_path):
    dest = small_rmsnorm(tmp_path / "rmsnorm_small")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"attempt": ["noop"], "build": ["bad_server"], "repair": ["noop"]}))
    cmd = f"{shlex.quote(sys.executable)} {FAKE} {{phase}} {{workspace}} {{result_file}} {plan}"
    config = RunConfig(
        task=str(dest),
        workspace=tmp_path / "ws",
        iterations=1,
        runner="exec",
        agent_cmd=cmd,
        build="always",
        repair_attempts=2,
        score_baseline=False,
        final_verify=False,
    )
    with anyio.fail_after(540):
        summary = await start_run(config, Settings(state_dir=tmp_path / "state"))
    it = summary["iterations"][0]
    assert (tmp_path / "plan.repair.count").read_text() == "2"  # two repair turns, not one
    assert [s["status"] for s in it["servers"]] == ["quarantined"]
    assert it["repair"]["status"] == "ok"


def test_durations_parse_like_harnessgym():
    assert run_cmd.durations_s("10s,2m") == [10.0, 120.0]
    with pytest.raises(argparse.ArgumentTypeError):
        run_cmd.durations_s("2m,-1")


@pytest.mark.anyio
async def test_the_claude_conveniences_are_flags_the_pinned_claude_accepts(tmp_path, monkeypatch):
    from harnesslab.tests.agent_cli import cli_path, seal
    from harnesslab.tools.errors import EnvironmentProblem
    from harnesslab.tools.loop.runners import ClaudeRunner

    program = str(cli_path("claude"))
    seal(monkeypatch, tmp_path / "home")
    extra = ["--model", "opus", "--max-budget-usd", "2.5"]  # what the conveniences become
    with anyio.fail_after(60), pytest.raises(EnvironmentProblem) as err:
        await ClaudeRunner(extra, program=program).preflight()
    # Every flag parsed: the preflight got as far as the (sealed-off) login.
    assert "is not logged in" in err.value.message
