"""Shipped agent skills: the front matter follows the Agent Skills rules, every tool, field and
CLI command the text shows is real, and projection puts the skills where Claude Code
(.claude/skills/<name>/) and Codex (.agents/skills/<name>/) look for them."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from harnesslab.servers.cli import main as cli_main
from harnesslab.tools.errors import UsageError
from harnesslab.tools.meta.skills import (
    list_skills,
    parse_skill,
    project_skills,
    skill_dir,
    skill_problems,
    skill_task,
    skills_for_task,
    split_front_matter,
    validate_skill,
)
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task.spec import list_tasks, load_task

CLI = [sys.executable, "-m", "harnesslab.servers"]
SKILLS = list_skills()
CLIENT_ROOTS = {"Claude Code": ".claude/skills", "Codex": ".agents/skills"}

# A backticked identifier in tool style: snake_case with at least one underscore.
SNAKE_RE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
CODE_SPAN_RE = re.compile(r"`([^`\n]+)`")
FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# Keys of the result.json an agent writes at the end of an attempt (finalize.md; read by the
# loop driver, `harnesslab run`).
RESULT_JSON_KEYS = {"status", "summary", "metrics", "selected_improvement"}


def skill_texts(name: str) -> dict[str, str]:
    folder = skill_dir(name)
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.md"))}


def all_texts() -> dict[str, str]:
    return {f"{n}/{f}": t for n in SKILLS for f, t in skill_texts(n).items()}


def code_spans(text: str) -> list[str]:
    without_fences = FENCE_RE.sub("", text)
    return CODE_SPAN_RE.findall(without_fences)


# -- what exists: tools, their arguments, result fields, task knobs ------------------------------


def model_fields_deep(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Field names of a pydantic model and of every model nested in its fields."""
    seen = set() if seen is None else seen
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for f in model.model_fields.values():
        for t in _types_in(f.annotation):
            names |= model_fields_deep(t, seen)
    return names


def _types_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _types_in(arg)]


