"""Command tasks as first-class tasks: dev and final objectives, hidden cases, reasons, units and
direction, {python}, init and the CLI. The task here is stdlib-only (a score read from a file), so
each objective run costs a sandboxed Python start, not a torch import; the Triton task in
tests/harnessgym/ goes through the same paths end to end."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation.command import run_command_objective
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.gpu.isolation import sandbox
from harnesslab.tools.integrity.command_verify import command_verify
from harnesslab.tools.integrity.verdict_view import public_command_verdict
from harnesslab.tools.loop.driver import start_run
from harnesslab.tools.loop.state import RunConfig
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.storage import read_jsonl
from harnesslab.tools.state.workspace import init_workspace, open_workspace
from harnesslab.tools.task.spec import load_task

LIMIT_S = 120

# The objective: the score is solution.txt's number; "fail" makes it report a failure in its JSON
# (status, a case's errors) with nothing on stderr, as HarnessGym's verifiers do.
SCORE_PY = textwrap.dedent(
    """
    import argparse, json, os, pathlib, sys
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="dev")
    p.add_argument("--repeats", type=int, default=0)
    p.add_argument("--cases-file", default=os.environ.get("HARNESSLAB_FINAL_CASES", ""))
    a = p.parse_args()
    text = pathlib.Path("solution.txt").read_text().strip()
    cases = []
    if a.cases_file:
        cases = json.load(open(a.cases_file))["cases"]
    if text == "nest":  # hostile: one JSON line nested past the parser's recursion limit
        print('{"best": 1.0, "x": ' + "[" * 100000 + "]" * 100000 + "}")
        sys.exit(0)
    if text == "bomb":  # 30 GB, 64 MB at a time
        held = [bytearray(64 << 20) for _ in range(30 * 16)]
    if text == "fail":
        shape = ",".join(f"rows={c['rows']}" for c in cases) or "dev"
        print(json.dumps({"status": "failed", "best": None, "error": f"bad kernel on {shape}",
                          "cases": [{"name": f"case_{shape}", "errors": ["num_warps=3 invalid"]}]}))
        sys.exit(1)
    out = {"status": "passed", "best": float(text), "mode": a.mode, "repeats": a.repeats,
           "n_hidden": len(cases), "python": sys.executable}
    if a.mode == "dev":
        out["meaningful"] = False
    print(json.dumps(out))
    """
)


def make_task(root: Path, *, higher: bool = False, final_domain: bool = True) -> Path:
    root.mkdir(parents=True)
    domain = (
        """
        [final]
        count = 2
        dtypes = ["float16"]
        ranges = { rows = { min = 3, max = 9 } }
        """
        if final_domain
        else ""
    )
    (root / "task.toml").write_text(
        textwrap.dedent(
            f"""
            name = "cmd-first-class"
            summary = "score = solution.txt"
            kind = "command"
            editable = ["solution.txt"]
            score_key = "best"
            unit = "points"
            higher_is_better = {str(higher).lower()}

            [objectives.dev]
            command = "{{python}} score.py --mode dev --repeats {{repeats}}"
            repeats = 3
            timeout_s = 60

            [objectives.final]
            command = "{{python}} score.py --mode final"
            timeout_s = 60
            """
        )
        + textwrap.dedent(domain)
    )
    (root / "task.md").write_text("Make best good.\n")
    (root / "score.py").write_text(SCORE_PY)
    (root / "solution.txt").write_text("100\n")
    return root


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state")


def ws_of(tmp_path: Path, settings: Settings, **kw: Any):
    task = make_task(tmp_path / "task", **kw)
    return init_workspace(str(task), tmp_path / "ws", settings)


async def dev(ws, settings: Settings, **kw: Any):
    launcher = Launcher(settings)
    try:
        with anyio.fail_after(LIMIT_S):
            return await run_command_objective(ws, launcher, **kw)
    finally:
        await launcher.aclose()


async def final(ws, settings: Settings):
    launcher = Launcher(settings)
    try:
        with anyio.fail_after(LIMIT_S):
            return await command_verify(ws, launcher, settings)
    finally:
        await launcher.aclose()


def test_init_from_a_command_task_folder_copies_its_workspace_files(tmp_path, settings):
    # Before: init copied only task.md, then told the user to edit solution.txt and run eval.
    ws = ws_of(tmp_path, settings)
    names = sorted(p.name for p in ws.root.iterdir() if p.name != ".harnesslab")
    assert names == ["score.py", "solution.txt", "task.md"]  # task.toml stays with the task


def test_a_task_with_a_workspace_folder_keeps_its_other_files_private(tmp_path, settings):
    task = make_task(tmp_path / "task")
    (task / "workspace").mkdir()
    (task / "workspace" / "solution.txt").write_text("7\n")
    ws = init_workspace(str(task), tmp_path / "ws", settings)
    assert sorted(p.name for p in ws.root.iterdir() if p.name != ".harnesslab") == [
        "solution.txt",
        "task.md",
    ]


@pytest.mark.anyio
async def test_dev_runs_take_warmup_repeats_only_through_placeholders_and_say_what_they_measured(
    tmp_path, settings
):
    ws = ws_of(tmp_path, settings)
    run = await dev(ws, settings, repeats=5)
    assert run.status == "passed" and run.score == 100.0
    assert run.output["repeats"] == 5 and run.output["python"] == settings.python  # {python}
    # meaningful comes from the objective's JSON (it said false), never a blanket true.
    assert run.meaningful is False and run.unit == "points"
    # Before: warmup was silently ignored; now the command has no {warmup}, so it is an error.
    with pytest.raises(UsageError, match=r"takes no warmup .*no \{warmup\} placeholder"):
        await dev(ws, settings, warmup=3)


@pytest.mark.anyio
async def test_a_failed_objectives_reason_is_its_json_error_fields_when_stderr_is_empty(
    tmp_path, settings
):
    ws = ws_of(tmp_path, settings)
    (ws.root / "solution.txt").write_text("fail\n")
    run = await dev(ws, settings)
    # Before: "the objective command exited with 1: " and nothing else.
    assert run.status == "failed"
    assert "error: bad kernel on dev" in run.reason
    assert "num_warps=3 invalid" in run.reason and "(nothing on stderr)" in run.reason


@pytest.mark.anyio
async def test_the_final_objective_is_the_bound_tasks_fed_hidden_cases_it_cannot_leak(
    tmp_path, settings
):
    task = make_task(tmp_path / "task")
    ws = init_workspace(str(task), tmp_path / "ws", settings)
    # The agent rewrites its copy of the verifier and the task folder changes later: neither
    # decides. Only solution.txt (editable) travels into the final run.
    (ws.root / "score.py").write_text("print('{\"best\": 0.0}')\n")
    (task / "score.py").write_text("print('{\"best\": 0.0}')\n")
    v = await final(ws, settings)
    assert v.verdict == "passed" and v.score == 100.0 and v.hidden_cases == 2
    assert v.certifies == "task_verifier" and v.sandbox == "full"
    hidden = list(read_jsonl(ws.store.hidden_results_path))[-1]
    assert hidden["output"]["n_hidden"] == 2 and len(hidden["cases"]) == 2
    # The cases file lived outside the workspace and is gone.
    assert not list(ws.root.rglob("cases.json"))
    assert not list((settings.state_dir / "stage" / "final").iterdir())
    # A failing run's text carries the hidden rows: the verdict says that it failed, in the
    # harness's words: not the text, nor which fields or cases, nor the exit status (each is a
    # value the run chose); the operator finds the output in the store's hidden results.
    (ws.root / "solution.txt").write_text("fail\n")
    v = await final(ws, settings)
    text = json.dumps(public_command_verdict(v))
    assert v.verdict == "rejected" and "rows=" not in text and "bad kernel" not in text
    assert {r["code"] for r in v.reasons} >= {"objective_error", "objective_exit"}
    assert not any(w in text for w in ("`error`", "cases[0]", "1 case", "exited with 1"))
    assert "exit_code" not in text and "error_fields" not in text and "wall_s" not in text
    hidden = list(read_jsonl(ws.store.hidden_results_path))[-1]
    assert "bad kernel" in hidden["output"]["error"]


@pytest.mark.anyio
async def test_a_final_objective_nested_past_the_recursion_limit_gets_a_reason(tmp_path, settings):
    """Before: json.loads raised RecursionError out of command_verify (the final verify
    crashed); the objective's JSON is read with one depth-checked reader (wire.json_object)."""
    ws = ws_of(tmp_path, settings)
    (ws.root / "solution.txt").write_text("nest\n")
    v = await final(ws, settings)
    assert v.verdict == "rejected" and [r["code"] for r in v.reasons] == ["no_score"]
    run = await dev(ws, settings)
    assert run.status == "failed" and "no JSON object" in run.reason


