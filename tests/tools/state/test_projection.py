"""Projection of servers and skills into Claude Code's and Codex's own formats."""

from __future__ import annotations

import json
import tomllib

import pytest
from pydantic import ValidationError

from harnesslab.tools.errors import UsageError
from harnesslab.tools.state.owned_config import OwnedConfig, tree_digest
from harnesslab.tools.state.projection import (
    ServerEntry,
    claude_entry,
    codex_entry,
    project_server,
    project_skill,
    read_toml_table,
    remove_codex_toml,
    remove_mcp_json,
    remove_skill,
    render_codex_toml,
    render_mcp_json,
    skill_digest,
    toml_key,
    toml_string,
    toml_value,
    unproject_server,
    write_codex_toml,
    write_mcp_json,
    write_toml_table,
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


def test_an_mcp_servers_key_that_is_no_table_is_refused_and_left_alone(tmp_path):
    """`mcp_servers = "x"` (or any non-table on the way to the entry): a usage error saying what
    to do, never a raw TOML or type error, and the file is left as it was; removing an entry
    from it removes nothing (its name is not looked up inside the string)."""
    codex = tmp_path / ".codex" / "config.toml"
    codex.parent.mkdir()
    codex.write_text('mcp_servers = "rmsnorm-lab"\n')
    with pytest.raises(UsageError, match="mcp_servers is not a table"):
        write_codex_toml(tmp_path, ENTRY)
    assert codex.read_text() == 'mcp_servers = "rmsnorm-lab"\n'
    assert remove_codex_toml(tmp_path, "rmsnorm-lab") is False
    assert codex.read_text() == 'mcp_servers = "rmsnorm-lab"\n'


def test_the_refusal_names_the_first_key_that_is_no_table(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("a = 1\n")
    with pytest.raises(UsageError, match="config.toml: a is not a table"):
        write_toml_table(path, ["a", "b", "c"], {"x": 1})
    assert path.read_text() == "a = 1\n"
    # Reading through a plain value finds no table, even when the value spells the name.
    path.write_text('mcp_servers = "rmsnorm-lab"\n')
    assert read_toml_table(path, ["mcp_servers", "rmsnorm-lab"]) is None


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


# -- rule by rule (each test fails on a mutant of projection.py) ---------------------------------
def test_client_files_are_written_as_two_space_json_and_say_what_changed(tmp_path):
    path = write_mcp_json(tmp_path, ENTRY)
    data = json.loads(path.read_text())
    assert path == tmp_path / ".mcp.json"
    assert path.read_text() == json.dumps(data, indent=2) + "\n"
    assert render_mcp_json(ENTRY) == json.dumps({"mcpServers": {ENTRY.name: data["mcpServers"][
        ENTRY.name]}}, indent=2) + "\n"  # fmt: skip
    (tmp_path / "keep.txt").write_text("")
    write_mcp_json(tmp_path, ENTRY.model_copy(update={"name": "second"}))
    assert remove_mcp_json(tmp_path, "nope") is False
    assert remove_mcp_json(tmp_path, ENTRY.name) is True
    after = (tmp_path / ".mcp.json").read_text()
    assert after == json.dumps({"mcpServers": {"second": data["mcpServers"][ENTRY.name]}},
                               indent=2) + "\n"  # fmt: skip
    assert write_codex_toml(tmp_path, ENTRY) == tmp_path / ".codex" / "config.toml"
    assert remove_codex_toml(tmp_path, "nope") is False


def test_an_empty_mcp_json_is_an_empty_config_and_a_wrong_shape_is_refused(tmp_path):
    (tmp_path / ".mcp.json").write_text("")
    write_mcp_json(tmp_path, ENTRY)
    assert list(json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]) == [ENTRY.name]
    for text in ("[]", '{"mcpServers": []}'):
        (tmp_path / ".mcp.json").write_text(text)
        with pytest.raises(UsageError, match="expected"):
            write_mcp_json(tmp_path, ENTRY)


def test_a_dangling_symlink_client_file_is_refused_not_replaced(tmp_path):
    (tmp_path / ".mcp.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UsageError):
        write_mcp_json(tmp_path, ENTRY)
    assert (tmp_path / ".mcp.json").is_symlink()


def test_a_symlinked_codex_folder_is_refused_not_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.toml").write_text('model = "x"\n')
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".codex").symlink_to(outside)
    with pytest.raises(UsageError):
        write_codex_toml(ws, ENTRY)
    assert (outside / "config.toml").read_text() == 'model = "x"\n'


def test_what_is_written_and_removed_is_recorded_as_the_toolkits(tmp_path):
    owned = OwnedConfig(tmp_path / "owned.json")
    ws = tmp_path / "ws"
    ws.mkdir()
    project_server(ws, ENTRY, ("claude", "codex"), owned=owned)
    servers = owned.load().servers
    assert servers["claude"][ENTRY.name]["command"] == ENTRY.command
    assert servers["codex"][ENTRY.name]["startup_timeout_sec"] == 30
    assert unproject_server(ws, ENTRY.name, owned=owned) == ["claude", "codex"]
    assert owned.load().servers == {"claude": {}, "codex": {}}
    skill = tmp_path / "myskill"
    skill.mkdir()
    (skill / "SKILL.md").write_text("# s\n")
    project_skill(ws, skill, owned=owned)
    digest = tree_digest([("SKILL.md", b"# s\n")])
    assert owned.load().skills == {".claude/skills/myskill": digest,
                                   ".agents/skills/myskill": digest}  # fmt: skip
    assert skill_digest(ws, ".claude/skills/myskill") == digest
    remove_skill(ws, "myskill", owned=owned)
    assert owned.load().skills == {}


@pytest.mark.parametrize("call", [unproject_server, remove_skill])
def test_a_removal_refuses_a_name_that_is_a_path(tmp_path, call):
    (tmp_path / "x").mkdir()
    (tmp_path / ".claude" / "skills").mkdir(parents=True)
    with pytest.raises(UsageError, match="is not allowed"):
        call(tmp_path / ".claude" / "skills", "../../x")
    assert (tmp_path / "x").is_dir()


def test_toml_text_escapes_controls_only_and_writes_each_value_type():
    assert toml_string("a b~") == '"a b~"'
    assert toml_string("\x1f\x7f") == '"\\u001F\\u007F"'
    assert toml_key("a-b_1") == "a-b_1" and toml_key("a.b") == '"a.b"'
    assert toml_value({"k": True, "f": False, "x": 1.5, "n": 2}) == (
        "{ k = true, f = false, x = 1.5, n = 2 }"
    )
    with pytest.raises(TypeError, match="cannot write NoneType"):
        toml_value(None)


def test_a_codex_entry_has_its_args_cwd_timeouts_and_env_for_a_command_only():
    entry = ENTRY.model_copy(update={"cwd": "/w"})
    assert codex_entry(entry) == {
        "command": ENTRY.command, "args": ENTRY.args, "cwd": "/w", "startup_timeout_sec": 30,
        "tool_timeout_sec": 1800, "env": ENTRY.env,
    }  # fmt: skip
    assert claude_entry(entry)["cwd"] == "/w"
    http = entry.model_copy(update={"url": "http://h/mcp"})
    assert "env" not in codex_entry(http)
    assert "env" not in codex_entry(entry.model_copy(update={"env": {}}))
    assert ServerEntry(name="a", command="c", startup_timeout_s=1, tool_timeout_s=1).checked()
    for field in ("startup_timeout_s", "tool_timeout_s"):
        with pytest.raises(ValidationError):
            ServerEntry(name="a", command="c", **{field: 0})
    for bad in (ServerEntry(name="a"), ServerEntry(name="", command="c")):
        with pytest.raises(UsageError):
            render_codex_toml(bad)


def test_codex_tables_are_cut_by_their_headers_only(tmp_path):
    """Rule: an array of tables ends a section (and one inside the server's table is a form
    this tool does not edit); a bracketed line inside a multi-line array is no header."""
    path = tmp_path / ".codex" / "config.toml"
    path.parent.mkdir()
    head = "m = [\n  [1, 2]\n]\n"
    path.write_text(head + '[mcp_servers.rmsnorm-lab]\ncommand = "old"\n[[profiles]]\nx = 1\n')
    write_codex_toml(tmp_path, ENTRY)
    text = path.read_text()
    assert text.startswith(head) and "[[profiles]]\nx = 1\n" in text and '"old"' not in text
    path.write_text('[mcp_servers.rmsnorm-lab]\ncommand = "old"\n[[mcp_servers.rmsnorm-lab.h]]\n')
    with pytest.raises(UsageError, match="a form this tool does not edit"):
        write_codex_toml(tmp_path, ENTRY)


def test_a_toml_table_outside_a_workspace_is_merged_in_place(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('# mine\nmodel = "o4"\n')
    assert write_toml_table(path, ["mcp_servers", "a"], {"command": "c"}) == path
    assert path.read_text().startswith('# mine\nmodel = "o4"\n')
    assert read_toml_table(path, ["mcp_servers", "a"]) == {"command": "c"}
    assert read_toml_table(path, ["model"]) is None


def test_a_skill_is_copied_under_its_given_name_without_caches_or_links(tmp_path):
    skill = tmp_path / "src"
    (skill / "__pycache__").mkdir(parents=True)
    (skill / "SKILL.md").write_text("# s\n")
    (skill / "x.pyc").write_bytes(b"")
    (skill / "data.txt").write_text("d")
    (skill / "link.txt").symlink_to(skill / "data.txt")
    ws = tmp_path / "ws"
    ws.mkdir()
    dest = project_skill(ws, skill, "renamed")[0]
    assert dest == ws / ".claude" / "skills" / "renamed"
    assert sorted(p.name for p in dest.iterdir()) == ["SKILL.md", "data.txt", "link.txt"]
    assert not (dest / "link.txt").is_symlink() and (dest / "link.txt").read_text() == "d"
    assert [p.name for p in remove_skill(ws, "renamed")] == ["renamed", "renamed"]
    assert not dest.exists()


def test_removing_one_codex_server_keeps_the_others_and_refuses_an_inline_one(tmp_path):
    path = tmp_path / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(OTHER_CODEX)
    assert remove_codex_toml(tmp_path, "rmsnorm-lab") is True
    assert tomllib.loads(path.read_text())["mcp_servers"] == {
        "other": {"command": "other-server", "args": ["--flag"]}
    }
    path.write_text('mcp_servers = { inline = { command = "x" } }\n')
    with pytest.raises(UsageError, match="mcp_servers.inline is defined in a form"):
        remove_codex_toml(tmp_path, "inline")


def test_a_table_that_would_not_read_back_is_never_written(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("a = 1\n")
    with pytest.raises(UsageError, match="does not read back as the new t"):
        write_toml_table(path, ["t"], {"x": float("nan")})  # nan != nan
    assert path.read_text() == "a = 1\n"


def test_a_symlinked_skill_is_unlinked_not_followed(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.md").write_text("k")
    skills = tmp_path / ".claude" / "skills"
    skills.mkdir(parents=True)
    (skills / "s").symlink_to(target)
    assert remove_skill(tmp_path, "s") == [skills / "s"]
    assert not (skills / "s").is_symlink() and (target / "keep.md").read_text() == "k"
