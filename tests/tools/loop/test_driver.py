"""The iteration loop with fake agents (tests/tools/loop/fake_agents/scripted.py): the loop's own
verified score drives it, the best checkpoint survives broken attempts, hung agents die with their
children, a crashed loop resumes.

A guarded verify of rmsnorm_gate costs 3-5 s of CPU on the Triton interpreter (two processes
that import torch), one of a command task (tests/servers/support.py: solution.txt is the score)
a few tenths. The loop scores every task kind through one path (Loop.score), so only the runs
about the kernel verify itself (a verified improvement and its rollback, a step task's score) use
a kernel task; the runs about processes, signals, resume and the build turns use the command
task. Every run here is 1-2 iterations."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tests.conftest_shared import small_rmsnorm
from harnesslab.tests.servers.support import command_task
from harnesslab.tools.loop.driver import resume_run, start_run
from harnesslab.tools.loop.servers import turn_servers
from harnesslab.tools.loop.state import RunConfig, RunStore
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.checkpoints import Checkpoints
from harnesslab.tools.state.workspace import open_workspace

FAKE = Path(__file__).resolve().parent / "fake_agents" / "scripted.py"
RUN_LIMIT_S = 150


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state")


@pytest.fixture(scope="module")
def small_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rmsnorm_gate with 2 small hidden cases instead of 6 large ones (tests/conftest_shared.py)."""
    return small_rmsnorm(tmp_path_factory.mktemp("task") / "rmsnorm_small")


@pytest.fixture(scope="module")
def cmd_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A command task whose objective prints solution.txt's number as best_us (50 at first)."""
    return command_task(tmp_path_factory.mktemp("task"))


def scripted(tmp_path: Path, task: Path, plan: dict[str, Any], **overrides: Any) -> RunConfig:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    cmd = (
        f"{shlex.quote(sys.executable)} {FAKE} {{phase}} {{workspace}} {{result_file}} {plan_file}"
    )
    fields: dict[str, Any] = {
        "task": str(task),
        "workspace": tmp_path / "ws",
        "iterations": 1,
        "runner": "exec",
        "agent_cmd": cmd,
        "build": "never",
        "attempt_timeout_s": 60,
        "build_timeout_s": 60,
    }
    return RunConfig(**{**fields, **overrides})


async def run(config: RunConfig, settings: Settings) -> dict[str, Any]:
    with anyio.fail_after(RUN_LIMIT_S):
        return await start_run(config, settings)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def wait_dead(pids: list[int], limit_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def checkpointed(ws_root: Path, settings: Settings, candidate: str, name: str) -> str:
    return Checkpoints(open_workspace(ws_root, settings)).files(candidate)[name].decode()


# -- the loop ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_verified_improvement_becomes_best_and_a_deleted_kernel_is_rolled_back(
    tmp_path, settings, small_task
):
    config = scripted(
        tmp_path,
        task=small_task,
        plan={"attempt": ["improve", "delete"]},
        iterations=2,
        output_cap_bytes=65536,
    )
    summary = await run(config, settings)

    first, second = summary["iterations"]
    assert summary["baseline"]["verdict"] == "passed"
    # the agent claimed 0.001 us; the loop's own verify decides
    assert first["attempt"]["claimed"]["score_us"] == 0.001
    assert first["score"]["score_us"] > 1.0 and first["score"]["verdict"] == "passed"
    assert first["score"]["slot"] == "local:gpu0"  # every score names the GPU it ran on
    assert 0 < first["wall_s"] <= first["at_s"] <= second["at_s"]
    assert second["attempt"]["status"] == "failed" and second["attempt"]["exit_code"] == 3
    assert second["score"]["verdict"] == "error" and "kernel.py" in second["score"]["error"]
    # 300 KB of output was capped: the head, a note, the tail
    out = config.workspace / ".harnesslab/runs" / summary["run_id"] / "iter-02/attempt"
    assert (out / "stdout.txt").stat().st_size < 65536 + (64 << 10) + 100
    assert "bytes dropped" in (out / "stdout.txt").read_text()
    # the best survived the broken attempt, was restored and re-verified on new hidden cases
    best = summary["best"]
    assert best["candidate"] in (first["score"]["candidate"], summary["baseline"]["candidate"])
    assert (config.workspace / "kernel.py").is_file()
    assert summary["final"]["verdict"] == "passed"
    assert summary["final"]["case_set"] != summary["baseline"]["case_set"]
    ws = open_workspace(config.workspace, settings)
    assert ws.candidate_hash() == best["candidate"]
    assert summary["status"] == "completed"
    # the run's state in the trusted store, its artifacts in the workspace
    store = RunStore(ws, summary["run_id"])
    for rel in ("config.json", "state.json", "best.json", "iter-01/score.json"):
        assert (store.dir / rel).is_file(), rel
        assert not (store.artifacts / rel).exists(), rel
    for rel in (
        "summary.json",
        "iter-01/attempt/prompt.md",
        "iter-01/attempt/mcp.json",
        "iter-01/attempt/result.json",
    ):
        assert (store.artifacts / rel).is_file(), rel
    assert json.loads((store.artifacts / "summary.json").read_text())["status"] == "completed"


