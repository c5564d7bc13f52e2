"""The client files harnesslab owns: what it wrote is recorded in the trusted store, everything
else in .mcp.json, .claude/settings*.json, .codex/ and the skill folders is reported (by the
audit, `doctor` and `serve`) and `config --prune` takes it out, keeping the toolkit's entries."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from harnesslab.servers.cli import main as cli_main
from harnesslab.tests.conftest_shared import make_workspace
from harnesslab.tests.trust.planted import PLANTED, plant
from harnesslab.tools.doctor import run_doctor
from harnesslab.tools.meta.client_audit import audit_workspace, prune, prune_command
from harnesslab.tools.meta.client_setup import approve, client_status
from harnesslab.tools.meta.skills import project_skills
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.owned_config import OwnedConfig
from harnesslab.tools.state.projection import ServerEntry, write_codex_toml, write_mcp_json
from harnesslab.tools.state.workspace import Workspace

# The kind of finding and the file each planted kind is reported in.
EXPECTED = {
    "mcp server": ("server", ".mcp.json"),
    "claude hook": ("hook", ".claude/settings.local.json"),
    "claude approval": ("approval", ".claude/settings.local.json"),
    "codex server": ("server", ".codex/config.toml"),
    "codex hook": ("hook", ".codex/hooks.json"),
    "skill": ("skill", ".claude/skills/kernel-helper"),
}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path / "state",
        claude_config_dir=tmp_path / "claude-home",
        codex_home=tmp_path / "codex-home",
    )


@pytest.fixture
def ws(tmp_path: Path, settings: Settings) -> Workspace:
    return make_workspace(tmp_path)


def configure(ws: Workspace, settings: Settings) -> None:
    """What `harnesslab config claude|codex --write --approve` writes, recorded."""
    owned = OwnedConfig.of(settings, ws.root)
    entry = ServerEntry(name="harnesslab", command=sys.executable, args=["serve"])
    write_mcp_json(ws.root, entry, owned=owned)
    write_codex_toml(ws.root, entry, owned=owned)
    project_skills(ws.root, owned=owned)
    for client in ("claude", "codex"):
        approve(client, ws.root, "harnesslab", settings)  # type: ignore[arg-type]


def test_what_the_toolkit_wrote_is_not_reported(ws: Workspace, settings: Settings) -> None:
    configure(ws, settings)
    assert audit_workspace(ws.root, settings) == []


def test_each_planted_kind_is_reported_and_prune_takes_out_only_it(
    ws: Workspace, settings: Settings
) -> None:
    configure(ws, settings)
    assert sorted(plant(ws.root)) == sorted(PLANTED)
    found = audit_workspace(ws.root, settings)
    got = {(f.kind, f.file) for f in found}
    for kind, where in EXPECTED.items():
        assert where in got, f"{kind} not reported: {[f.line() for f in found]}"
    assert any("env > /tmp/hl-planted" in f.detail for f in found if f.kind == "hook")
    removed = prune(ws.root, settings)
    assert {(f.kind, f.file) for f in removed} == got
    assert audit_workspace(ws.root, settings) == []
    for client in ("claude", "codex"):  # the toolkit's own entries are still there and approved
        assert client_status(client, ws.root, "harnesslab", settings).ready  # type: ignore[arg-type]
    assert "kernel-helper" not in (ws.root / ".mcp.json").read_text()
    assert not (ws.root / ".claude/skills/kernel-helper").exists()
    assert (ws.root / ".claude/skills/kernel-optimization/SKILL.md").is_file()


def test_an_entry_changed_after_the_toolkit_wrote_it_is_reported(
    ws: Workspace, settings: Settings
) -> None:
    configure(ws, settings)
    data = json.loads((ws.root / ".mcp.json").read_text())
    data["mcpServers"]["harnesslab"]["command"] = "/bin/sh"
    (ws.root / ".mcp.json").write_text(json.dumps(data))
    (ws.root / ".claude/skills/kernel-optimization/SKILL.md").write_text("# rewritten\n")
    lines = [f.line() for f in audit_workspace(ws.root, settings)]
    assert any("mcpServers.harnesslab: changed since harnesslab wrote it" in x for x in lines)
    assert any(".claude/skills/kernel-optimization: changed since written" in x for x in lines)


def test_a_symlinked_client_folder_is_reported_and_pruned_without_following_it(
    ws: Workspace, settings: Settings, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "settings.json").parent.mkdir(parents=True)
    (elsewhere / "settings.json").write_text('{"hooks": {}}')
    (ws.root / ".claude").symlink_to(elsewhere)
    found = audit_workspace(ws.root, settings)
    assert [(f.kind, f.file) for f in found] == [("file", ".claude")]
    prune(ws.root, settings)
    assert not (ws.root / ".claude").exists() and (elsewhere / "settings.json").is_file()


def test_doctor_reports_each_planted_kind_with_the_command_that_removes_it(
    ws: Workspace, settings: Settings
) -> None:
    configure(ws, settings)
    plant(ws.root)
    report = anyio.run(lambda: run_doctor(ws.root, settings, clients=(), executor=False))
    assert not report.ok
    foreign = [c for c in report.checks if c.status == "foreign"]
    details = "\n".join(c.detail for c in foreign)
    for kind, (finding, where) in EXPECTED.items():
        assert f"{finding} in {where}" in details, f"doctor did not report the {kind}"
    assert {c.fix for c in foreign} == {prune_command(ws.root)}


def test_config_prune_removes_what_doctor_reports(
    ws: Workspace, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    configure(ws, settings)
    plant(ws.root)
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(settings.state_dir))
    assert cli_main(["config", "--prune", "-w", str(ws.root)]) == 0
    out = capsys.readouterr().out
    assert "removed server in .mcp.json mcpServers.kernel-helper" in out
    assert audit_workspace(ws.root, settings) == []


def test_config_write_warns_about_what_harnesslab_did_not_write(
    ws: Workspace, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    plant(ws.root)
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("HARNESSLAB_CLAUDE_CONFIG_DIR", str(settings.claude_config_dir))
    assert cli_main(["config", "claude", "-w", str(ws.root), "--write"]) == 0
    err = capsys.readouterr().err
    assert (
        "not written by harnesslab: hook in .claude/settings.local.json hooks.SessionStart" in err
    )
    assert f"remove them with: harnesslab config --prune -w {ws.root}" in err
    assert "harnesslab" in json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]
    kinds = {f.file for f in audit_workspace(ws.root, settings)}
    assert ".mcp.json" in kinds  # the planted server, not the entry config just wrote
    assert all("mcpServers.harnesslab" != f.key for f in audit_workspace(ws.root, settings))
