"""Helpers for the attack tests (tests/trust/): the agent's moves are file writes in its
workspace, tool arguments and CLI calls, so a workspace here is made with the real CLI and
attacked through the task server and the meta-server over the SDK's in-memory client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from harnesslab.servers.builtin import ServerState
from harnesslab.servers.cli import main
from harnesslab.servers.task_server import build_task_server
from harnesslab.tests.servers.support import CannedLauncher, text_of
from harnesslab.tools.settings import Settings

TASK = "rmsnorm_gate"
SMALL = "1024x1024_fp16"


def settings_for(tmp: Path) -> Settings:
    return Settings(state_dir=tmp / "state", interpret="always")


def cli(
    args: list[str], tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str, str]:
    """`harnesslab ARGS` in process, with the state dir under `tmp`: (exit code, out, err)."""
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp / "state"))
    monkeypatch.setenv("HARNESSLAB_INTERPRET", "always")
    capsys.readouterr()
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def init_ws(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, task: str = TASK
) -> Path:
    code, _, err = cli(["init", "--task", task, str(tmp / "ws")], tmp, monkeypatch, capsys)
    assert code == 0, err
    return (tmp / "ws").resolve()


def canned_state(root: Path, tmp: Path) -> ServerState:
    """The task server's state with the real launcher machinery and a runner that answers
    instantly (tests/servers/support.py)."""
    cfg = settings_for(tmp)
    return ServerState.open(root, cfg, launcher=CannedLauncher(cfg))


async def call(client: Client, tool: str, args: dict[str, Any] | None = None) -> Any:
    with anyio.fail_after(120):
        return await client.call_tool(tool, args or {})


async def tool_calls(state: ServerState, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """Call the task server's tools in order in one session; returns the results."""
    out = []
    async with Client(build_task_server(state)) as client:
        for name, args in calls:
            out.append(await call(client, name, args))
    return out


def agent_readable_text(root: Path) -> str:
    """Every file under the workspace, as the agent would read it."""
    parts = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


__all__ = [
    "SMALL",
    "TASK",
    "agent_readable_text",
    "call",
    "canned_state",
    "cli",
    "init_ws",
    "jsonl",
    "settings_for",
    "text_of",
    "tool_calls",
]
