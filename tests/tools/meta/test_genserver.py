"""genserver: specs, generated files, and the generated server run in process (its custom tools
in their sandboxed worker, tools/meta/custom_host.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_workspace
from harnesslab.tools.errors import UsageError
from harnesslab.tools.meta.custom_host import annotation_type
from harnesslab.tools.meta.genserver import generate, load_manifest, parse_spec
from harnesslab.tools.state.workspace import Workspace

DIAG = '''
import json
import sys
from pathlib import Path


async def config_summary(workspace: Path, verbose: bool = False) -> dict:
    """The knobs in kernel_config.json."""
    cfg = json.loads((workspace / "kernel_config.json").read_text())
    return {"knobs": sorted(cfg), "verbose": verbose}
'''


def spec(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "rms-tools",
        "description": "An overview preset and a config summary for rmsnorm_gate.",
        "tools": [
            {"builtin": "inspect_context", "name": "overview", "presets": {"recent": 2}},
            {
                "custom": {"function": "config_summary", "file": "diag.py"},
                "probe_args": {"verbose": True},
                "read_only": True,
            },
        ],
    }
    base.update(overrides)
    return base


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return make_workspace(tmp_path)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_generate_writes_server_manifest_tests_readme_and_skill(ws: Workspace) -> None:
    made = generate(ws, spec(), {"diag.py": DIAG})
    sdir = ws.root / ".harnesslab/mcp/rms-tools"
    for rel in ("server.py", "manifest.json", "tests/test_server.py", "README.md", "diag.py"):
        assert (sdir / rel).is_file(), rel
    manifest = load_manifest(sdir)
    assert [t.name for t in manifest.enabled_tools()] == ["overview", "config_summary"]
    assert manifest.args == [".harnesslab/mcp/rms-tools/server.py", "--workspace", "."]
    assert manifest.cwd == "."
    assert manifest.self_test is not None and manifest.self_test.args[-1] == "--self-test"
    assert manifest.tools[0].presets == {"recent": 2}
    assert manifest.tools[1].read_only and manifest.tools[1].kind == "custom"
    assert manifest.tools[1].description == "The knobs in kernel_config.json."  # its docstring
    skill = (ws.root / ".harnesslab/skills/rms-tools/SKILL.md").read_text()
    head = skill.split("---")[1]
    assert "name: rms-tools" in head
    description = json.loads(head.split("description: ", 1)[1].strip())
    assert 0 < len(description) < 1024 and "rmsnorm_gate" in description
    assert made.warnings == []
    assert set(made.files) >= {
        ".harnesslab/mcp/rms-tools/server.py",
        ".harnesslab/skills/rms-tools/SKILL.md",
    }


def test_generated_files_hold_no_absolute_path_into_the_workspace(ws: Workspace) -> None:
    generate(ws, spec(), {"diag.py": DIAG})
    for path in (ws.root / ".harnesslab").rglob("*"):
        if path.is_file() and path.suffix in (".py", ".json", ".md"):
            assert str(ws.root) not in path.read_text(), path


@pytest.mark.parametrize("name", ["Bad_Name", "a--b", "-ab", "ab-", "a" * 65, "a/b", "", "ü"])
def test_server_names_must_be_lowercase_words_joined_by_hyphens(ws: Workspace, name: str) -> None:
    with pytest.raises(UsageError, match="name"):
        generate(ws, spec(name=name), {"diag.py": DIAG})


def test_an_unknown_builtin_is_refused_with_the_known_names(ws: Workspace) -> None:
    with pytest.raises(UsageError, match="unknown built-in 'run_everything'") as err:
        generate(ws, spec(tools=[{"builtin": "run_everything"}]))
    assert "sweep_kernel_config" in err.value.next_step


def test_a_missing_custom_function_is_refused_naming_what_the_file_has(ws: Workspace) -> None:
    tools = [{"custom": {"function": "nope", "file": "diag.py"}}]
    with pytest.raises(UsageError, match="no function 'nope'.*config_summary"):
        generate(ws, spec(tools=tools), {"diag.py": DIAG})


def test_a_missing_custom_file_is_refused(ws: Workspace) -> None:
    tools = [{"custom": {"function": "f", "file": "absent.py"}}]
    with pytest.raises(UsageError, match="custom file 'absent.py' is missing"):
        generate(ws, spec(tools=tools))


def test_a_sync_custom_function_is_refused(ws: Workspace) -> None:
    tools = [{"custom": {"function": "f", "file": "sync.py"}}]
    with pytest.raises(UsageError, match="not async"):
        generate(ws, spec(tools=tools), {"sync.py": "def f():\n    return 1\n"})


def test_a_custom_file_that_does_not_parse_is_written_with_a_warning(ws: Workspace) -> None:
    tools = [{"custom": {"function": "f", "file": "broken.py"}}]
    made = generate(ws, spec(tools=tools), {"broken.py": "async def f(:\n    pass\n"})
    assert made.warnings and "broken.py: SyntaxError at line 1" in made.warnings[0]


@pytest.mark.parametrize(
    ("tool", "match"),
    [
        ({"builtin": "run_objective", "custom": {"function": "f", "file": "d.py"}}, "exactly one"),
        ({}, "exactly one"),
        ({"custom": {"function": "f", "file": "d.py"}, "presets": {"a": 1}}, "presets apply"),
        ({"custom": {"function": "f", "file": "../d.py"}}, "plain module name"),
        ({"custom": {"function": "f", "file": "server.py"}}, "plain module name"),
        ({"builtin": "run_objective", "name": "Bad-Tool"}, "tool name"),
    ],
)
def test_malformed_tool_specs_fail_clearly(tool: dict[str, Any], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        parse_spec(spec(tools=[tool]))


def test_duplicate_tool_names_are_refused() -> None:
    tools = [{"builtin": "run_objective"}, {"builtin": "run_objective"}]
    with pytest.raises(UsageError, match="duplicate tool names: run_objective"):
        parse_spec(spec(tools=tools))


def test_preset_problems_from_the_server_layer_stop_generation(ws: Workspace) -> None:
    def check(builtin: str, presets: dict[str, Any], probe: dict[str, Any]) -> list[str]:
        return [f"{builtin} has no argument 'bogus'"] if "bogus" in presets else []

    tools = [{"builtin": "run_objective", "presets": {"bogus": 1}}]
    with pytest.raises(UsageError, match="run_objective has no argument 'bogus'"):
        generate(ws, spec(tools=tools), preset_check=check)


def test_an_interpreter_inside_the_workspace_is_written_relative(ws: Workspace) -> None:
    python = str(ws.root / ".venv" / "bin" / "python")
    generate(ws, spec(), {"diag.py": DIAG}, python=python)
    assert load_manifest(ws.root / ".harnesslab/mcp/rms-tools").command == "./.venv/bin/python"


def test_regenerating_keeps_custom_files_the_agent_wrote(ws: Workspace) -> None:
    generate(ws, spec(), {"diag.py": DIAG})
    (ws.root / ".harnesslab/mcp/rms-tools/notes.py").write_text("X = 1\n")
    generate(ws, spec(description="A second version of the rmsnorm tools."))
    assert (ws.root / ".harnesslab/mcp/rms-tools/notes.py").is_file()
    assert (ws.root / ".harnesslab/mcp/rms-tools/diag.py").read_text() == DIAG


def _load_server(sdir: Path) -> Any:
    module_spec = importlib.util.spec_from_file_location(f"gen_{id(sdir)}", sdir / "server.py")
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_the_generated_server_serves_presets_custom_tools_and_telemetry(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp import Client

    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    generate(ws, spec(), {"diag.py": DIAG})
    module = _load_server(ws.root / ".harnesslab/mcp/rms-tools")
    server, state = module.build_server(ws.root)
    try:
        with anyio.fail_after(60):
            async with Client(server) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert set(tools) == {"overview", "config_summary"}
                assert "recent" not in tools["overview"].input_schema.get("properties", {})
                assert "workspace" not in tools["config_summary"].input_schema["properties"]
                assert tools["config_summary"].annotations.read_only_hint is True
                summary = await client.call_tool("config_summary", {"verbose": True})
                assert not summary.is_error
                assert summary.structured_content["knobs"] == [
                    "num_stages",
                    "num_warps",
                    "rows_per_program",
                ]
                fixed = await client.call_tool("overview", {"recent": 5})
                assert fixed.is_error and "fixed by this server" in fixed.content[0].text
    finally:
        await module.close_state(state)
    records = [json.loads(x) for x in ws.telemetry_path.read_text().splitlines()]
    assert {(r["server"], r["tool"], r["status"]) for r in records} >= {
        ("rms-tools", "config_summary", "ok"),
        ("rms-tools", "overview", "bad_input"),
    }


@pytest.mark.anyio
async def test_a_custom_tool_that_raises_or_hangs_answers_with_a_tool_error(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp import Client

    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    source = (
        "import anyio\n\n\nasync def boom() -> dict:\n    raise RuntimeError('boom')\n\n\n"
        "async def hang() -> dict:\n    await anyio.sleep(3600)\n    return {}\n"
    )
    tools = [
        {"custom": {"function": "boom", "file": "bad.py"}},
        {"custom": {"function": "hang", "file": "bad.py"}, "timeout_s": 0.5},
    ]
    generate(ws, spec(tools=tools), {"bad.py": source})
    module = _load_server(ws.root / ".harnesslab/mcp/rms-tools")
    server, state = module.build_server(ws.root)
    try:
        with anyio.fail_after(30):
            async with Client(server) as client:
                boom = await client.call_tool("boom", {})
                hang = await client.call_tool("hang", {})
                again = await client.call_tool("boom", {})  # answered by a new worker
    finally:
        await module.close_state(state)
    assert boom.is_error and "RuntimeError: boom" in boom.content[0].text
    assert hang.is_error and "timed out after 0.5s" in hang.content[0].text
    assert again.is_error and "RuntimeError: boom" in again.content[0].text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("int", int),
        ("list[pathlib.Path]", list[str]),
        ("Optional[int]", int | None),
        ("dict[str, list[float]]", dict[str, list[float]]),
        ("typing.Literal['fp16', 'bf16']", Literal["fp16", "bf16"]),
        ("'list[int]'", list[int]),
        ("SomeModel", Any),
        ("__import__('os').system('touch /tmp/pwned')", Any),
        ("", Any),
    ],
)
def test_custom_annotations_map_through_a_fixed_table_and_are_never_evaluated(
    text: str, expected: Any
) -> None:
    assert annotation_type(text) == expected


STATEFUL = (
    "async def f(workspace, state) -> dict:\n    return {'runs': len(state.launcher.slots)}\n"
)
STATE_ADVICE = "asks for `state`"


def test_a_custom_tool_that_asks_for_state_is_refused_with_what_to_use_instead(
    ws: Workspace,
) -> None:
    tools = [{"custom": {"function": "f", "file": "fix.py"}}]
    with pytest.raises(UsageError, match=STATE_ADVICE) as err:
        generate(ws, spec(tools=tools), {"fix.py": STATEFUL})
    assert "`workspace`" in str(err.value) and "built-in" in str(err.value)


def test_a_custom_tool_given_state_after_generation_stops_the_server_with_the_same_advice(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    tools = [{"custom": {"function": "f", "file": "fix.py"}}]
    generate(ws, spec(tools=tools), {"fix.py": "async def f(workspace) -> dict:\n    return {}\n"})
    sdir = ws.root / ".harnesslab/mcp/rms-tools"
    (sdir / "fix.py").write_text(STATEFUL)  # edited by hand, past generate's check
    module = _load_server(sdir)
    with pytest.raises(UsageError, match=STATE_ADVICE):
        module.build_server(ws.root)


@pytest.mark.anyio
async def test_a_hostile_custom_tool_fails_every_attempt_and_leaves_nothing_when_served(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write outside, read the state dir, connect, signal, leave a daemon: through the
    generated server's own tool call (tests/tools/integrity/test_sandbox.py runs the same attacks
    as a kernel; tests/tools/meta/test_qualification.py during qualification and registered)."""
    from mcp import Client

    from harnesslab.tests.tools.integrity.hostile_tool import FILE, SPEC_TOOL, HostileTool

    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    hostile = HostileTool(tmp_path, tmp_path / "state")
    try:
        generate(ws, spec(tools=[SPEC_TOOL]), {FILE: hostile.source()})
        module = _load_server(ws.root / ".harnesslab/mcp/rms-tools")
        server, state = module.build_server(ws.root)
        try:
            with anyio.fail_after(60):
                async with Client(server) as client:
                    result = await client.call_tool("hostile", {})
        finally:
            await module.close_state(state)
        assert not result.is_error, result.content[0].text
        assert result.structured_content == {"worked": []}
        out = ws.root / ".harnesslab/out/rms-tools"
        assert (out / "hostile-ran.txt").is_file()  # its output folder is writable
        hostile.contained(ws.root)
    finally:
        hostile.close()