def dict_keys_deep(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return {k for k in obj if isinstance(k, str)} | {
            k for v in obj.values() for k in dict_keys_deep(v)
        }
    if isinstance(obj, list):
        return {k for v in obj for k in dict_keys_deep(v)}
    return set()


def _import_or_skip(module: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            pytest.skip(f"{module} ({what}) is not written yet")
        raise


@functools.cache
def task_server_tools() -> dict[str, Any]:
    """The kernel task server's tools: harnesslab.servers.builtin.BUILTINS, name -> BuiltinTool."""
    builtins = _import_or_skip("harnesslab.servers.builtin", "the task server's BUILTINS").BUILTINS
    assert builtins, "harnesslab.servers.builtin.BUILTINS lists no tools"
    return dict(builtins)


@functools.cache
def meta_server_tools() -> dict[str, set[str]]:
    """The meta-server's tools, name -> argument names, from its tools/list in memory."""
    meta = _import_or_skip("harnesslab.servers.meta_server", "the meta-server")
    build = getattr(meta, "build_meta_server", None)
    if build is None:
        pytest.skip("harnesslab.servers.meta_server has no build_meta_server() to list its tools")
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(state_dir=Path(tmp) / "state")
        ws = init_workspace("rmsnorm_gate", Path(tmp) / "ws", settings)
        server = build(ws, settings)

        async def listed() -> Any:
            return await server.list_tools()

        tools = anyio.run(listed)
    tools = getattr(tools, "tools", tools)
    return {t.name: set((_input_schema(t) or {}).get("properties", {})) for t in tools}


def _input_schema(tool: Any) -> dict[str, Any] | None:
    for attr in ("input_schema", "inputSchema"):  # SDK 2.x names it input_schema
        schema = getattr(tool, attr, None)
        if isinstance(schema, dict):
            return schema
    return None


@functools.cache
def inspect_context_keys() -> set[str]:
    """Keys of a real inspect_context answer on a fresh workspace (its task summary is a dict)."""
    from harnesslab.servers.runtime import ServerState  # noqa: PLC0415

    tool = task_server_tools()["inspect_context"]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(state_dir=Path(tmp) / "state")
        ws = init_workspace("rmsnorm_gate", Path(tmp) / "ws", settings)
        state = ServerState.open(ws.root, settings)

        async def call() -> Any:
            try:
                return await tool.handler(state, tool.input_model(), None)
            finally:
                await state.aclose()

        answer = anyio.run(call)
    return dict_keys_deep(answer.model_dump(mode="json"))


META_TOOLS_REQUIRED = {
    "generate_server", "self_test_server", "register_server", "list_servers", "quarantine_server",
}  # fmt: skip


@functools.cache
def known_identifiers() -> dict[str, str]:
    """Every snake_case name a skill may show in backticks, with what it is. Without the
    meta-server module the meta tools are left out (the tests that need them skip)."""
    known: dict[str, str] = {}
    for name, tool in task_server_tools().items():
        known[name] = "task server tool"
        for arg in tool.input_model.model_fields:
            known.setdefault(arg, f"argument of {name}")
        for field in model_fields_deep(tool.output_model):
            known.setdefault(field, f"result field of {name}")
    for key in inspect_context_keys():
        known.setdefault(key, "key in inspect_context's answer")
    try:
        meta_tools = meta_server_tools()
    except pytest.skip.Exception:  # checked by the meta-server test once the module exists
        meta_tools = {name: set() for name in META_TOOLS_REQUIRED}
    for name, args in meta_tools.items():
        known[name] = "meta-server tool"
        for arg in args:
            known.setdefault(arg, f"argument of {name}")
    for name in list_tasks():
        task = load_task(name)
        known.setdefault(name, "task name")
        for knob in task.space:
            known.setdefault(knob, f"{name} launch knob")
        for probe in _probe_names(task.reference_path):
            known.setdefault(probe, f"{name} numerical probe")
    for key in RESULT_JSON_KEYS:
        known.setdefault(key, "result.json key")
    return known


def _probe_names(reference: Path) -> list[str]:
    if not reference.is_file():
        return []
    spec = importlib.util.spec_from_file_location(f"_skills_ref_{reference.parent.name}", reference)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(getattr(module, "PROBES", {}))


# -- front matter --------------------------------------------------------------------------------


def test_the_toolkit_ships_the_workflow_skill_and_the_rmsnorm_gate_lore():
    assert {"kernel-optimization", "rmsnorm-gate"} <= set(SKILLS)


@pytest.mark.parametrize("name", SKILLS)
def test_every_shipped_skill_has_valid_agent_skills_front_matter(name):
    assert skill_problems(skill_dir(name)) == []
    meta = validate_skill(skill_dir(name))
    assert meta["name"] == name == skill_dir(name).name
    assert 0 < len(meta["description"]) < 1024
    assert "use" in meta["description"].lower(), "the description must say when to use the skill"


@pytest.mark.parametrize("name", SKILLS)
def test_every_file_a_skill_points_to_exists_in_its_folder(name):
    folder = skill_dir(name)
    for fname, text in skill_texts(name).items():
        for span in code_spans(text):
            if span.endswith(".md") and "/" not in span and span != "task.md":
                assert (folder / span).is_file(), f"{name}/{fname} points to missing {span}"


def test_the_workflow_skill_routes_to_its_stage_files_and_stays_short():
    body = split_front_matter((skill_dir("kernel-optimization") / "SKILL.md").read_text())[1]
    for stage in ("profile.md", "optimize.md", "finalize.md", "gotchas.md"):
        assert f"`{stage}`" in body
    assert len(body.splitlines()) < 60, "SKILL.md routes; the detail belongs in the stage files"


def test_front_matter_parser_reads_quoted_block_and_nested_values():
    meta, body = split_front_matter(
        "---\n"
        "name: demo\n"
        "description: >\n  Folded text,\n  two lines.\n"
        "license: 'Apache-2.0'\n"
        'compatibility: "Claude Code: yes"\n'
        'metadata:\n  task: rmsnorm_gate\n  version: "1.0"\n'
        "---\n# Body\n"
    )
    assert meta == {
        "name": "demo",
        "description": "Folded text, two lines.",
        "license": "Apache-2.0",
        "compatibility": "Claude Code: yes",
        "metadata": {"task": "rmsnorm_gate", "version": "1.0"},
    }
    assert body.startswith("# Body")


@pytest.mark.parametrize(
    ("front", "problem"),
    [
        ("name: other\ndescription: Use it when testing.", "must equal the folder name"),
        ("name: Bad_Name\ndescription: Use it when testing.", "a-z, 0-9 and single hyphens"),
        ("name: demo", "description: missing"),
        ("name: demo\ndescription: " + "x" * 1024, "must be under 1024"),
        ("name: demo\ndescription: Use it when: testing.", "may not contain ': '"),
        ("name: demo\ndescription: Use it for C #tags.", "starts a YAML comment"),
    ],
)
def test_skill_problems_name_the_rule_a_broken_skill_breaks(tmp_path, front, problem):
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "SKILL.md").write_text(f"---\n{front}\n---\nBody.\n")
    problems = skill_problems(folder)
    assert any(problem in p for p in problems), problems
    with pytest.raises(UsageError, match="not valid"):
        validate_skill(folder)


def test_a_skill_without_front_matter_is_reported_not_crashed(tmp_path):
    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "SKILL.md").write_text("# just markdown\n")
    assert any("no front matter" in p for p in skill_problems(folder))
    with pytest.raises(UsageError):
        parse_skill(folder)