@pytest.mark.anyio
async def test_hung_agent_is_killed_with_its_child_and_its_work_still_scored_and_counted(
    tmp_path, settings, cmd_task
):
    # The timed-out attempt's verified score reaches the stop score: the run ends there and
    # skips the build (solved), although 3 iterations were planned.
    config = scripted(
        tmp_path,
        task=cmd_task,
        plan={"attempt": ["hang"]},
        attempt_timeout_s=4,
        iterations=3,
        stop_score=1e12,
        build="auto",
        optimization_mode=False,
        score_baseline=False,  # the attempt's own score reaches the stop score, not the baseline's
    )
    summary = await run(config, settings)
    it = summary["iterations"][0]
    assert it["attempt"]["status"] == "timeout" and it["attempt"]["timed_out"]
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert wait_dead([pids["agent"], pids["child"]]) == []
    # the change the agent made before hanging was scored independently
    assert it["score"]["verdict"] == "passed" and it["score"]["score_us"] == 8.0
    scored = checkpointed(config.workspace, settings, it["score"]["candidate"], "solution.txt")
    assert scored == "8\n"
    state = RunStore(open_workspace(config.workspace, settings), summary["run_id"]).load()
    assert state.active == []
    assert summary["status"] == "stopped" and "stop score" in summary["stop_reason"]
    assert len(summary["iterations"]) == 1
    assert it["build"] == {"skipped": "solved: stop score reached"}
    assert summary["restored"] is None  # not optimization mode: the workspace stays as left
    assert summary["final"]["verdict"] == "passed"


def cli_run_stopped_mid_attempt(
    config: RunConfig, settings: Settings, sig: signal.Signals, *, sigint_ignored: bool = False
) -> tuple[int, str, dict[str, int]]:
    """`harnesslab run` in a subprocess, sent `sig` once the fake agent hangs in its attempt
    (`sigint_ignored`: started with SIGINT ignored, as a script's background job is).
    Returns the exit code, the stderr tail, and the agent's pids."""
    argv = [
        sys.executable, "-m", "harnesslab.servers", "run", "--json",
        "--task", config.task, "-w", str(config.workspace), "--iterations", "1",
        "--runner", "exec", "--agent-cmd", config.agent_cmd, "--build", "never",
        "--attempt-timeout", "120",
    ]  # fmt: skip
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(settings.state_dir)}
    pids_file = config.workspace.parent / "pids.json"  # next to the plan (see scripted())
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    loop = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=ignore,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not pids_file.exists():
            assert loop.poll() is None, loop.stderr.read().decode()[-2000:] if loop.stderr else ""
            assert time.monotonic() < deadline, "the fake agent never started"
            time.sleep(0.2)
        loop.send_signal(sig)
        _, err = loop.communicate(timeout=30)
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait(timeout=10)
    return loop.returncode, err.decode(errors="replace")[-3000:], json.loads(pids_file.read_text())


