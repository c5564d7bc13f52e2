"""`harnesslab demo`: the README's main job, end to end through the real CLI. A 2-iteration
autopilot loop on rmsnorm_gate under the Triton CPU interpreter: the autopilot drives the task
server over stdio, builds a task-specific server through the meta-server, the loop registers it,
the second attempt uses it, and the best checkpoint is restored and re-verified."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import open_workspace

CLI = [sys.executable, "-m", "harnesslab.servers"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # its subprocess has a 540 s limit; the suite default is 300 s
def test_demo_runs_two_autopilot_iterations_builds_a_server_and_uses_it(tmp_path: Path):
    ws = tmp_path / "ws"
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    res = subprocess.run(
        [*CLI, "demo", "--workspace", str(ws), "--json"],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    assert summary["status"] == "completed" and summary["runner"] == "autopilot"
    assert summary["meaningful"] is False  # the CPU interpreter: timings say nothing
    first, second = summary["iterations"]
    for it in (first, second):
        assert it["attempt"]["status"] == "ok", it["attempt"]
        assert it["score"]["verdict"] == "passed"
        assert it["attempt"]["claimed"]["status"] in ("improved", "no_change")
    # iteration 1: the autopilot swept through the task server, then built a server through the
    # meta-server; the loop registered it
    calls_1 = first["tool_calls"]
    assert calls_1["harnesslab-task.sweep_kernel_config"] >= 1
    assert calls_1["harnesslab-meta.generate_server"] == 1
    assert [(s["name"], s["status"]) for s in first["servers"]] == [
        ("rmsnorm-gate-tuned", "registered")
    ]
    # iteration 2: a fresh session got the generated server and called it
    assert "rmsnorm-gate-tuned" in second["active_servers"]
    assert second["tool_calls"].get("rmsnorm-gate-tuned.sweep_winning_region") == 1
    # GPU-backed work is accounted: the task server's GPU tools plus the loop's scoring
    gpu = summary["gpu_work_s"]
    assert gpu["tools"] > 0 and gpu["scoring"] > 0
    assert gpu["total"] == pytest.approx(gpu["tools"] + gpu["scoring"], abs=0.11)
    assert gpu["total"] < summary["wall_s"]
    # the best verified checkpoint is in the workspace, re-verified on a new hidden case set
    settings = Settings(state_dir=tmp_path / "state")
    assert open_workspace(ws, settings).candidate_hash() == summary["best"]["candidate"]
    assert summary["final"]["verdict"] == "passed"
    assert summary["final"]["case_set"] != summary["baseline"]["case_set"]
    mcp = json.loads((ws / ".mcp.json").read_text())["mcpServers"]
    assert "rmsnorm-gate-tuned" in mcp
    run_dir = ws / ".harnesslab" / "runs" / summary["run_id"]
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == summary["run_id"]
