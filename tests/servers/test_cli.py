"""The `harnesslab` CLI: exit codes, JSON output, bad input, the README's main job."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from harnesslab.servers.cli import main as cli_main
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.secrets_store import workspace_secret
from harnesslab.tools.task.spec import load_task

CLI = [sys.executable, "-m", "harnesslab.servers"]


def run_cli(*args: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_init_then_eval_json_then_verify_json_succeed_on_the_cpu(tmp_path):
    ws = tmp_path / "ws"
    init = run_cli("init", "-w", str(ws), "--json", tmp_path=tmp_path)
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["task"] == "rmsnorm_gate"
    ev = run_cli("eval", "-w", str(ws), "--json", "--cases", "1024x1024_fp16", tmp_path=tmp_path)
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout)
    assert result["status"] == "passed" and result["meaningful"] is False
    # --json keeps stdout to the JSON; progress still shows, on stderr
    assert "eval: started" in ev.stderr and "[1/1] 1024x1024_fp16: passed" in ev.stderr
    # --reveal-cases: the operator's flag (tests/trust/test_hidden_cases.py: without it, no
    # shape is printed)
    ver = run_cli("verify", "-w", str(ws), "--json", "--reveal-cases", tmp_path=tmp_path)
    assert ver.returncode == 0, ver.stderr
    verdict = json.loads(ver.stdout)
    assert verdict["verdict"] == "passed"
    # ...and shows the operator exactly the hidden cases drawn from the workspace's secret
    seed = workspace_secret(Settings(state_dir=tmp_path / "state"), ws)["seed"]
    final = load_task("rmsnorm_gate").final
    assert final is not None
    drawn = {c.name for c in final.draw(seed)}
    assert {c["name"] for c in verdict["evidence"]["cases"]} == drawn
    # The hidden shapes (reported in the verdict's evidence, after the fact) appear in no file
    # of the workspace, its .harnesslab views included.
    hidden = [f"{c['shape']['rows']}x{c['shape']['dim']}" for c in verdict["evidence"]["cases"]]
    assert hidden
    for path in (p for p in ws.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        leaked = [h for h in hidden if h in text]
        assert not leaked, f"{path} contains hidden shapes {leaked}"


def test_unknown_task_exits_2_naming_the_known_tasks(tmp_path):
    res = run_cli("init", "-w", str(tmp_path / "ws"), "--task", "nope", tmp_path=tmp_path)
    assert res.returncode == 2
    assert "unknown task 'nope'" in res.stderr and "rmsnorm_gate" in res.stderr


def test_missing_workspace_exits_2_with_the_fix_and_the_fix_runs_as_written(tmp_path):
    missing = tmp_path / "missing"
    res = run_cli("eval", "-w", str(missing), tmp_path=tmp_path)
    assert res.returncode == 2
    assert "does not exist" in res.stderr
    fix = re.search(r"harnesslab (init [^\n(]*)", res.stderr)
    assert fix is not None, res.stderr
    assert fix.group(1).split() == ["init", "-w", str(missing)]
    made = run_cli(*fix.group(1).split(), tmp_path=tmp_path)
    assert made.returncode == 0 and "deprecated" not in made.stderr, made.stderr


def test_failing_candidate_exits_1_and_out_of_range_config_exits_2(tmp_path):
    ws = tmp_path / "ws"
    assert run_cli("init", "-w", str(ws), tmp_path=tmp_path).returncode == 0
    kernel = ws / "kernel.py"
    kernel.write_text(
        kernel.read_text() + "\n_f = rmsnorm_gate\nrmsnorm_gate = lambda *a: _f(*a) * 2\n"
    )
    res = run_cli("eval", "-w", str(ws), "--json", "--cases", "1024x1024_fp16", tmp_path=tmp_path)
    assert res.returncode == 1
    assert json.loads(res.stdout)["status"] == "failed"
    (ws / "kernel_config.json").write_text('{"num_warps": 3}')
    res = run_cli("eval", "-w", str(ws), tmp_path=tmp_path)
    assert res.returncode == 2
    assert "kernel_config.json: num_warps=3 is not one of 1,2,4,8,16,32" in res.stderr


def test_init_refuses_a_non_empty_folder_without_force(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine")
    res = run_cli("init", "-w", str(ws), tmp_path=tmp_path)
    assert res.returncode == 2 and "--force" in res.stderr
    assert (ws / "notes.txt").read_text() == "mine"


def test_readme_opens_with_the_main_job_and_the_test_command():
    """The README's first block is `make demo` (-> `harnesslab demo`, run end to end by
    tests/servers/test_demo.py) and `make test` (-> pytest)."""
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    first_block = readme.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (root / "Makefile").read_text()
    assert "$(VENV)/bin/harnesslab demo" in makefile.split("demo: $(STAMP)")[1].split("\n\n")[0]
    assert "-m pytest" in makefile.split("test: $(STAMP)")[1].split("\n\n")[0]


def test_version_names_the_installed_distribution(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"harnesslab {version('harnesslab')}"


def test_init_takes_w_like_every_command_and_the_old_positional_still_works(tmp_path):
    res = run_cli("init", "-w", str(tmp_path / "a"), "--json", tmp_path=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["workspace"] == str(tmp_path / "a")
    assert "deprecated" not in res.stderr
    old = run_cli("init", str(tmp_path / "b"), tmp_path=tmp_path)
    assert old.returncode == 0 and (tmp_path / "b" / "kernel.py").is_file()
    assert f"use `harnesslab init -w {tmp_path / 'b'}`" in old.stderr
    both = run_cli("init", str(tmp_path / "c"), "-w", str(tmp_path / "d"), tmp_path=tmp_path)
    assert both.returncode == 2 and "two folders" in both.stderr


def test_a_mistyped_command_or_flag_gets_the_closest_one_and_that_commands_usage(capsys):
    for argv, hint, usage in (
        (["evl"], "did you mean eval?", "usage: harnesslab [-h]"),
        (["eval", "--worksapce", "x"], "did you mean --workspace?", "usage: harnesslab eval"),
        (["run", "-w", "x", "--runner", "codx"], "did you mean codex?", "usage: harnesslab run"),
        (["config", "claude", "--aprove"], "did you mean --approve", "usage: harnesslab config"),
    ):
        with pytest.raises(SystemExit) as done:
            cli_main(argv)
        err = capsys.readouterr().err
        assert done.value.code == 2, argv
        assert hint in err and err.startswith(usage), err


def test_token_env_without_url_is_an_error_that_says_what_to_add(tmp_path, capsys):
    code = cli_main(["config", "claude", "-w", str(tmp_path), "--token-env", "HARNESSLAB_TOKEN"])
    err = capsys.readouterr().err
    assert code == 2 and "--token-env only applies to an HTTP server (--url)" in err
    assert "add --url" in err


def test_approve_without_write_is_an_error(tmp_path, capsys):
    assert cli_main(["config", "codex", "-w", str(tmp_path), "--approve"]) == 2
    assert "--approve goes with --write" in capsys.readouterr().err


def test_task_list_names_each_task_with_its_kind_and_show_prints_what_task_toml_sets(capsys):
    assert cli_main(["task", "list", "--json"]) == 0
    kinds = {row["name"]: row["kind"] for row in json.loads(capsys.readouterr().out)}
    assert kinds["decode_step"] == "step" and kinds["rmsnorm_gate"] == "kernel"
    assert cli_main(["task", "show", "decode_step", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "step" and shown["step"]["interpreter"]["layers"] == 2
    assert "dev_cases" not in shown  # only what task.toml sets
    assert cli_main(["task", "show", "decode_step"]) == 0
    assert "next: harnesslab init --task decode_step" in capsys.readouterr().out


@pytest.mark.slow  # 10-25 s: runners on the interpreter (test_step_objective.py is the fast one)
def test_a_step_workspace_evals_one_trace_and_verifies_its_outputs_on_hidden_traces(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    ws = str(tmp_path / "ws")
    assert cli_main(["init", "-w", ws, "--task", "decode_step"]) == 0
    assert cli_main(["eval", "-w", ws, "--cases", "fixed_fp16"]) == 0
    out = capsys.readouterr().out
    assert "per-bucket step latency" in out and "fixed_fp16" in out
    assert cli_main(["verify", "-w", ws]) == 0
    out = capsys.readouterr().out
    assert "verdict: passed (certifies: step_outputs)" in out and "final1_float16" in out


def test_the_cli_starts_without_torch_triton_or_the_mcp_server():
    """Every `harnesslab` command pays the CLI's imports: torch (2 s of CPU), triton and
    mcp.server load only in the commands that use them (task new/import-kernelbench through
    tools.authoring, the dashboard), not at start-up."""
    probe = "import sys, harnesslab.servers.cli; print([m for m in HEAVY if m in sys.modules])"
    heavy = ("torch", "triton", "mcp.server")
    out = subprocess.run([sys.executable, "-c", f"HEAVY = {heavy!r}; {probe}"],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout
