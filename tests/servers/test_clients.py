"""A new user's path with the real clients (pinned in tests/agent_clis/package.json, sealed off
by tests/agent_cli.py): `harnesslab init`, `harnesslab config claude|codex --write --approve`,
then the client started inside the workspace lists the server. Claude Code's health check
starts the server and completes the MCP handshake, which needs no login once the server is
approved; Codex's `mcp list` reads the project config once the project is trusted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harnesslab.tests.agent_cli import cli_path, run_cli, sealed_env

HARNESSLAB = Path(sys.executable).parent / "harnesslab"
CLI = [str(HARNESSLAB)] if HARNESSLAB.is_file() else [sys.executable, "-m", "harnesslab.servers"]


def harnesslab(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return res


def new_workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    env = sealed_env(tmp_path / "home")
    env.update(HARNESSLAB_STATE_DIR=str(tmp_path / "state"), HARNESSLAB_INTERPRET="always")
    ws = tmp_path / "ws"
    harnesslab("init", "-w", str(ws), env=env)
    return ws, env


def server_line(listing: str, name: str = "harnesslab") -> str:
    return next((ln for ln in listing.splitlines() if ln.startswith(f"{name}:")), listing)


def test_claude_code_shows_the_server_pending_until_approved_then_connected(tmp_path):
    cli_path("claude")
    ws, env = new_workspace(tmp_path)
    harnesslab("config", "claude", "-w", str(ws), "--write", env=env)
    pending = run_cli("claude", "mcp", "list", env=env, cwd=ws)
    assert "Pending approval" in server_line(pending.stdout), pending.stdout + pending.stderr
    written = harnesslab("config", "claude", "-w", str(ws), "--write", "--approve", env=env)
    assert ".claude.json" in written.stdout and "settings.local.json" in written.stdout
    listed = run_cli("claude", "mcp", "list", env=env, cwd=ws)
    assert "✔ Connected" in server_line(listed.stdout), listed.stdout + listed.stderr
    # Started anywhere else, Claude Code does not see the workspace's server at all.
    elsewhere = run_cli("claude", "mcp", "list", env=env, cwd=tmp_path)
    assert "harnesslab:" not in elsewhere.stdout


def test_codex_lists_no_server_until_the_workspace_is_trusted_then_the_written_one(tmp_path):
    cli_path("codex")
    ws, env = new_workspace(tmp_path)
    harnesslab("config", "codex", "-w", str(ws), "--write", env=env)
    untrusted = run_cli("codex", "mcp", "list", "--json", env=env, cwd=ws)
    assert untrusted.returncode == 0, untrusted.stderr[-2000:]
    assert json.loads(untrusted.stdout) == []
    harnesslab("config", "codex", "-w", str(ws), "--write", "--approve", env=env)
    trusted = run_cli("codex", "mcp", "list", "--json", env=env, cwd=ws)
    assert trusted.returncode == 0, trusted.stderr[-2000:]
    (server,) = json.loads(trusted.stdout)
    assert server["name"] == "harnesslab" and server["enabled"] is True
    assert server["transport"]["command"] == CLI[0]
    assert server["transport"]["args"][-3:] == ["serve", "--workspace", str(ws.resolve())]
    assert server["startup_timeout_sec"] == 30 and server["tool_timeout_sec"] == 1800


@pytest.mark.slow(
    "repeats with the real CLIs (77 s of a worker) what stays fast in tests/tools/test_doctor.py "
    "(the checks and fixes), tests/tools/loop/test_runners.py::"
    "test_claude_preflight_accepts_the_flags_and_stops_at_the_missing_login (the login check "
    "doctor runs) and tests/tools/meta/test_client_setup.py::"
    "test_a_written_entry_is_ready_only_once_approved (a config is ok once approved)"
)
def test_doctor_names_what_each_client_misses_and_is_satisfied_after_config_approve(tmp_path):
    ws, env = new_workspace(tmp_path)
    env["HARNESSLAB_CLAUDE_COMMAND"] = str(cli_path("claude"))
    env["HARNESSLAB_CODEX_COMMAND"] = str(cli_path("codex"))

    def doctor() -> dict[str, dict]:
        res = subprocess.run(
            [*CLI, "doctor", "-w", str(ws), "--json", "--no-executor"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert res.returncode == 1, res.stderr  # the CLIs are not logged in here
        return {c["name"]: c for c in json.loads(res.stdout)["checks"]}

    before = doctor()
    assert before["workspace"]["status"] == "ok"
    for client in ("claude", "codex"):
        check = before[f"{client} config"]
        assert check["status"] == "missing"
        assert check["fix"].startswith(f"harnesslab config {client} -w {ws} --write --approve")
        cli = before[f"{client} CLI"]
        assert cli["status"] == "missing" and "not logged in" in cli["detail"]
        assert "login" in cli["fix"]
    for client in ("claude", "codex"):
        harnesslab("config", client, "-w", str(ws), "--write", "--approve", env=env)
    after = doctor()
    assert after["claude config"]["status"] == "ok" and after["codex config"]["status"] == "ok"


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_approve_keeps_every_other_setting_of_the_clients_files(tmp_path, client):
    _, env = new_workspace(tmp_path)
    ws = tmp_path / "ws"
    home = Path(env["HOME"])
    if client == "claude":
        (home / ".claude.json").write_text(json.dumps({"userID": "u", "projects": {"/x": {}}}))
        (ws / ".claude").mkdir(exist_ok=True)
        (ws / ".claude" / "settings.local.json").write_text(
            json.dumps({"enabledMcpjsonServers": ["other"], "model": "opus"})
        )
    else:
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").write_text('model = "o3"  # mine\n\n[projects."/x"]\n')
    harnesslab("config", client, "-w", str(ws), "--write", "--approve", env=env)
    key = str(ws.resolve())
    if client == "claude":
        glob = json.loads((home / ".claude.json").read_text())
        assert glob["userID"] == "u" and "/x" in glob["projects"]
        assert glob["projects"][key]["hasTrustDialogAccepted"] is True
        local = json.loads((ws / ".claude" / "settings.local.json").read_text())
        assert local == {"enabledMcpjsonServers": ["other", "harnesslab"], "model": "opus"}
    else:
        text = (home / ".codex" / "config.toml").read_text()
        assert text.startswith('model = "o3"  # mine\n\n[projects."/x"]\n')
        assert f'[projects."{key}"]\ntrust_level = "trusted"\n' in text
