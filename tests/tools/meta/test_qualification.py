"""qualification: the clean room, the reports, bounded runs of servers that hang, verdicts, a
server brought from outside through `harnesslab qualify`, and a real guarded verifier.

The meta-server tests (tests/servers/test_meta_server.py) cover the broken variants end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from harnesslab.servers.cli import main as cli_main
from harnesslab.tests.conftest_shared import make_settings, make_workspace
from harnesslab.tests.tools.integrity.hostile_tool import FILE as HOSTILE_FILE
from harnesslab.tests.tools.integrity.hostile_tool import SPEC_TOOL, HostileTool
from harnesslab.tools.meta import gentemplates, registry
from harnesslab.tools.meta.cleanroom import make_clean_room
from harnesslab.tools.meta.genserver import generate
from harnesslab.tools.meta.qualification import (
    QualificationReport,
    qualify,
    qualify_workspace_server,
)
from harnesslab.tools.meta.qualify_checks import path_check, verdict_of
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import Workspace

OK_TOOL = "async def f(flag: bool = False) -> dict:\n    return {'flag': flag}\n"
# print() in a custom tool reaches the server's stderr, never the protocol on its stdout.
NOISY_TOOL = "print('loaded')\n\n\nasync def f(flag: bool = False) -> dict:\n    print('called')\n    return {'flag': flag}\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


def make(ws: Workspace, name: str, source: str, **spec: Any) -> Path:
    tool = {"custom": {"function": "f", "file": "fix.py"}, "probe_args": {"flag": True}}
    tool.update(spec.pop("tool", {}))
    generate(
        ws,
        {"name": name, "description": f"Test server {name}.", "tools": [tool], **spec},
        {"fix.py": source},
    )
    return ws.root / ".harnesslab/mcp" / name


def by_name(report: QualificationReport) -> dict[str, Any]:
    return {c.name: c for c in report.checks}


def test_the_clean_room_holds_the_template_and_the_bundle_only(
    ws: Workspace, tmp_path: Path, settings: Settings
) -> None:
    sdir = make(ws, "clean", OK_TOOL)
    state = ws.root / ".harnesslab"
    (state / "history.jsonl").write_text("{}\n")
    (state / "checkpoints/abc").mkdir(parents=True)
    (state / "mcp/other").mkdir()
    (ws.root / "kernel.py").write_text("# the agent's dirty edit\n")
    (sdir / "__pycache__").mkdir()
    (sdir / "qualification.json").write_text("{}")
    bundle = {".harnesslab/mcp/clean": sdir, ".harnesslab/skills/clean": state / "skills/clean"}
    room = make_clean_room("rmsnorm_gate", tmp_path / "room", bundle, settings)
    assert sorted(p.name for p in (room / ".harnesslab").iterdir()) == [
        "mcp",
        "skills",
        "task.json",
    ]
    assert [p.name for p in (room / ".harnesslab/mcp").iterdir()] == ["clean"]
    assert sorted(p.name for p in (room / ".harnesslab/mcp/clean").iterdir()) == [
        "README.md",
        "fix.py",
        "manifest.json",
        "server.py",
        "tests",
    ]
    assert "the agent's dirty edit" not in (room / "kernel.py").read_text()


@pytest.mark.anyio
async def test_a_passing_run_writes_its_report_and_clears_an_old_failure_report(
    ws: Workspace, settings: Settings
) -> None:
    sdir = make(ws, "fine", NOISY_TOOL)
    (sdir / "failure_report.md").write_text("stale")
    with anyio.fail_after(90):
        report = await qualify_workspace_server(ws, "fine", settings, timeout_s=60)
    assert report.passed, report.reason()
    names = [c.name for c in report.checks]
    assert names[:5] == ["manifest", "syntax", "portable_paths", "skill", "toolkit_server"]
    assert {
        "startup",
        "tools_list",
        "tool:f",
        "stdout_protocol_only",
        "self_test",
        "own_tests",
        "sandbox",
    } <= set(names)
    sandbox = by_name(report)["sandbox"].evidence
    assert all(f"{lane}: full" in sandbox for lane in ("custom tools", "self-test", "own tests"))
    saved = QualificationReport.model_validate_json((sdir / "qualification.json").read_text())
    assert saved.passed and saved.bundle_hash == report.bundle_hash
    assert not (sdir / "failure_report.md").exists()
    assert not list(Path(report.server_dir).glob("harnesslab-qualify-*"))


@pytest.mark.anyio
async def test_a_tool_that_blocks_the_event_loop_cannot_hang_qualification(
    ws: Workspace, settings: Settings
) -> None:
    blocking = "import time\n\n\nasync def f(flag: bool = False) -> dict:\n    time.sleep(600)\n    return {}\n"
    make(ws, "blocker", blocking, tool={"timeout_s": 1})
    started = time.monotonic()
    with anyio.fail_after(60):
        report = await qualify_workspace_server(ws, "blocker", settings, timeout_s=20)
    assert time.monotonic() - started < 35
    checks = by_name(report)
    assert not report.passed
    assert "timed out" in checks["tool:f"].evidence
    assert not checks["self_test"].passed and not checks["own_tests"].passed
    await anyio.sleep(0.5)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert ".harnesslab/mcp/blocker/server.py" not in ps


@pytest.mark.anyio
async def test_a_server_that_hangs_on_start_fails_startup_within_its_timeout(
    ws: Workspace, settings: Settings
) -> None:
    # The budget is generous: the startup check's 2 s decides here, and a loaded machine does
    # not run the budget out before the server has started. The other lanes are no part of what
    # is asserted (that every lane is bounded by the budget is the blocker test's), so they end
    # early: the custom tools' sandboxed worker hangs at import in every lane, the self-test
    # waits out its tool's 1 s, and the server has no tests folder (the own tests check fails at
    # once instead of waiting out the worker's start twice).
    hang = "import time\n\ntime.sleep(600)\n\n\n"
    sdir = make(ws, "sleeper", hang + OK_TOOL, startup_timeout_s=2, tool={"timeout_s": 1})
    shutil.rmtree(sdir / "tests")
    with anyio.fail_after(60):
        report = await qualify_workspace_server(ws, "sleeper", settings, timeout_s=40)
    checks = by_name(report)
    assert "no answer to initialize within 2s" in checks["startup"].evidence
    assert checks["tools_list"].evidence.startswith("not run: startup failed first")
    assert report.reason().startswith("startup: ")


@pytest.mark.parametrize(
    ("reply", "accepted"),
    [
        ({"structured": {"verdict": "passed"}}, True),
        ({"structured": {"verdict": "rejected"}}, False),
        ({"structured": {"result": {"passed": True}}}, True),
        ({"structured": None, "text": '{"status": "error"}'}, False),
        ({"is_error": True, "text": "rejected"}, False),
        ({"timed_out": True}, None),
        ({"structured": {"score": 3}}, None),
        (None, None),
    ],
)
def test_verdicts_are_read_from_structured_or_json_results(
    reply: dict[str, Any] | None, accepted: bool | None
) -> None:
    assert verdict_of(reply) is accepted


def test_the_path_check_names_file_and_line_and_ignores_lookalike_folders(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(f"OTHER = '{root}2/x'\n")
    bad.write_text(f"import os\nDATA = '{root}/kernel.py'\n")
    assert path_check([("good.py", good)], [root]).passed
    check = path_check([("good.py", good), ("bad.py", bad)], [root])
    assert not check.passed and check.evidence.startswith("bad.py:2: DATA =")


BROUGHT_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer

server = MCPServer("brought")


@server.tool()
async def echo(text: str) -> dict[str, str]:
    """Echo the text back."""
    return {"text": text}


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        sys.exit(0)
    server.run()
'''
BROUGHT_TEST = """
import importlib.util
from pathlib import Path

