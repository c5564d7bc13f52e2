"""registry: statuses, what may be projected, and that quarantine takes everything back.
Qualification reports are written by hand here (tests/tools/meta/test_qualification.py makes real ones)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import make_workspace
from harnesslab.tools.errors import UsageError
from harnesslab.tools.meta import registry
from harnesslab.tools.meta.genserver import generate
from harnesslab.tools.meta.qualification import QualificationReport, snapshot_bundle
from harnesslab.tools.meta.qualify_checks import Check
from harnesslab.tools.state.workspace import Workspace

SPEC = {
    "name": "rms-tools",
    "description": "An overview preset for the rmsnorm_gate task.",
    "tools": [{"builtin": "inspect_context", "name": "overview", "timeout_s": 45}],
}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    ws = make_workspace(tmp_path)
    generate(ws, SPEC)
    registry.record_generated(ws, "rms-tools", ["overview"])
    return ws


def write_report(ws: Workspace, *, passed: bool) -> QualificationReport:
    """What qualify_workspace_server records, without running the clean room: the report and
    the snapshot of the bundle it judged, in the trusted store."""
    sdir = ws.root / ".harnesslab/mcp/rms-tools"
    snapshot = Path(tempfile.mkdtemp(dir=ws.store.root))
    _, digest = snapshot_bundle(ws, "rms-tools", snapshot)
    checks = [Check(name="startup", passed=True, evidence="ok")]
    if not passed:
        checks.append(Check(name="tool:overview", passed=False, evidence="boom\nmore"))
    report = QualificationReport(
        server="rms-tools",
        server_dir=str(sdir),
        passed=passed,
        checks=checks,
        tools=["overview"],
        duration_s=1.0,
        bundle_hash=digest,
        qualified_at=time.time(),
        report_path=str(sdir / "qualification.json"),
        failure_report_path="" if passed else str(sdir / "failure_report.md"),
    )
    registry.record_qualification(ws, report, snapshot=snapshot if passed else None)
    return report


def status(ws: Workspace) -> str:
    return registry.load_registry(ws).servers["rms-tools"].status


def test_a_generated_server_cannot_be_registered_before_it_qualifies(ws: Workspace) -> None:
    assert status(ws) == "generated"
    with pytest.raises(UsageError, match="has not been qualified"):
        registry.register(ws, "rms-tools")
    assert not (ws.root / ".mcp.json").exists()


def test_a_failed_qualification_quarantines_with_the_failed_checks_as_reason(ws: Workspace) -> None:
    write_report(ws, passed=False)
    rec = registry.load_registry(ws).servers["rms-tools"]
    assert rec.status == "quarantined"
    assert rec.reason == "tool:overview: boom"
    assert rec.failure_report == ".harnesslab/mcp/rms-tools/failure_report.md"
    with pytest.raises(UsageError, match="failed qualification: tool:overview: boom"):
        registry.register(ws, "rms-tools")


def test_registration_projects_configs_with_timeouts_and_the_skill(ws: Workspace) -> None:
    write_report(ws, passed=True)
    assert status(ws) == "qualified"
    rec = registry.register(ws, "rms-tools", env={"HARNESSLAB_STATE_DIR": "/state"})
    assert rec.status == "registered"
    entry = json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]["rms-tools"]
    # the toolkit's launcher for the qualified bundle, never the manifest's command
    assert entry["command"] == sys.executable
    assert entry["args"] == [
        "-m",
        "harnesslab.servers",
        "serve-generated",
        "rms-tools",
        "-w",
        str(ws.root),
    ]
    assert entry["cwd"] == str(ws.root)
    assert entry["env"] == {"HARNESSLAB_STATE_DIR": "/state"}
    codex = tomllib.loads((ws.root / ".codex/config.toml").read_text())["mcp_servers"]["rms-tools"]
    assert codex["startup_timeout_sec"] == 30 and codex["tool_timeout_sec"] == 45
    for rel in (".claude/skills/rms-tools/SKILL.md", ".agents/skills/rms-tools/SKILL.md"):
        assert (ws.root / rel).is_file()
    assert set(rec.projected) >= {".mcp.json", ".codex/config.toml", ".claude/skills/rms-tools"}


def test_a_server_changed_since_it_qualified_is_not_registered(ws: Workspace) -> None:
    write_report(ws, passed=True)
    server_py = ws.root / ".harnesslab/mcp/rms-tools/server.py"
    server_py.write_text(server_py.read_text() + "\n# edited after qualification\n")
    with pytest.raises(UsageError, match="changed since it qualified"):
        registry.register(ws, "rms-tools")


def test_quarantine_removes_every_projection_and_keeps_other_entries(ws: Workspace) -> None:
    (ws.root / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    write_report(ws, passed=True)
    registry.register(ws, "rms-tools")
    rec = registry.quarantine(ws, "rms-tools", "answers garbage")
    assert rec.status == "quarantined" and rec.reason == "answers garbage"
    assert json.loads((ws.root / ".mcp.json").read_text())["mcpServers"] == {
        "other": {"command": "x"}
    }
    assert "rms-tools" not in tomllib.loads((ws.root / ".codex/config.toml").read_text()).get(
        "mcp_servers", {}
    )
    assert not (ws.root / ".claude/skills/rms-tools").exists()
    assert not (ws.root / ".agents/skills/rms-tools").exists()


def test_regenerating_a_registered_server_withdraws_it(ws: Workspace) -> None:
    write_report(ws, passed=True)
    registry.register(ws, "rms-tools")
    rec = registry.record_generated(ws, "rms-tools", ["overview"])
    assert rec.status == "generated" and rec.projected == []
    assert "rms-tools" not in json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]


def test_requalifying_a_registered_server_with_the_same_files_keeps_it_registered(
    ws: Workspace,
) -> None:
    write_report(ws, passed=True)
    registry.register(ws, "rms-tools")
    write_report(ws, passed=True)
    assert status(ws) == "registered"


def test_list_servers_shows_folders_the_registry_does_not_know(ws: Workspace) -> None:
    (ws.root / ".harnesslab/mcp/hand-made").mkdir()
    names = {r.name: r.status for r in registry.list_servers(ws)}
    assert names == {"hand-made": "generated", "rms-tools": "generated"}


def test_a_damaged_registry_says_how_to_recover(ws: Workspace) -> None:
    registry.registry_path(ws).write_text("{not json")
    with pytest.raises(UsageError, match="damaged") as err:
        registry.load_registry(ws)
    assert "delete it" in err.value.next_step


def test_quarantining_an_unknown_server_fails_clearly(ws: Workspace) -> None:
    with pytest.raises(UsageError, match="no server 'ghost'"):
        registry.quarantine(ws, "ghost", "why")
    with pytest.raises(UsageError, match="not a server name"):
        registry.quarantine(ws, "../etc", "why")