def only_run(config: RunConfig, settings: Settings) -> RunStore:
    ws = open_workspace(config.workspace, settings)
    (run_id,) = [p.name for p in ws.runs_dir.iterdir()]
    return RunStore(ws, run_id)


@pytest.mark.parametrize(
    ("sig", "ignored"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigint", "sigterm", "sigint_inherited_ignored"],
)
def test_ctrl_c_or_sigterm_mid_attempt_records_the_interruption_and_kills_the_agent(
    tmp_path, settings, cmd_task, sig, ignored
):
    """Also with SIGINT ignored from the start (an xdist worker under the full suite passed that
    on: the loop then ran on past its Ctrl-C): the loop takes SIGINT itself."""
    config = scripted(tmp_path, cmd_task, {"attempt": ["hang"]})
    code, err, pids = cli_run_stopped_mid_attempt(config, settings, sig, sigint_ignored=ignored)
    assert code == 130, err
    assert "--resume" in err
    assert wait_dead([pids["agent"], pids["child"]]) == []
    state = only_run(config, settings).load()
    assert state.status == "interrupted" and state.active == []
    assert state.iterations[0].running == "attempt"


@pytest.mark.anyio
async def test_a_crashed_loop_resumes_kills_what_it_left_and_finishes(tmp_path, settings, cmd_task):
    config = scripted(tmp_path, cmd_task, {"attempt": ["hang"], "hang_once": True})
    _, _, pids = cli_run_stopped_mid_attempt(config, settings, signal.SIGKILL)
    assert alive(pids["agent"])  # orphaned by the crash
    store = only_run(config, settings)
    state = store.load()
    assert state.iterations[0].running == "attempt" and state.active

    with anyio.fail_after(RUN_LIMIT_S):
        summary = await resume_run(config.workspace, store.run_id, settings)
    assert wait_dead([pids["agent"], pids["child"]]) == []
    it = summary["iterations"][0]
    assert it["attempt"]["status"] == "interrupted"
    assert it["score"]["verdict"] == "passed"
    assert summary["status"] == "completed" and summary["final"]["verdict"] == "passed"
    assert store.load().resumes == 1


def test_an_agent_failing_every_turn_has_its_message_in_the_reason_and_the_run_exits_3(
    tmp_path, settings, cmd_task
):
    """Like Claude Code without a login: the message is on stdout, the exit code 1. The run
    says the agent never worked instead of reporting the untouched baseline as a result."""
    message = "Not logged in · Please run /login"
    script = f"print({message!r}); raise SystemExit(1)"
    argv = [
        sys.executable, "-m", "harnesslab.servers", "run", "--json",
        "--task", str(cmd_task), "-w", str(tmp_path / "ws"), "--iterations", "1",
        "--runner", "exec", "--agent-cmd", f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}",
        "--build", "never",
    ]  # fmt: skip
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(settings.state_dir)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert proc.returncode == 3, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    attempt = summary["iterations"][0]["attempt"]
    assert attempt["status"] == "failed" and message in attempt["error"]
    assert summary["status"] == "agent_failed" and message in summary["stop_reason"]
    assert message in proc.stderr and "harnesslab doctor" in proc.stderr


