"""The real server as a subprocess: `harnesslab serve` over stdio (SDK stdio client, and raw
JSON-RPC to prove stdout carries nothing but protocol), over streamable HTTP on a free loopback
port with a bearer token, `--self-test`, and `harnesslab config` for both clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from harnesslab.servers.cli import main as cli_main

from .support import SMALL, TOOL_NAMES, kernel_workspace, serving_url, text_of

HARNESSLAB = Path(sys.executable).parent / "harnesslab"
CLI = [str(HARNESSLAB)] if HARNESSLAB.is_file() else [sys.executable, "-m", "harnesslab.servers"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def server_env(tmp_path: Path) -> dict[str, str]:
    return {"HARNESSLAB_STATE_DIR": str(tmp_path / "state"), "HARNESSLAB_INTERPRET": "always"}


@pytest.mark.anyio
async def test_the_stdio_server_lists_every_tool_and_answers_calls(tmp_path):
    ws = kernel_workspace(tmp_path)
    params = StdioServerParameters(
        command=CLI[0],
        args=[*CLI[1:], "serve", "--workspace", str(ws.root)],
        env=server_env(tmp_path),
    )
    with anyio.fail_after(120):
        async with Client(params) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOL_NAMES
            ctx = await client.call_tool("inspect_context", {})
            assert ctx.structured_content["workspace"] == str(ws.root)
            obj = await client.call_tool("run_objective", {"cases": [SMALL]})
            assert obj.structured_content["status"] == "passed", text_of(obj)
            bad = await client.call_tool("run_objective", {"repeats": 0})
            assert bad.is_error and "repeats" in text_of(bad)
            again = await client.call_tool("rank_history", {})
            assert again.structured_content["total"] == 1


@pytest.mark.anyio
async def test_stdout_carries_only_json_rpc_messages(tmp_path):
    ws = kernel_workspace(tmp_path)
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": LATEST_HANDSHAKE_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "0"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "inspect_context", "arguments": {}},
        },
        {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "run_objective", "arguments": {"warmup": "x"}},
        },
    ]
    argv = [*CLI, "serve", "--workspace", str(ws.root)]
    env = {**os.environ, **server_env(tmp_path)}
    lines: list[str] = []
    async with await anyio.open_process(argv, env=env) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for r in requests:
            await proc.stdin.send((json.dumps(r) + "\n").encode())
        buf = b""
        with anyio.fail_after(60):  # read until the last answer; EOF would cancel it
            async for chunk in proc.stdout:
                buf += chunk
                lines = [ln for ln in buf.decode().splitlines() if ln.strip()]
                if any('"id":4' in ln.replace(" ", "") for ln in lines):
                    break
        await proc.stdin.aclose()
        with anyio.fail_after(30):
            await proc.wait()
    messages = [json.loads(ln) for ln in lines]  # any stray print would fail here
    assert all(m.get("jsonrpc") == "2.0" for m in messages)
    by_id = {m["id"]: m for m in messages if "id" in m}
    assert {1, 2, 3, 4} <= set(by_id)
    assert len(by_id[2]["result"]["tools"]) == len(TOOL_NAMES)
    assert by_id[4]["result"]["isError"] is True


@pytest.mark.anyio
async def test_the_http_server_requires_its_bearer_token_and_serves_the_tools(tmp_path):
    ws = kernel_workspace(tmp_path)
    argv = [*CLI, "serve", "--workspace", str(ws.root), "--transport", "http", "--port", "0"]
    env = {**os.environ, **server_env(tmp_path), "HARNESSLAB_TOKEN": "s3cret"}
    async with await anyio.open_process(argv, env=env) as proc:
        try:
            with anyio.fail_after(60):
                url = await serving_url(proc)
            assert url.startswith("http://127.0.0.1:")
            request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            async with httpx2.AsyncClient() as raw:
                denied = await raw.post(url, json=request)
                wrong = await raw.post(url, json=request, headers={"Authorization": "Bearer x"})
            # 403 with a message, not 401: a 401 sends MCP clients into OAuth (see BearerAuth)
            assert denied.status_code == 403 and "bearer token required" in denied.text
            assert "Authorization: Bearer <token>" in denied.text
            assert wrong.status_code == 403 and "wrong bearer token" in wrong.text
            # the scheme is case-insensitive (RFC 7235)
            http = httpx2.AsyncClient(headers={"Authorization": "bearer s3cret"})
            with anyio.fail_after(60):
                async with http, Client(streamable_http_client(url, http_client=http)) as client:
                    assert {t.name for t in (await client.list_tools()).tools} == TOOL_NAMES
                    res = await client.call_tool("inspect_context", {"recent": 1})
                    assert res.structured_content["task"]["name"] == "rmsnorm_gate"
        finally:
            proc.terminate()


def test_binding_a_public_address_without_a_token_is_refused(tmp_path):
    ws = kernel_workspace(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "HARNESSLAB_TOKEN"}
    proc = subprocess.run(
        [*CLI, "serve", "-w", str(ws.root), "--transport", "http", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **server_env(tmp_path)},
    )
    assert proc.returncode == 2
    assert "token" in proc.stderr and proc.stdout == ""


def test_self_test_calls_every_tool_and_exits_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HARNESSLAB_INTERPRET", "always")
    assert cli_main(["serve", "--self-test"]) == 0
    err = capsys.readouterr().err
    for tool in TOOL_NAMES:
        assert tool in err
    assert "self-test passed" in err


def test_config_prints_and_merges_client_entries(tmp_path, capsys):
    ws = kernel_workspace(tmp_path)
    assert cli_main(["config", "claude", "-w", str(ws.root), "--gpu-host", "me@h100"]) == 0
    entry = json.loads(capsys.readouterr().out)["mcpServers"]["harnesslab"]
    assert entry["args"][-5:] == ["serve", "--workspace", str(ws.root), "--gpu-host", "me@h100"]
    (ws.root / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    assert cli_main(["config", "claude", "-w", str(ws.root), "--write"]) == 0
    merged = json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]
    assert set(merged) == {"other", "harnesslab"}
    assert cli_main(["config", "codex", "-w", str(ws.root), "--write"]) == 0
    capsys.readouterr()
    codex = tomllib.loads((ws.root / ".codex" / "config.toml").read_text())
    table = codex["mcp_servers"]["harnesslab"]
    assert table["startup_timeout_sec"] > 0 and table["tool_timeout_sec"] > 0
    assert table["args"][-3:] == ["serve", "--workspace", str(ws.root)]
