"""What Claude Code and Codex need besides the server entry (approval, trust), read and written
without the clients (tests/servers/test_clients.py runs the real ones)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.meta.client_setup import approve, client_status, folder_key
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.projection import ServerEntry, write_codex_toml, write_mcp_json


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path / "state",
        claude_config_dir=tmp_path / "claude-home",
        codex_home=tmp_path / "codex-home",
    )


def entry(command: str = sys.executable) -> ServerEntry:
    return ServerEntry(name="harnesslab", command=command, args=["serve"])


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_a_written_entry_is_ready_only_once_approved(tmp_path, settings, client):
    ws = tmp_path / "ws"
    ws.mkdir()
    (write_mcp_json if client == "claude" else write_codex_toml)(ws, entry())
    before = client_status(client, ws, "harnesslab", settings)
    assert before.configured and before.launchable and not before.trusted
    assert not before.ready
    assert before.fix.startswith(f"harnesslab config {client} -w {ws} --write --approve")
    written = approve(client, ws, "harnesslab", settings)
    assert all(p.is_file() for p in written)
    after = client_status(client, ws, "harnesslab", settings)
    assert after.ready and after.approved and after.trusted, after.missing


def test_a_moved_virtualenv_makes_the_entry_unlaunchable_and_says_so(tmp_path, settings):
    ws = tmp_path / "ws"
    ws.mkdir()
    write_mcp_json(ws, entry(str(tmp_path / "gone" / "bin" / "harnesslab")))
    approve("claude", ws, "harnesslab", settings)
    st = client_status("claude", ws, "harnesslab", settings)
    assert st.configured and not st.launchable and not st.ready
    assert "does not exist" in st.missing[0]


def test_a_rejected_server_is_not_approved_until_approve_says_so(tmp_path, settings):
    ws = tmp_path / "ws"
    (ws / ".claude").mkdir(parents=True)
    write_mcp_json(ws, entry())
    (ws / ".claude" / "settings.local.json").write_text(
        json.dumps(
            {"enabledMcpjsonServers": ["harnesslab"], "disabledMcpjsonServers": ["harnesslab"]}
        )
    )
    assert not client_status("claude", ws, "harnesslab", settings).approved
    approve("claude", ws, "harnesslab", settings)
    local = json.loads((ws / ".claude" / "settings.local.json").read_text())
    assert local == {"enabledMcpjsonServers": ["harnesslab"], "disabledMcpjsonServers": []}
    assert client_status("claude", ws, "harnesslab", settings).approved


def test_trust_of_a_folder_above_the_workspace_counts(tmp_path, settings):
    ws = tmp_path / "repo" / "ws"
    ws.mkdir(parents=True)
    write_codex_toml(ws, entry())
    approve("codex", tmp_path / "repo", "harnesslab", settings)
    assert client_status("codex", ws, "harnesslab", settings).trusted


def test_an_unparsable_client_file_is_left_alone(tmp_path, settings):
    ws = tmp_path / "ws"
    ws.mkdir()
    broken = settings.claude_global_config()
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    with pytest.raises(UsageError) as err:
        approve("claude", ws, "harnesslab", settings)
    assert "not overwriting it" in err.value.message
    assert broken.read_text() == "{not json"
    codex = settings.codex_config()
    codex.parent.mkdir(parents=True)
    codex.write_text("model = \n")
    with pytest.raises(UsageError):
        approve("codex", ws, "harnesslab", settings)
    assert codex.read_text() == "model = \n"


def test_trust_records_name_the_resolved_folder(tmp_path, settings):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert folder_key(link) == str(real)
    approve("codex", link, "harnesslab", settings)
    assert f'[projects."{real}"]' in settings.codex_config().read_text()
