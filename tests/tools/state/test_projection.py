"""Projection of servers and skills into Claude Code's and Codex's own formats."""

from __future__ import annotations

import json
import tomllib

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.state.projection import (
    ServerEntry,
    project_server,
    project_skill,
    remove_skill,
    render_codex_toml,
    toml_string,
    unproject_server,
    write_codex_toml,
    write_mcp_json,
)

ENTRY = ServerEntry(
    name="rmsnorm-lab",
    command="/venv/bin/harnesslab",
    args=["serve", "--workspace", "/w s/ws"],
    env={"HARNESSLAB_GPU_HOST": "me@h100"},
)

OTHER_CODEX = """# my own settings, kept byte for byte
model = "o4"

[mcp_servers.other]
command = "other-server"
args = ["--flag"]

[mcp_servers.rmsnorm-lab]
command = "stale"

[mcp_servers.rmsnorm-lab.env]
OLD = "1"

[profiles.fast]
model = "mini"
"""


def test_mcp_json_merge_keeps_other_servers_and_keys(tmp_path):
    (tmp_path / ".mcp.json").write_text(
        json.dumps({"mcpServers": {"other": {"command": "x"}}, "extra": 1})
    )
    write_mcp_json(tmp_path, ENTRY)
    data = json.loads((tmp_path / ".mcp.json").read_text())
    assert data["extra"] == 1 and data["mcpServers"]["other"] == {"command": "x"}
    assert data["mcpServers"]["rmsnorm-lab"] == {
        "command": "/venv/bin/harnesslab",
        "args": ["serve", "--workspace", "/w s/ws"],
        "env": {"HARNESSLAB_GPU_HOST": "me@h100"},
    }


def test_codex_merge_replaces_only_its_own_table_and_keeps_comments(tmp_path):
    path = tmp_path / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(OTHER_CODEX)
    write_codex_toml(tmp_path, ENTRY)
    text = path.read_text()
    data = tomllib.loads(text)
    assert text.startswith('# my own settings, kept byte for byte\nmodel = "o4"\n')
    assert data["mcp_servers"]["other"] == {"command": "other-server", "args": ["--flag"]}
    assert data["profiles"]["fast"] == {"model": "mini"}
    mine = data["mcp_servers"]["rmsnorm-lab"]
    assert mine["command"] == "/venv/bin/harnesslab" and "OLD" not in mine["env"]
    assert mine["startup_timeout_sec"] > 0 and mine["tool_timeout_sec"] > 0
    write_codex_toml(tmp_path, ENTRY)  # idempotent: writing twice gives the same file
    assert path.read_text() == text


def test_remove_takes_the_entry_out_of_both_clients(tmp_path):
    project_server(tmp_path, ENTRY, ("claude", "codex"))
    assert sorted(unproject_server(tmp_path, "rmsnorm-lab")) == ["claude", "codex"]
    assert json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"] == {}
    assert "rmsnorm-lab" not in tomllib.loads((tmp_path / ".codex" / "config.toml").read_text())
    assert unproject_server(tmp_path, "rmsnorm-lab") == []


def test_an_http_entry_names_the_token_variable_not_the_token(tmp_path):
    entry = ServerEntry(name="shared", url="http://gpu:8765/mcp", token_env_var="HL_TOKEN")
    write_mcp_json(tmp_path, entry)
    claude = json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]["shared"]
    assert claude == {
        "type": "http",
        "url": "http://gpu:8765/mcp",
        "headers": {"Authorization": "Bearer ${HL_TOKEN}"},
    }
    codex = tomllib.loads(render_codex_toml(entry))["mcp_servers"]["shared"]
    assert codex["url"] == "http://gpu:8765/mcp" and codex["bearer_token_env_var"] == "HL_TOKEN"


@pytest.mark.parametrize("value", ['a"b', "back\\slash", "tab\tnew\nline", "\x00\x7f", "é ✓ 🚀"])
def test_toml_strings_round_trip_any_text(value):
    assert tomllib.loads(f"k = {toml_string(value)}")["k"] == value


@pytest.mark.parametrize("name", ["../x", "a b", "a;rm", "", "x" * 65, ".hidden"])
def test_unsafe_names_are_refused(tmp_path, name):
    with pytest.raises(UsageError):
        write_mcp_json(tmp_path, ServerEntry(name=name, command="x"))
    assert not (tmp_path / ".mcp.json").exists()


def test_broken_client_files_are_never_overwritten(tmp_path):
    (tmp_path / ".mcp.json").write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        write_mcp_json(tmp_path, ENTRY)
    assert (tmp_path / ".mcp.json").read_text() == "{not json"
    codex = tmp_path / ".codex" / "config.toml"
    codex.parent.mkdir()
    codex.write_text("[broken\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        write_codex_toml(tmp_path, ENTRY)
    assert codex.read_text() == "[broken\n"


def test_an_inline_definition_is_refused_rather_than_duplicated(tmp_path):
    codex = tmp_path / ".codex" / "config.toml"
    codex.parent.mkdir()
    codex.write_text('mcp_servers = { rmsnorm-lab = { command = "x" } }\n')
    with pytest.raises(UsageError, match="inline table or dotted keys"):
        write_codex_toml(tmp_path, ENTRY)


def test_skills_are_copied_to_both_clients_and_replaced_whole(tmp_path):
    skill = tmp_path / "src" / "kernel-tips"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: kernel-tips\n---\nUse the sweep.\n")
    (skill / "old.txt").write_text("old")
    ws = tmp_path / "ws"
    paths = project_skill(ws, skill)
    assert [p.relative_to(ws).as_posix() for p in paths] == [
        ".claude/skills/kernel-tips",
        ".agents/skills/kernel-tips",
    ]
    (skill / "old.txt").unlink()
    project_skill(ws, skill)
    for p in paths:
        assert (p / "SKILL.md").is_file() and not (p / "old.txt").exists()
    assert not [p for p in (ws / ".claude" / "skills").iterdir() if p.name.startswith(".")]
    assert len(remove_skill(ws, "kernel-tips")) == 2


def test_a_folder_without_skill_md_is_not_a_skill(tmp_path):
    (tmp_path / "nope").mkdir()
    with pytest.raises(UsageError, match="SKILL.md"):
        project_skill(tmp_path / "ws", tmp_path / "nope")
