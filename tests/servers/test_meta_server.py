"""The meta-server through the SDK's in-memory client: generate -> self-test -> register on a fresh
workspace, and each broken variant quarantined with the precise reason.

Every qualification spawns real processes (the server over stdio, its self-test, its pytest);
the variants use custom tools and inspect_context, which need no runner call (~5 s each)."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from harnesslab.servers.meta_server import build_meta_server
from harnesslab.tests.conftest_shared import make_settings, make_workspace
from harnesslab.tools import catalog
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace

pytestmark = pytest.mark.anyio

DIAG = '''
import json
from pathlib import Path


async def config_summary(workspace: Path, verbose: bool = False) -> dict:
    """The knobs in kernel_config.json."""
    cfg = json.loads((workspace / "kernel_config.json").read_text())
    return {"knobs": sorted(cfg), "verbose": verbose}
'''
GOOD_TOOLS = [
    {"builtin": "inspect_context", "name": "overview", "presets": {"recent": 2}},
    {"custom": {"function": "config_summary", "file": "diag.py"}, "probe_args": {"verbose": True}},
]
META_TOOLS = {
    "generate_server",
    "self_test_server",
    "register_server",
    "list_servers",
    "quarantine_server",
}
assert set(catalog.META_TOOLS) == META_TOOLS  # the one list the loop and the clients read


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


async def call(client: Client, tool: str, args: dict[str, Any], limit_s: float = 120) -> Any:
    with anyio.fail_after(limit_s):
        return await client.call_tool(tool, args)


def one_tool(source: str, **tool: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    return [{"custom": {"function": "f", "file": "fix.py"}, **tool}], {"fix.py": source}


async def test_the_meta_server_lists_its_five_tools_with_annotations(
    ws: Workspace, settings: Settings
) -> None:
    async with Client(build_meta_server(ws, settings)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == META_TOOLS
    assert tools["list_servers"].annotations.read_only_hint is True
    assert tools["quarantine_server"].annotations.destructive_hint is True
    assert all(t.description and t.output_schema for t in tools.values())


async def test_generate_self_test_register_on_a_fresh_workspace(
    ws: Workspace, settings: Settings
) -> None:
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with Client(build_meta_server(ws, settings)) as client:
        made = await call(
            client,
            "generate_server",
            {
                "name": "rms-tools",
                "description": "An overview preset and a config summary for rmsnorm_gate.",
                "tools": GOOD_TOOLS,
                "custom_files": {"diag.py": DIAG},
            },
        )
        assert not made.is_error, made.content
        assert made.structured_content["server_dir"] == ".harnesslab/mcp/rms-tools"
        with anyio.fail_after(120):
            qual = await client.call_tool(
                "self_test_server", {"name": "rms-tools"}, progress_callback=on_progress
            )
        assert not qual.is_error, qual.content
        out = qual.structured_content
        assert out["qualified"], out["reason"]
        assert out["status"] == "qualified"
        assert {"startup", "tools_list", "tool:overview", "tool:config_summary"} <= {
            c["name"] for c in out["checks"]
        }
        assert any("own_tests" in m for m in progress)
        reg = await call(client, "register_server", {"name": "rms-tools"})
        assert not reg.is_error, reg.content
        assert reg.structured_content["server"]["status"] == "registered"
        listed = await call(client, "list_servers", {})
    assert [(s["name"], s["status"]) for s in listed.structured_content["servers"]] == [
        ("rms-tools", "registered")
    ]
    entry = json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]["rms-tools"]
    codex = tomllib.loads((ws.root / ".codex/config.toml").read_text())["mcp_servers"]["rms-tools"]
    assert codex["command"] == entry["command"] and codex["args"] == entry["args"]
    assert codex["startup_timeout_sec"] > 0 and codex["tool_timeout_sec"] > 0
    assert (ws.root / ".claude/skills/rms-tools/SKILL.md").is_file()
    assert (ws.root / ".agents/skills/rms-tools/SKILL.md").is_file()
    # The projected stdio command starts the server, as a client would.
    params = StdioServerParameters(
        command=entry["command"], args=entry["args"], cwd=entry["cwd"], env=entry.get("env")
    )
    with anyio.fail_after(60):
        async with Client(params, mode="legacy") as stdio:
            names = {t.name for t in (await stdio.list_tools()).tools}
            answer = await stdio.call_tool("config_summary", {})
    assert names == {"overview", "config_summary"}
    assert answer.structured_content["knobs"] == ["num_stages", "num_warps", "rows_per_program"]
    telemetry = ws.telemetry_path.read_text()
    assert '"tool":"self_test_server"' in telemetry and '"server":"rms-tools"' in telemetry


DIRTY = "DATA = '{ws}/kernel_config.json'\n\n\nasync def f() -> dict:\n    return {}\n"
# A custom tool's print() no longer breaks the protocol (it runs in a sandboxed worker whose
# stdout is the server's stderr; tests/tools/meta/test_qualification.py checks that), so there is
# no "stdout-noise" variant of a generated server any more.
VARIANTS: dict[str, tuple[str, dict[str, Any], str, str]] = {
    # name: (fix.py source, tool options, failed check, text in the reason)
    "syntax-error": ("async def f(:\n    return {}\n", {}, "syntax", "fix.py line 1"),
    "tool-raises": (
        "async def f() -> dict:\n    raise RuntimeError('probe exploded')\n",
        {},
        "tool:f",
        "RuntimeError: probe exploded",
    ),
    "hanging-tool": (
        "import anyio\n\n\nasync def f() -> dict:\n    await anyio.sleep(3600)\n    return {}\n",
        {"timeout_s": 2},
        "tool:f",
        "timed out",
    ),
    "missing-self-test": (
        "async def f() -> dict:\n    return {}\n",
        {},
        "self_test",
        "no self_test",
    ),
    "dirty-path": (DIRTY, {}, "portable_paths", "fix.py:1"),
    "lenient-verifier": (
        "async def f() -> dict:\n    return {'verdict': 'passed'}\n",
        {"verifier": True},
        "verifier:f",
        "ACCEPTED the cheating kernel 'clone'",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_a_broken_server_is_quarantined_with_the_precise_reason(
    ws: Workspace, settings: Settings, variant: str
) -> None:
    source, options, check, reason = VARIANTS[variant]
    tools, files = one_tool(source.replace("{ws}", str(ws.root)), **options)
    async with Client(build_meta_server(ws, settings)) as client:
        made = await call(
            client,
            "generate_server",
            {
                "name": variant,
                "description": f"A deliberately broken server: {variant}.",
                "tools": tools,
                "custom_files": files,
            },
        )
        assert not made.is_error, made.content
        if variant == "missing-self-test":
            manifest = ws.root / f".harnesslab/mcp/{variant}/manifest.json"
            data = json.loads(manifest.read_text())
            del data["self_test"]
            manifest.write_text(json.dumps(data))
        qual = await call(client, "self_test_server", {"name": variant, "timeout_s": 60})
        out = qual.structured_content
        assert not out["qualified"]
        assert out["status"] == "quarantined"
        assert check in out["failed"], out["reason"]
        assert reason in out["reason"], out["reason"]
        refused = await call(client, "register_server", {"name": variant})
        assert refused.is_error and "failed qualification" in refused.content[0].text
        listed = await call(client, "list_servers", {})
    record = {s["name"]: s for s in listed.structured_content["servers"]}[variant]
    assert record["status"] == "quarantined" and reason in record["reason"]
    report = (ws.root / out["failure_report"]).read_text()
    assert f"## {check}" in report and "Evidence:" in report
    assert not (ws.root / ".mcp.json").exists()


async def test_bad_specs_fail_clearly_and_write_nothing(ws: Workspace, settings: Settings) -> None:
    cases = [
        ({"name": "Bad_Name", "tools": GOOD_TOOLS[:1]}, "server name 'Bad_Name'"),
        ({"name": "ok", "tools": [{"builtin": "run_everything"}]}, "unknown built-in"),
        (
            {"name": "ok", "tools": [{"custom": {"function": "nope", "file": "diag.py"}}]},
            "no function 'nope'",
        ),
        (
            {"name": "ok", "tools": [{"builtin": "run_objective", "presets": {"repeats": 0}}]},
            "repeats",
        ),
        (
            {"name": "ok", "tools": [{"builtin": "inspect_context", "presets": {"bogus": 1}}]},
            "bogus",
        ),
    ]
    async with Client(build_meta_server(ws, settings)) as client:
        for args, text in cases:
            res = await call(
                client,
                "generate_server",
                {"description": "a spec with a mistake in it", "custom_files": {"diag.py": DIAG}}
                | args,
            )
            assert res.is_error and text in res.content[0].text, (args, res.content)
        for tool in ("self_test_server", "register_server"):
            res = await call(client, tool, {"name": "ghost"})
            assert res.is_error and "ghost" in res.content[0].text
    assert not (ws.root / ".harnesslab/mcp").exists()


async def test_harnesslab_meta_serves_the_five_tools_over_stdio(
    ws: Workspace, tmp_path: Path
) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "harnesslab.servers", "meta", "--workspace", str(ws.root)],
        env={"HARNESSLAB_STATE_DIR": str(tmp_path / "state")},
    )
    with anyio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            listed = await client.call_tool("list_servers", {})
    assert names == META_TOOLS
    assert listed.structured_content == {"servers": [], "next_step": "generate_server to build one"}