@pytest.mark.anyio
async def test_a_good_server_is_registered_and_a_broken_one_quarantined_after_one_repair(
    tmp_path, settings, cmd_task
):
    config = scripted(
        tmp_path,
        cmd_task,
        {"attempt": ["noop"], "build": ["two_servers"], "repair": ["noop"]},
        build="always",
        # what is asserted is the build, qualify and repair turns: no baseline or final verify
        score_baseline=False,
        final_verify=False,
    )
    summary = await run(config, settings)
    it = summary["iterations"][0]
    servers = {s["name"]: s for s in it["servers"]}
    assert servers["fake-good-server"]["status"] == "registered"
    bad = servers["fake-bad-server"]
    assert bad["status"] == "quarantined" and bad["repaired"] is True
    assert "diagnose is broken" in bad["report"]
    assert it["repair"]["status"] == "ok"
    ws = open_workspace(config.workspace, settings)
    store = RunStore(ws, summary["run_id"])
    repair_prompt = (store.artifacts / "iter-01/repair/prompt.md").read_text()
    assert "fake-bad-server" in repair_prompt and "diagnose is broken" in repair_prompt
    qualification = json.loads((store.dir / "iter-01/qualification.json").read_text())
    assert sorted((q["name"], q["passed"], q["after_repair"]) for q in qualification) == [
        ("fake-bad-server", False, False),
        ("fake-bad-server", False, True),
        ("fake-good-server", True, False),
    ]
    # the next session gets the registered server, never the quarantined one
    active = turn_servers(ws, settings, meta=False).entries
    assert "fake-good-server" in active and "fake-bad-server" not in active
    mcp_json = json.loads((config.workspace / ".mcp.json").read_text())["mcpServers"]
    assert "fake-good-server" in mcp_json and "fake-bad-server" not in mcp_json


def test_a_turn_reports_what_the_workspace_planted_and_gets_the_toolkits_skills_only(
    tmp_path, settings
):
    """Each turn audits the client files: what harnesslab did not write is an event and
    foreign.json in the turn folder, with the command that removes it; the turn's skills come
    from the toolkit, in a plugin folder in the trusted run folder, not from the workspace."""
    from harnesslab.tests.trust.planted import PLANTED, plant
    from harnesslab.tools.loop.driver import Loop
    from harnesslab.tools.loop.runners import ClaudeRunner
    from harnesslab.tools.loop.state import Iteration, RunState
    from harnesslab.tools.state.workspace import init_workspace

    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    plant(ws.root)
    events: list[dict[str, Any]] = []
    config = RunConfig(task="rmsnorm_gate", workspace=ws.root)
    store = RunStore(ws, "r1")
    loop = Loop(RunState(run_id="r1", config=config), store, ws, settings, on_event=events.append)
    turn, _ = loop._turn(Iteration(index=1), "attempt", meta=False, timeout_s=10)
    (warning,) = [e for e in events if e["kind"] == "warning"]
    assert warning["fix"] == f"harnesslab config --prune -w {ws.root}"
    files = {f["file"] for f in warning["findings"]}
    assert set(PLANTED.values()) <= files
    assert json.loads((turn.dir / "foreign.json").read_text()) == warning["findings"]
    assert turn.plugin_dir is not None and store.dir in turn.plugin_dir.parents
    skills = sorted(p.name for p in (turn.plugin_dir / "skills").iterdir())
    assert "kernel-optimization" in skills and "kernel-helper" not in skills
    argv = ClaudeRunner().argv(turn)
    assert argv[argv.index("--plugin-dir") + 1] == str(turn.plugin_dir)


def test_one_autopilot_iteration_on_a_step_task_ends_with_a_verified_score(tmp_path, settings):
    """Before: `harnesslab run` refused step tasks (their guarded verify gave no score). Now the
    autopilot sweeps decode_step's launch knobs by the step objective, probes and verifies, and
    the loop's score is the step verify's: passed, with the timed pass's score, the best."""
    config = RunConfig(task="decode_step", workspace=tmp_path / "ws", iterations=1,
                       runner="autopilot", build="never", score_baseline=False,
                       final_verify=False)  # fmt: skip
    summary = anyio.run(run, config, settings)
    (it,) = summary["iterations"]
    assert it["attempt"]["status"] == "ok", it["attempt"]
    calls = it["tool_calls"]
    assert calls["harnesslab-task.sweep_kernel_config"] >= 1
    assert calls["harnesslab-task.guarded_final_verify"] == 1
    score = it["score"]
    assert score["verdict"] == "passed" and score["certifies"] == "step_outputs", score
    assert score["score_us"] > 0 and not score["meaningful"]
    assert summary["best"]["score_us"] == score["score_us"]