@pytest.mark.anyio
async def test_an_objective_that_exhausts_its_memory_is_rejected_for_the_limit_it_hit(tmp_path):
    """The sandbox's limits hold for a command task's objectives too; the limit is named by the
    sandbox's trusted outer process, never by the objective's own output."""
    if sandbox.probe().get("cgroup", "none") == "none":
        pytest.skip("this machine lets the sandbox make no cgroup")
    settings = Settings(state_dir=tmp_path / "state", sandbox_memory_mb=256)
    ws = ws_of(tmp_path, settings)
    (ws.root / "solution.txt").write_text("bomb\n")
    v = await final(ws, settings)
    assert v.verdict == "rejected" and v.reasons[0]["code"] == "resource_limit", v.reasons
    assert "resource_limit: memory" in v.reasons[0]["detail"]
    run = await dev(ws, settings)
    assert run.status == "failed" and "resource_limit: memory" in run.reason, run.reason


@pytest.mark.anyio
async def test_without_a_domain_the_final_objective_runs_its_own_cases(tmp_path, settings):
    ws = ws_of(tmp_path, settings, final_domain=False)
    v = await final(ws, settings)
    assert v.verdict == "passed" and v.hidden_cases == 0 and v.case_set == "final-fixed"
    # Its own fixed cases hide nothing: a failure's text is quoted (HarnessGym's "CUDA is not
    # available" was withheld as "computed on the hidden cases").
    (ws.root / "solution.txt").write_text("fail\n")
    v = await final(ws, settings)
    detail = v.reasons[0]["detail"]
    assert v.verdict == "rejected" and "withheld" not in detail
    assert "error: bad kernel on dev" in detail and "num_warps=3 invalid" in detail