def test_the_server_template_is_byte_identical_to_what_generated_servers_carry():
    """A generated server's server.py must equal the toolkit's rendering (qualification and
    serve-generated refuse any other), so changing SERVER_PY makes every existing generated
    server refuse to start until it is regenerated: pinned here on purpose."""
    import hashlib

    from harnesslab.tools.meta import gentemplates

    digest = hashlib.sha256(gentemplates.SERVER_PY.encode()).hexdigest()
    assert digest == "f8b69b8385e959415a2857ea2b25f7db3f53a0ef08dd1287ca67e7cfb8864db5"


WRITER = '''
from pathlib import Path


async def write_all(workspace: Path) -> dict:
    """Writes where its write set allows, and tries where it does not."""
    out = {}
    for rel in (".harnesslab/out/rms-tools/notes.txt", "kernel_config.json", "kernel.py",
                ".mcp.json", ".claude/settings.local.json", "planted.txt",
                ".harnesslab/mcp/rms-tools/diag.py"):
        try:
            path = workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(path.read_text() if path.is_file() else "{}")
            out[rel] = "written"
        except OSError as exc:
            out[rel] = type(exc).__name__
    return out
'''


@pytest.mark.anyio
async def test_a_custom_tool_writes_its_output_folder_and_declared_editable_files_only(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp import Client

    monkeypatch.setenv("HARNESSLAB_STATE_DIR", str(tmp_path / "state"))
    tools = [{"custom": {"function": "write_all", "file": "w.py"}}]
    writes = [".harnesslab/out/rms-tools", "kernel_config.json"]
    generate(ws, spec(tools=tools, writes=writes), {"w.py": WRITER})
    assert load_manifest(ws.root / ".harnesslab/mcp/rms-tools").writes == writes
    module = _load_server(ws.root / ".harnesslab/mcp/rms-tools")
    server, state = module.build_server(ws.root)
    try:
        with anyio.fail_after(60):
            async with Client(server) as client:
                result = await client.call_tool("write_all", {})
    finally:
        await module.close_state(state)
    assert not result.is_error, result.content
    got = result.structured_content
    assert got[".harnesslab/out/rms-tools/notes.txt"] == got["kernel_config.json"] == "written"
    for rel in (".mcp.json", ".claude/settings.local.json", "planted.txt", "kernel.py"):
        assert got[rel] == "PermissionError", (rel, got)
        assert rel == "kernel.py" or not (ws.root / rel).exists()
    assert got[".harnesslab/mcp/rms-tools/diag.py"] == "PermissionError"  # its own source


@pytest.mark.parametrize(
    "entry",
    [".mcp.json", ".claude/settings.local.json", ".codex", ".harnesslab/mcp/rms-tools",
     ".harnesslab/out/other-server", ".harnesslab", "task.md", "../x", "/tmp/x", "."],
)  # fmt: skip
def test_a_write_set_beyond_the_output_folder_and_editable_files_is_refused(
    ws: Workspace, entry: str
) -> None:
    with pytest.raises(UsageError, match="writes") as err:
        generate(ws, spec(writes=[entry]), {"diag.py": DIAG})
    assert ".harnesslab/out/rms-tools" in err.value.next_step or "relative" in err.value.next_step


def test_a_custom_tools_call_limit_is_capped_and_a_builtins_is_not() -> None:
    with pytest.raises(UsageError, match="at most 600s"):
        parse_spec(spec(tools=[{"custom": {"function": "f", "file": "d.py"}, "timeout_s": 3600}]))
    parse_spec(spec(tools=[{"builtin": "sweep_kernel_config", "timeout_s": 3600}]))


def test_the_clean_room_is_not_mounted_over_a_workspace_holding_the_interpreter(
    tmp_path: Path,
) -> None:
    """A virtualenv inside the workspace: mounting the clean room at the workspace's path would
    hide the interpreter from the sandbox, so the worker sees the room where it is."""
    from harnesslab.tools.meta.custom_host import CustomWorker, mounts_available

    if not mounts_available(sys.executable):
        pytest.skip("no mount namespace here: no view is mounted at all")
    room, served = tmp_path / "room", tmp_path / "ws"
    room.mkdir()
    python = served / ".venv" / "bin" / "python"
    apart = CustomWorker(bundle=room, workspace=room, python=sys.executable, seen_at=served)
    assert apart.view().workspace == served
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    inside = CustomWorker(bundle=room, workspace=room, python=str(python), seen_at=served)
    view = inside.view()
    assert view.workspace == room and view.binds == [(str(room), str(room))]
