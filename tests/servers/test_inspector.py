"""The MCP Inspector CLI (npm, pinned) against the real stdio server: tools/list and a
tools/call of inspect_context. CI installs the pinned version once with
`npm ci --prefix tests/servers` (tests/servers/package.json + package-lock.json); without that,
`npx -y @modelcontextprotocol/inspector@<pinned>` is used, and without npx the tests skip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from .support import TOOL_NAMES, kernel_workspace, serving_url

HERE = Path(__file__).parent
INSPECTOR_VERSION = json.loads((HERE / "package.json").read_text())["devDependencies"][
    "@modelcontextprotocol/inspector"
]
LOCAL_BIN = HERE / "node_modules" / ".bin" / "mcp-inspector"
HARNESSLAB = Path(sys.executable).parent / "harnesslab"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "network request")


def inspector() -> list[str]:
    if LOCAL_BIN.is_file():
        return [str(LOCAL_BIN)]
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip(
            "npx not found: install Node.js >= 22 and run `npm ci --prefix tests/servers` "
            "to run the MCP Inspector tests"
        )
    return [npx, "-y", f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}"]


def run_inspector(tmp_path: Path, *method: str) -> dict:
    if not HARNESSLAB.is_file():
        pytest.skip(f"no harnesslab console script beside {sys.executable}")
    ws = kernel_workspace(tmp_path)
    argv = [*inspector(), "--cli", str(HARNESSLAB), "serve", "--workspace", str(ws.root)]
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(
        [*argv, *method], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    if proc.returncode != 0 and any(s in proc.stderr for s in OFFLINE):
        pytest.skip(f"npm registry unreachable for npx: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_inspector_cli_lists_the_nine_tools(tmp_path):
    listed = run_inspector(tmp_path, "--method", "tools/list")
    tools = {t["name"]: t for t in listed["tools"]}
    assert set(tools) == TOOL_NAMES
    assert tools["rank_history"]["inputSchema"]["properties"]["limit"]["maximum"] == 100
    assert tools["inspect_context"]["annotations"]["readOnlyHint"] is True


def test_the_inspector_cli_calls_inspect_context(tmp_path):
    res = run_inspector(
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "inspect_context",
        "--tool-arg",
        "recent=2",
    )
    assert not res.get("isError")
    assert res["structuredContent"]["task"]["name"] == "rmsnorm_gate"
    assert res["structuredContent"]["next_step"]


@pytest.mark.anyio
async def test_the_inspector_says_a_token_is_missing_instead_of_starting_oauth(tmp_path):
    """A server started with a token answers a request without it with a message saying how to
    send it; the Inspector shows that message (with a 401 it tried OAuth and failed with
    "Interactive OAuth requires a TTY")."""
    if not HARNESSLAB.is_file():
        pytest.skip(f"no harnesslab console script beside {sys.executable}")
    ws = kernel_workspace(tmp_path)
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state"), "HARNESSLAB_TOKEN": "t"}
    argv = [str(HARNESSLAB), "serve", "-w", str(ws.root), "--transport", "http", "--port", "0"]
    async with await anyio.open_process(argv, env=env) as server:
        try:
            with anyio.fail_after(60):
                url = await serving_url(server)
            cli = [*inspector(), "--cli", url, "--transport", "http", "--method", "tools/list"]
            with anyio.fail_after(120):
                proc = await anyio.run_process(cli, check=False, cwd=tmp_path)
                # the README's way to send it
                header = ["--header", "Authorization: Bearer t"]
                sent = await anyio.run_process([*cli, *header], check=False, cwd=tmp_path)
        finally:
            server.terminate()
    out = (proc.stdout + proc.stderr).decode(errors="replace")
    if any(s in out for s in OFFLINE) and "bearer" not in out:
        pytest.skip(f"npm registry unreachable for npx: {out.strip()[-200:]}")
    assert "bearer token required" in out and "HARNESSLAB_TOKEN" in out, out[-2000:]
    assert "OAuth" not in out
    assert sent.returncode == 0, sent.stderr.decode(errors="replace")[-2000:]
    assert {t["name"] for t in json.loads(sent.stdout)["tools"]} == TOOL_NAMES