# -- tool names, fields, arguments ------------------------------------------------------------


def test_every_tool_name_a_skill_mentions_exists_on_its_server():
    known = known_identifiers()
    unknown: list[str] = []
    for where, text in all_texts().items():
        meta_desc = ""
        if where.endswith("/SKILL.md"):
            meta_desc = split_front_matter(text)[0].get("description", "")
        words = [s for s in code_spans(text) if SNAKE_RE.match(s)]
        words += re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b(?![.\w])", meta_desc)
        unknown += [f"{where}: `{w}`" for w in words if w not in known]
    assert not unknown, (
        "not a tool of the task server (harnesslab.servers.builtin.BUILTINS) or the meta-server, "
        "nor a tool argument, result field, task knob or probe: " + ", ".join(unknown)
    )


def test_the_meta_server_tools_a_skill_mentions_exist_on_the_meta_server():
    mentioned = {
        w for text in all_texts().values() for w in code_spans(text) if w in META_TOOLS_REQUIRED
    }
    assert mentioned, "finalize.md names the meta-server's tools"
    missing = mentioned - set(meta_server_tools())
    assert not missing, f"not tools of harnesslab.servers.meta_server: {sorted(missing)}"


def test_the_workflow_skill_covers_every_tool_of_the_task_server():
    text = "\n".join(skill_texts("kernel-optimization").values())
    missing = [t for t in task_server_tools() if f"`{t}`" not in text]
    assert not missing, f"kernel-optimization never mentions: {', '.join(missing)}"


def test_the_task_server_has_every_tool_the_design_requires():
    required = {
        "inspect_context", "run_objective", "sweep_kernel_config", "numerical_probe",
        "guarded_final_verify", "rank_history", "restore_best_checkpoint", "profile_kernel",
        "remote_health_check",
    }  # fmt: skip
    assert required <= set(task_server_tools())


# -- CLI commands ------------------------------------------------------------------------------


def cli_lines() -> list[tuple[str, str]]:
    """(where, command line) for every `harnesslab ...` a skill shows, in code blocks or spans."""
    out = []
    for where, text in all_texts().items():
        for block in FENCE_RE.findall(text):
            out += [
                (where, ln.strip())
                for ln in block.splitlines()
                if ln.strip().startswith("harnesslab ")
            ]
        out += [(where, s.strip()) for s in code_spans(text) if s.startswith("harnesslab ")]
    return out


@functools.cache
def cli_help(subcommand: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, subcommand, "--help"], capture_output=True, text=True, timeout=120)


def test_the_skills_show_at_least_one_cli_command():
    assert cli_lines(), "the finalize stage shows `harnesslab verify`; the extractor found none"


@pytest.mark.parametrize(("where", "line"), cli_lines())
def test_every_cli_command_a_skill_shows_runs_and_takes_the_flags_shown(where, line):
    tokens = shlex.split(line)
    sub = tokens[1]
    res = cli_help(sub)
    assert res.returncode == 0, (
        f"{where}: `{line}`: `harnesslab {sub} --help` failed:\n{res.stderr}"
    )
    for tok in tokens[2:]:
        if tok.startswith("-"):
            flag = tok.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", res.stdout), (
                f"{where}: `{line}` uses {flag}, which `harnesslab {sub} --help` does not list"
            )