def test_a_bare_python3_that_lacks_a_module_is_named_in_the_reason(tmp_path, settings):
    task = make_task(tmp_path / "task")
    toml = (
        (task / "task.toml")
        .read_text()
        .replace(
            '"{python} score.py --mode dev --repeats {repeats}"',
            '"{python} -c \\"import no_such_module_xyz\\""',
        )
    )
    (task / "task.toml").write_text(toml.replace("repeats = 3\n", ""))
    ws = init_workspace(str(task), tmp_path / "ws", settings)
    run = anyio.run(dev, ws, settings)
    assert "no module 'no_such_module_xyz'" in run.reason and "{python}" in run.reason


def test_task_toml_refuses_unknown_placeholders_and_knobs_without_defaults(tmp_path):
    task = make_task(tmp_path / "task")
    text = (task / "task.toml").read_text()
    (task / "task.toml").write_text(text.replace("--mode final", "--mode {mode}"))
    with pytest.raises(UsageError, match=r"unknown placeholder \{mode\}"):
        load_task(task)
    (task / "task.toml").write_text(text.replace("repeats = 3\n", ""))
    with pytest.raises(UsageError, match=r"uses \{repeats\}: give it a default"):
        load_task(task)


def exec_agent(tmp_path: Path, value: str) -> str:
    script = tmp_path / "agent.py"
    script.write_text(
        "import pathlib, sys\n"
        f"pathlib.Path(sys.argv[1], 'solution.txt').write_text('{value}\\n')\n"
        'pathlib.Path(sys.argv[2]).write_text(\'{"status": "improved"}\')\n'
    )
    return f"{shlex.quote(sys.executable)} {script} {{workspace}} {{result_file}}"


