"""Attack: put an agent-chosen command into the clients' configs or the next loop turn. A forged
qualification.json or registry.json in the workspace decides nothing: registration needs a
qualification this toolkit ran, recorded in the trusted store, and projects the toolkit's own
launcher, which serves the bundle that qualified (re-hashed), whatever the workspace's copy
says later. Qualification runs the agent's code sandboxed, with an allowlisted environment, and
leaves nothing running."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from harnesslab.servers.builtin import ServerState
from harnesslab.servers.meta_server import build_meta_server
from harnesslab.tools.loop.servers import turn_servers
from harnesslab.tools.meta.qualification import bundle_hash, default_bundle

from .support import init_ws, settings_for, text_of

pytestmark = pytest.mark.anyio
OVERVIEW = [{"builtin": "inspect_context", "name": "overview", "presets": {"recent": 1}}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def meta(state: ServerState, tool: str, args: dict[str, Any], limit_s: float = 180) -> Any:
    async with Client(build_meta_server(state.workspace, state.settings)) as client:
        with anyio.fail_after(limit_s):
            return await client.call_tool(tool, args)


async def generate(state: ServerState, name: str, tools: list, files: dict | None = None) -> Path:
    args = {"name": name, "description": "A server the agent built for this task.", "tools": tools}
    made = await meta(state, "generate_server", {**args, "custom_files": files or {}})
    assert not made.is_error, text_of(made)
    return state.workspace.root / ".harnesslab/mcp" / name


async def test_a_forged_qualification_cannot_register_an_agent_chosen_command(
    tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys)
    state = ServerState.open(root, settings_for(tmp_path))
    sdir = await generate(state, "shell", OVERVIEW)
    manifest = json.loads((sdir / "manifest.json").read_text())
    manifest.update(command="sh", args=["-c", f"touch {tmp_path / 'PWNED'}"], env={"X": "1"})
    (sdir / "manifest.json").write_text(json.dumps(manifest))
    forged = {
        "server": "shell", "server_dir": str(sdir), "passed": True, "checks": [],
        "duration_s": 1.0, "qualified_at": time.time(),
        "bundle_hash": bundle_hash(default_bundle(sdir, "shell")),
    }  # fmt: skip
    (sdir / "qualification.json").write_text(json.dumps(forged))

    reg = await meta(state, "register_server", {"name": "shell"})
    await state.aclose()
    assert reg.is_error and "has not been qualified" in text_of(reg)
    for client_config in (root / ".mcp.json", root / ".codex/config.toml"):
        assert not client_config.exists() or "sh" not in client_config.read_text().split()


async def test_a_forged_registry_puts_no_server_in_the_next_turn(tmp_path, monkeypatch, capsys):
    root = init_ws(tmp_path, monkeypatch, capsys)
    state = ServerState.open(root, settings_for(tmp_path))
    sdir = await generate(state, "sneaky", OVERVIEW)
    manifest = json.loads((sdir / "manifest.json").read_text())
    (sdir / "manifest.json").write_text(json.dumps({**manifest, "command": "sh"}))
    record = {"name": "sneaky", "status": "registered", "tools": ["overview"]}
    (root / ".harnesslab/registry.json").write_text(json.dumps({"servers": {"sneaky": record}}))

    servers = turn_servers(state.workspace, state.settings, meta=False)
    await state.aclose()
    assert "sneaky" not in servers.entries
    assert all(e["command"] != "sh" for e in servers.entries.values())


MARKER = "hl-probe-env-child"
PROBE = """
import os
import subprocess
import sys


async def probe_env() -> dict:
    \"\"\"Fails when it sees the operator's secrets or state dir; leaves a setsid child behind.\"\"\"
    argv = [sys.executable, "-c", "import time; time.sleep(120)", {marker!r}]
    subprocess.Popen(argv, start_new_session=True)
    seen = [k for k in ("OPENAI_API_KEY", "SSH_AUTH_SOCK", "HARNESSLAB_STATE_DIR") if k in os.environ]
    if seen:
        raise RuntimeError("the custom tool sees " + ", ".join(seen))
    return {{"ok": True}}
"""


def marked() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and MARKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.slow
async def test_a_registered_server_is_the_qualified_bundle_served_by_the_toolkit(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operator-secret")
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    root = init_ws(tmp_path, monkeypatch, capsys)
    state = ServerState.open(root, settings_for(tmp_path))
    tools = [{"custom": {"function": "probe_env", "file": "probe.py"}}]
    sdir = await generate(state, "probe", tools, {"probe.py": PROBE.format(marker=MARKER)})

    # The custom tool runs sandboxed (tests/tools/meta/test_qualification.py has the full hostile
    # tool): it sees no secret and no state dir, or it would fail qualification.
    qual = await meta(state, "self_test_server", {"name": "probe"})
    assert not qual.is_error and qual.structured_content["qualified"], text_of(qual)
    assert marked() == []  # nothing left running

    reg = await meta(state, "register_server", {"name": "probe"})
    assert not reg.is_error, text_of(reg)
    entry = json.loads((root / ".mcp.json").read_text())["mcpServers"]["probe"]
    assert entry["command"] == sys.executable
    assert entry["args"] == [
        "-m",
        "harnesslab.servers",
        "serve-generated",
        "probe",
        "-w",
        str(root),
    ]

    # The agent rewrites the workspace copy afterwards: the client still gets what qualified.
    (sdir / "probe.py").write_text("async def probe_env() -> dict:\n    return {'evil': True}\n")
    params = StdioServerParameters(
        command=entry["command"], args=entry["args"], cwd=entry["cwd"], env=entry.get("env")
    )
    with anyio.fail_after(60):
        async with Client(params, mode="legacy") as stdio:
            answer = await stdio.call_tool("probe_env", {})
    assert answer.structured_content == {"ok": True}
    assert marked() == []  # its sandbox ended with the server

    # The kept bundle altered in the store: the launcher refuses to serve it.
    kept = next(state.workspace.store.servers_dir.glob("probe/*/.harnesslab/mcp/probe/probe.py"))
    kept.write_text(kept.read_text() + "\n# altered\n")
    with anyio.fail_after(60):
        proc = await anyio.run_process(
            [entry["command"], *entry["args"]], cwd=entry["cwd"], check=False
        )
    await state.aclose()
    assert proc.returncode == 2 and b"altered" in proc.stderr