# -- projection into the clients' folders -------------------------------------------------------


def _assert_projected(ws: Path, names: list[str]) -> None:
    for client, rel in CLIENT_ROOTS.items():
        for name in names:
            dest = ws / rel / name
            assert (dest / "SKILL.md").is_file(), f"{client} looks for {dest / 'SKILL.md'}"
            for src in skill_dir(name).glob("*.md"):
                assert (dest / src.name).read_bytes() == src.read_bytes(), f"{client}: {src.name}"
            assert parse_skill(dest)["name"] == name


def test_project_skills_writes_where_claude_code_and_codex_look(tmp_path):
    names = project_skills(tmp_path)
    assert names == SKILLS  # no task recorded: every shipped skill
    _assert_projected(tmp_path, names)


def test_projecting_again_replaces_the_older_copy(tmp_path):
    project_skills(tmp_path, ["kernel-optimization"])
    stale = tmp_path / ".claude/skills/kernel-optimization/stale.md"
    stale.write_text("old")
    (tmp_path / ".agents/skills/kernel-optimization/SKILL.md").write_text("edited")
    project_skills(tmp_path, ["kernel-optimization"])
    assert not stale.exists()
    _assert_projected(tmp_path, ["kernel-optimization"])


def test_a_task_specific_skill_goes_only_to_workspaces_of_its_task(tmp_path):
    (tmp_path / ".harnesslab").mkdir()
    (tmp_path / ".harnesslab/task.json").write_text(json.dumps({"task": "some_other_task"}))
    names = project_skills(tmp_path)
    assert "kernel-optimization" in names and "rmsnorm-gate" not in names
    assert not (tmp_path / ".claude/skills/rmsnorm-gate").exists()
    assert skills_for_task("rmsnorm_gate") == SKILLS


def test_projecting_an_unknown_skill_names_the_shipped_ones(tmp_path):
    with pytest.raises(UsageError, match="unknown skill 'nope'") as info:
        project_skills(tmp_path, ["nope"])
    assert "kernel-optimization" in info.value.next_step


def test_a_fresh_harnesslab_init_workspace_carries_the_skills_for_both_clients(tmp_path):
    ws = tmp_path / "ws"
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    res = subprocess.run(
        [*CLI, "init", "-w", str(ws), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    _assert_projected(ws, ["kernel-optimization", "rmsnorm-gate"])


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_harnesslab_config_write_projects_the_skills_too(tmp_path, client):
    if cli_help("config").returncode != 0:
        pytest.skip("`harnesslab config` is not written yet")
    ws = tmp_path / "ws"
    assert cli_main(["init", "-w", str(ws), "--json"]) == 0
    for rel in CLIENT_ROOTS.values():
        shutil.rmtree(ws / rel)
    env = {**os.environ, "HARNESSLAB_STATE_DIR": str(tmp_path / "state")}
    res = subprocess.run(
        [*CLI, "config", client, "--workspace", str(ws), "--write"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    _assert_projected(ws, ["kernel-optimization", "rmsnorm-gate"])


# -- task lore stays in step with the task -----------------------------------------------------


def task_skills() -> list[tuple[str, str]]:
    return [(n, t) for n in SKILLS if (t := skill_task(skill_dir(n)))]


@pytest.mark.parametrize(("name", "task_name"), task_skills())
def test_a_task_skill_names_only_dev_cases_its_task_has(name, task_name):
    task = load_task(task_name)
    dev = {c.name for c in task.dev_cases}
    text = "\n".join(skill_texts(name).values())
    named = set(re.findall(r"\b\d+x\d+_(?:fp16|bf16|fp32)\b", text))
    assert named <= dev, f"{name} names dev cases {task_name} lacks: {sorted(named - dev)}"
    counts = {int(n) for n in re.findall(r"\b(\d+) dev cases\b", text)}
    assert counts <= {len(dev)}, f"{name} counts {counts} dev cases; {task_name} has {len(dev)}"