@pytest.mark.anyio
async def test_summary_json_ranks_by_the_tasks_higher_is_better(tmp_path, settings):
    task = make_task(tmp_path / "task", higher=True)
    config = RunConfig(
        task=str(task),
        workspace=tmp_path / "ws",
        iterations=1,
        runner="exec",
        agent_cmd=exec_agent(tmp_path, "150"),
        build="never",
        final_verify=False,
    )
    with anyio.fail_after(LIMIT_S):
        summary = await start_run(config, settings)
    # Before: 100 -> 150 with higher_is_better = true in task.toml was reported as -50%.
    assert summary["baseline"]["score_us"] == 100.0 and summary["best"]["score_us"] == 150.0
    assert summary["improvement_pct"] == pytest.approx(50.0)
    assert summary["higher_is_better"] is True and summary["unit"] == "points"


def test_harnesslab_run_on_a_folder_with_task_toml_needs_no_task(tmp_path):
    task = make_task(tmp_path / "task")
    res = harnesslab(
        tmp_path, "run", "-w", str(task), "--iterations", "1", "--runner", "exec",
        "--agent-cmd", exec_agent(tmp_path, "90"), "--build", "never", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert summary["best"]["score_us"] == 90.0 and summary["final"]["verdict"] == "passed"


def harnesslab(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harnesslab.servers", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={"HARNESSLAB_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"},
    )


def test_eval_and_verify_run_a_command_tasks_objectives_with_its_units(tmp_path):
    task = make_task(tmp_path / "task")
    ws = tmp_path / "ws"
    assert harnesslab(tmp_path, "init", "--task", str(task), "-w", str(ws)).returncode == 0
    # Before: both refused a command task ("works on kernel tasks").
    res = harnesslab(tmp_path, "eval", "-w", str(ws), "--repeats", "2")
    assert res.returncode == 0, res.stderr
    assert "best (points), lower is better" in res.stdout and "NOT meaningful" in res.stdout
    res = harnesslab(tmp_path, "verify", "-w", str(ws), "--json")
    verdict = json.loads(res.stdout)
    assert res.returncode == 0 and verdict["verdict"] == "passed" and verdict["score"] == 100.0
    assert "hidden" not in verdict and verdict["hidden_cases"] == 2
    res = harnesslab(tmp_path, "eval", "-w", str(ws), "--warmup", "2")
    assert res.returncode == 2 and "takes no warmup" in res.stderr


def test_the_autopilot_runs_a_command_task_without_a_config_file(tmp_path, settings):
    # Before: IsADirectoryError on the empty config_file; the attempt failed every time.
    task = make_task(tmp_path / "task")
    config = RunConfig(
        task=str(task),
        workspace=tmp_path / "ws",
        iterations=1,
        runner="autopilot",
        build="never",
        score_baseline=False,
        final_verify=False,
    )
    summary = anyio.run(start_run, config, settings)
    attempt = summary["iterations"][0]["attempt"]
    assert attempt["status"] == "ok", attempt
    assert summary["iterations"][0]["tool_calls"]["harnesslab-task.run_objective"] == 1
    assert open_workspace(tmp_path / "ws", settings).task.kind == "command"


def test_run_tables_label_scores_with_the_tasks_key_unit_and_direction():
    from rich.console import Console

    from harnesslab.servers.run_cmd import iterations_table, result_table

    score = {"verdict": "passed", "score_us": 150.0, "case_set": "final-fixed"}
    summary = {
        "run_id": "r", "status": "completed", "stop_reason": "done", "meaningful": True,
        "higher_is_better": True, "score_key": "throughput", "unit": "GB/s",
        "baseline": {**score, "score_us": 100.0}, "best": {**score, "iteration": 1},
        "final": score, "improvement_pct": 50.0, "workspace": "ws",
        "iterations": [{"iteration": 1, "attempt": {"status": "ok"}, "score": score}],
    }  # fmt: skip
    console = Console(record=True, width=200)
    console.print(iterations_table(summary))
    console.print(result_table(summary))
    text = console.export_text()
    # Before: "verified score us", "hidden cases" and -50% for a higher-is-better 100 -> 150.
    assert "throughput (GB/s)" in text and "score us" not in text and "hidden cases" not in text
    assert "1.50x better than the baseline" in text and "%" not in text