import pytest
from mcp import Client


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_echo():
    spec = importlib.util.spec_from_file_location("srv", Path(__file__).parents[1] / "server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with Client(module.server) as client:
        assert (await client.call_tool("echo", {"text": "x"})).structured_content == {"text": "x"}
"""


def brought_server(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "server.py").write_text(BROUGHT_SERVER)
    (folder / "tests/test_echo.py").write_text(BROUGHT_TEST)
    manifest = {
        "name": "brought",
        "command": sys.executable,
        "args": ["{server_dir}/server.py"],
        "tools": [{"name": "echo", "probe_args": {"text": "hi"}, "timeout_s": 10}],
        "self_test": {"args": ["{server_dir}/server.py", "--self-test"], "timeout_s": 30},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run_cli(*args: str, env_state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harnesslab.servers", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HARNESSLAB_STATE_DIR": str(env_state), "PATH": "/usr/bin:/bin"},
    )


def test_harnesslab_qualify_passes_a_brought_server_and_fails_a_broken_one(
    ws: Workspace, tmp_path: Path
) -> None:
    good = brought_server(tmp_path / "brought-good")
    res = run_cli("qualify", str(good), "--workspace", str(ws.root), "--json", env_state=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["passed"] and "tool:echo" in {c["name"] for c in report["checks"]}
    assert "skill" in {c["name"] for c in report["checks"]}
    broken = brought_server(tmp_path / "brought-broken")
    manifest = json.loads((broken / "manifest.json").read_text())
    (broken / "manifest.json").write_text(json.dumps(manifest | {"command": "/no/such/python"}))
    res = run_cli("qualify", str(broken), "--workspace", str(ws.root), env_state=tmp_path)
    assert res.returncode == 1
    assert "FAIL startup" in res.stdout and "could not start '/no/such/python'" in res.stdout
    missing = run_cli("qualify", str(tmp_path), "--workspace", str(ws.root), env_state=tmp_path)
    assert missing.returncode == 2 and "no manifest.json" in missing.stderr


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_guarded_verifier_accepts_the_baseline_and_rejects_cheating_kernels(
    ws: Workspace, settings: Settings
) -> None:
    generate(
        ws,
        {
            "name": "final-check",
            "description": "The guarded verifier under another name.",
            "tools": [{"builtin": "guarded_final_verify", "name": "final_check"}],
        },
    )
    with anyio.fail_after(280):
        report = await qualify_workspace_server(ws, "final-check", settings, timeout_s=240)
    check = by_name(report)["verifier:final_check"]
    assert check.passed, report.reason()
    assert "accepted the honest baseline; rejected" in check.evidence and "clone" in check.evidence
    assert report.passed, report.reason()


@pytest.mark.anyio
async def test_a_missing_manifest_is_one_failed_check_not_an_exception(
    tmp_path: Path, settings: Settings
) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    report = await qualify(folder, "rmsnorm_gate", None, 30, settings=settings)
    assert [(c.name, c.passed) for c in report.checks] == [("manifest", False)]
    assert (folder / "failure_report.md").read_text().startswith("# Server `empty` failed")
    assert textwrap.dedent(report.reason()).startswith("manifest: ")


def served(ws: Workspace, name: str, settings: Settings) -> StdioServerParameters:
    """How a client starts the registered server (the toolkit's serve-generated launcher)."""
    registry.register(ws, name, env=settings.to_env(), clients=("claude",))
    entry = json.loads((ws.root / ".mcp.json").read_text())["mcpServers"][name]
    return StdioServerParameters(
        command=entry["command"], args=entry["args"], cwd=entry["cwd"], env=entry.get("env")
    )


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_hostile_custom_tool_is_contained_in_qualification_and_when_registered(
    ws: Workspace, tmp_path: Path, settings: Settings
) -> None:
    """Every attempt fails, and nothing is left, in each lane of qualification (the session's
    server, its self-test, its own tests) and when served by serve-generated over stdio."""
    hostile = HostileTool(tmp_path, settings.state_dir)
    try:
        spec = {"name": "hostile", "description": "Tries to escape.", "tools": [SPEC_TOOL]}
        generate(ws, spec, {HOSTILE_FILE: hostile.source()})
        tests = ws.root / ".harnesslab/mcp/hostile/tests"
        (tests / "test_escape.py").write_text(hostile.test_file())  # the agent's own tests
        with anyio.fail_after(150):
            report = await qualify_workspace_server(ws, "hostile", settings, timeout_s=120)
        assert report.passed, report.reason()
        hostile.contained()
        with anyio.fail_after(60):
            async with Client(served(ws, "hostile", settings), mode="legacy") as stdio:
                answer = await stdio.call_tool("hostile", {})
        assert not answer.is_error, answer.content
        assert answer.structured_content == {"worked": []}
        assert (ws.root / ".harnesslab/out/hostile/hostile-ran.txt").is_file()
        hostile.contained(ws.root)
    finally:
        hostile.close()


EDIT = "\nPath({marker!r}).write_text('the edited server ran')\n"


@pytest.mark.anyio
async def test_an_edited_server_py_is_refused_by_qualification_and_by_serve_generated(
    ws: Workspace, tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    sdir = make(ws, "edited", OK_TOOL)
    with anyio.fail_after(90):
        report = await qualify_workspace_server(ws, "edited", settings, timeout_s=60)
    assert report.passed, report.reason()
    registry.register(ws, "edited", env=settings.to_env(), clients=("claude",))

    # A kept bundle whose server.py is not this toolkit's rendering (an older template, say):
    # serve-generated refuses to start it.
    monkeypatch.setattr(gentemplates, "SERVER_PY", gentemplates.SERVER_PY + "\n# newer\n")
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail(f"served an edited bundle: {a}"))
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(settings.state_dir))
    assert cli_main(["serve-generated", "edited", "-w", str(ws.root)]) == 2
    monkeypatch.undo()

    # The agent edits server.py in its workspace: qualification refuses it before running it.
    marker = tmp_path / "edited-server-ran"
    (sdir / "server.py").write_text(
        (sdir / "server.py").read_text() + EDIT.format(marker=str(marker))
    )
    with anyio.fail_after(90):
        report = await qualify_workspace_server(ws, "edited", settings, timeout_s=60)
    assert not report.passed
    check = by_name(report)["toolkit_server"]
    assert "server.py was edited; regenerate with generate_server" in check.evidence
    assert not marker.exists(), "qualification ran the edited server.py"
