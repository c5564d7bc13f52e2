"""Generated task-specific MCP servers: the spec an agent writes, the manifest that describes a
server to qualification and to clients, and `generate()`, which writes the server's folder.

A spec names a server and its tools. Each tool is either one of the toolkit's built-in tools
bound with preset arguments (a sweep space that worked, a case subset), or a custom async
function the agent wrote into the server's folder. `generate()` writes

    .harnesslab/mcp/<name>/    server.py, manifest.json, tests/test_server.py, README.md
                               (+ the custom .py files)
    .harnesslab/skills/<name>/ SKILL.md (Agent Skills format)

Every path written into those files is relative: the server runs from the workspace root
(`cwd` "."), so the same bundle works in a clean copy of the workspace and after registration.
server.py is the toolkit's own rendering of the template (`render_server_py`); qualification and
serve-generated run no other (`check_server_py`). Custom functions run in a sandboxed worker
(tools/meta/custom_host.py), so one that asks for the server's `state` is refused here. What
they may write is declared (`writes`: the server's output folder `.harnesslab/out/<name>/`, by
default, and files the task declares editable; never a client's configuration, a skill, or the
rest of `.harnesslab/`), checked here (`check_writes`) and enforced by their sandbox.
This module never imports mcp; the server's code lives in the templates (tools/meta/gentemplates.py).
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..catalog import SERVER_NAME_RE, TASK_TOOLS
from ..errors import UsageError
from ..state import workspace_files as wf
from ..state.workspace import STATE, Workspace
from . import gentemplates
from .custom_host import REFUSED as REFUSED_PARAM
from .custom_host import state_refusal
from .writeset import check_writes, output_dir

# Agent Skills: lowercase letters, digits and single hyphens, at most 64, no leading/trailing hyphen.
TOOL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
CUSTOM_FILE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\.py$")
RESERVED_FILES = frozenset({"server.py", "conftest.py", "__init__.py"})
SKILL_DESCRIPTION_MAX = 1023
# A custom tool's call may last this long at most (a built-in's, up to an hour: a sweep or a
# guarded verify on the GPU); the agent's code needs no more, and a call holds the server.
MAX_CUSTOM_TIMEOUT_S = 600.0

# The task server's built-in tools (DESIGN.md MUST names); presets are checked against each
# tool's input model by the server layer (`preset_check`), which can import it.
KNOWN_BUILTINS = TASK_TOOLS
VERIFIER_BUILTINS = frozenset({"guarded_final_verify"})

# (builtin name, presets, probe_args) -> problems; supplied by servers/, which knows the models.
PresetCheck = Callable[[str, dict[str, Any], dict[str, Any]], list[str]]


class CustomRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    function: str = Field(description="Name of an `async def` in `file`.")
    file: str = Field(description="A .py file in the server's folder, e.g. 'diagnostics.py'.")

    @model_validator(mode="after")
    def _check(self) -> CustomRef:
        if not self.function.isidentifier():
            raise ValueError(f"custom.function {self.function!r} is not a Python identifier")
        if not CUSTOM_FILE_RE.match(self.file) or self.file in RESERVED_FILES:
            raise ValueError(
                f"custom.file {self.file!r} must be a plain module name like 'diagnostics.py' "
                f"(no folders; not {', '.join(sorted(RESERVED_FILES))})"
            )
        return self


class ToolSpec(BaseModel):
    """One tool of a generated server: a built-in with presets, or a custom async function."""

    model_config = ConfigDict(extra="forbid")

    builtin: str | None = Field(default=None, description="A built-in tool name to bind.")
    custom: CustomRef | None = Field(default=None, description="A custom async function.")
    name: str | None = Field(
        default=None, description="Tool name in this server (default: the built-in/function name)."
    )
    description: str | None = Field(
        default=None, description="What the model reads: what it does, what it costs, what next."
    )
    presets: dict[str, Any] = Field(
        default_factory=dict, description="Built-in arguments fixed by this server (hidden)."
    )
    probe_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments for --self-test and qualification: one small, fast call.",
    )
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description=f"Per-call limit (custom tools: at most {MAX_CUSTOM_TIMEOUT_S:g}s).",
    )
    verifier: bool = Field(
        default=False,
        description="Custom tools: it gives a verdict on the candidate, so qualification checks "
        "it rejects cheating kernels. Implied for built-in guarded_final_verify.",
    )
    read_only: bool = Field(
        default=False, description="Custom tools: it changes nothing (a hint for the client)."
    )

    @model_validator(mode="after")
    def _check(self) -> ToolSpec:
        if (self.builtin is None) == (self.custom is None):
            raise ValueError("each tool needs exactly one of 'builtin' or 'custom'")
        if self.custom is not None and self.presets:
            raise ValueError("presets apply to built-in tools; a custom tool has its own defaults")
        if self.custom is not None and self.timeout_s > MAX_CUSTOM_TIMEOUT_S:
            raise ValueError(
                f"a custom tool's timeout_s is at most {MAX_CUSTOM_TIMEOUT_S:g}s (move long GPU "
                "work into a built-in tool with presets)"
            )
        if not TOOL_NAME_RE.match(self.tool_name):
            raise ValueError(f"tool name {self.tool_name!r} must match {TOOL_NAME_RE.pattern}")
        return self

    @property
    def tool_name(self) -> str:
        if self.name:
            return self.name
        return self.builtin if self.builtin is not None else self.custom.function  # type: ignore[union-attr]

    @property
    def is_verifier(self) -> bool:
        return self.verifier or self.builtin in VERIFIER_BUILTINS


class ServerSpec(BaseModel):
    """What an agent asks for: a named server with a handful of tools."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Folder, server and skill name: [a-z0-9] words joined by '-'.")
    description: str = Field(min_length=10, max_length=1000, description="What the server is for.")
    when_to_use: str | None = Field(
        default=None,
        max_length=700,
        description="For the skill: when a fresh session should reach for this server.",
    )
    tools: list[ToolSpec] = Field(min_length=1, max_length=32)
    startup_timeout_s: float = Field(default=30.0, gt=0, le=600)
    writes: list[str] | None = Field(
        default=None,
        max_length=16,
        description="What the custom tools may write, relative to the workspace root: their "
        "output folder .harnesslab/out/<name> (the default) or folders below it, and files the "
        "task declares editable (e.g. 'kernel_config.json'). Their sandbox lets them write "
        "nothing else; they read the whole workspace.",
    )

    @model_validator(mode="after")
    def _check(self) -> ServerSpec:
        if not SERVER_NAME_RE.match(self.name):
            raise ValueError(
                f"server name {self.name!r} must be lowercase letters/digits joined by single "
                "hyphens, at most 64 characters (e.g. 'rmsnorm-sweeps')"
            )
        names = [t.tool_name for t in self.tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate tool names: {', '.join(dupes)} (set 'name' to tell apart)")
        return self


class ManifestTool(BaseModel):
    """A tool as qualification and clients see it."""

    name: str
    kind: Literal["builtin", "custom", "external"] = "external"
    builtin: str | None = None
    function: str | None = None
    file: str | None = None
    description: str = ""
    presets: dict[str, Any] = Field(default_factory=dict)
    probe_args: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(default=120.0, gt=0)
    enabled: bool = True
    verifier: bool = False
    read_only: bool = False


class SelfTest(BaseModel):
    args: list[str] = Field(description="Arguments after `command` that run the self-test.")
    timeout_s: float = Field(default=300.0, gt=0)


class Manifest(BaseModel):
    """manifest.json: how to start a server and what it offers. `cwd` is relative to the
    workspace root; `args` may use {workspace} and {server_dir} (expanded when launched)."""

    model_config = ConfigDict(extra="ignore")

    schema_version: int = 1
    name: str
    description: str = ""
    command: str
    args: list[str] = Field(default_factory=list)
    cwd: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(default=30.0, gt=0)
    tool_timeout_s: float = Field(default=300.0, gt=0)
    tools: list[ManifestTool] = Field(default_factory=list)
    self_test: SelfTest | None = None
    tests: str | None = Field(default="tests", description="pytest folder in the server folder.")
    generator: str = ""
    writes: list[str] | None = Field(
        default=None,
        description="what the custom tools may write (workspace-relative; default: the output "
        "folder .harnesslab/out/<name>); their sandbox enforces it",
    )

    @model_validator(mode="after")
    def _check(self) -> Manifest:
        if not SERVER_NAME_RE.match(self.name):
            raise ValueError(f"manifest name {self.name!r} must match {SERVER_NAME_RE.pattern}")
        return self

    def enabled_tools(self) -> list[ManifestTool]:
        return [t for t in self.tools if t.enabled]

    def write_set(self) -> list[str]:
        """What the custom tools may write: the declaration, or the output folder."""
        return list(self.writes) if self.writes is not None else [output_dir(self.name)]

    def launch(self, workspace: Path, server_dir: Path, *, self_test: bool = False) -> LaunchSpec:
        """argv/cwd with placeholders expanded for a workspace at `workspace`."""
        subs = {"{workspace}": str(workspace), "{server_dir}": str(server_dir)}

        def expand(s: str) -> str:
            for key, value in subs.items():
                s = s.replace(key, value)
            return s

        args = self.self_test.args if (self_test and self.self_test) else self.args
        return LaunchSpec(
            argv=[expand(self.command), *(expand(a) for a in args)],
            cwd=workspace / expand(self.cwd),
            env={k: expand(v) for k, v in self.env.items()},
        )


class LaunchSpec(BaseModel):
    argv: list[str]
    cwd: Path
    env: dict[str, str] = Field(default_factory=dict)


def load_manifest(server_dir: Path) -> Manifest:
    path = server_dir / "manifest.json"
    if not path.is_file():
        raise UsageError(
            f"{path} is missing.",
            next_step="a server folder needs manifest.json (command, args, cwd, tools, self_test)",
        )
    try:
        return Manifest.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise UsageError(
            f"{path}: {_first_error(exc)}", next_step="fix manifest.json (see a generated one)"
        ) from exc


class GeneratedServer(BaseModel):
    name: str
    server_dir: Path
    skill_dir: Path
    files: list[str] = Field(description="Files written, relative to the workspace root.")
    tools: list[str]
    warnings: list[str] = Field(default_factory=list)


def parse_spec(raw: dict[str, Any] | ServerSpec) -> ServerSpec:
    """A spec from JSON-like data, with the first problem as a UsageError that says what to fix."""
    if isinstance(raw, ServerSpec):
        return raw
    try:
        return ServerSpec.model_validate(raw)
    except ValidationError as exc:
        raise UsageError(f"bad server spec: {_first_error(exc)}", next_step=_SPEC_HINT) from exc


_SPEC_HINT = (
    'fix the spec, e.g. {"name": "rmsnorm-sweeps", "description": "...", "tools": '
    '[{"builtin": "sweep_kernel_config", "presets": {...}}, {"custom": {"function": "f", '
    '"file": "diag.py"}, "probe_args": {}}]}'
)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def server_dir(root: Path, name: str) -> Path:
    return root / STATE / "mcp" / name


def skill_dir(root: Path, name: str) -> Path:
    return root / STATE / "skills" / name


def generate(
    ws: Workspace | Path,
    spec: ServerSpec | dict[str, Any],
    custom_files: dict[str, str] | None = None,
    *,
    python: str | None = None,
    preset_check: PresetCheck | None = None,
) -> GeneratedServer:
    """Write the server folder and its skill. Raises UsageError for a bad name, an unknown
    built-in, a missing custom file or function; code that does not parse is written anyway
    (qualification reports it precisely) and listed in `warnings`."""
    root = (ws.root if isinstance(ws, Workspace) else Path(ws)).resolve()
    spec = parse_spec(spec)
    sdir, kdir = server_dir(root, spec.name), skill_dir(root, spec.name)
    files = dict(custom_files or {})
    for fname in files:
        if not CUSTOM_FILE_RE.match(fname) or fname in RESERVED_FILES:
            raise UsageError(
                f"custom file name {fname!r} is not allowed.",
                next_step="use a plain module name such as 'diagnostics.py' (not server.py)",
            )
    warnings, docs = _check_tools(spec, sdir, files, preset_check)
    if spec.writes is not None:
        editable = ws.task.editable if isinstance(ws, Workspace) else []
        spec = spec.model_copy(update={"writes": check_writes(spec.name, spec.writes, editable)})
    command = _portable_python(python or sys.executable, root)
    manifest = build_manifest(spec, command, docs)

    # Written through workspace_files: a symlinked .harnesslab/mcp never sends them elsewhere.
    srel, krel = wf.inside(root, sdir), wf.inside(root, kdir)
    written: list[Path] = []
    for fname, source in files.items():
        wf.write_text(root, f"{srel}/{fname}", source)
        written.append(sdir / fname)
    wf.write_json(root, f"{srel}/manifest.json", manifest.model_dump(mode="json"))
    wf.write_text(root, f"{srel}/server.py", render_server_py(spec.name))
    wf.write_text(root, f"{srel}/tests/test_server.py", gentemplates.TEST_PY)
    wf.write_text(root, f"{srel}/README.md", readme(manifest))
    wf.write_text(root, f"{krel}/SKILL.md", skill_md(manifest, skill_description(spec)))
    written += [
        sdir / "manifest.json",
        sdir / "server.py",
        sdir / "tests" / "test_server.py",
        sdir / "README.md",
        kdir / "SKILL.md",
    ]
    return GeneratedServer(
        name=spec.name,
        server_dir=sdir,
        skill_dir=kdir,
        files=[p.relative_to(root).as_posix() for p in written],
        tools=[t.tool_name for t in spec.tools],
        warnings=warnings,
    )


def render_server_py(name: str) -> str:
    """The toolkit's server.py for the server `name`: the only one it runs."""
    return gentemplates.SERVER_PY.replace("{{NAME}}", name)


def check_server_py(server_dir: Path, name: str) -> None:
    """UsageError unless `server_dir`/server.py is exactly the toolkit's rendering for `name`
    (the server process runs toolkit code only; the agent's code runs in the sandbox)."""
    path = server_dir / "server.py"
    try:
        same = (
            path.is_file()
            and not path.is_symlink()
            and path.read_bytes() == (render_server_py(name).encode())
        )
    except OSError:
        same = False
    if not same:
        raise UsageError(
            "server.py was edited; regenerate with generate_server (it differs from this "
            "toolkit's own server.py, the only one it runs: edited by hand, or written by "
            "another harnesslab version).",
            next_step=f"call generate_server for {name!r} again (custom code belongs in its "
            "own .py files), then self_test_server",
        )


def build_manifest(spec: ServerSpec, command: str, docs: dict[str, str] | None = None) -> Manifest:
    """The manifest of a spec; `docs` (tool name -> docstring) describes custom tools that the
    spec gives no description."""
    rel = f"{STATE}/mcp/{spec.name}"
    tools = [
        ManifestTool(
            name=t.tool_name,
            kind="builtin" if t.builtin else "custom",
            builtin=t.builtin,
            function=t.custom.function if t.custom else None,
            file=t.custom.file if t.custom else None,
            description=t.description or (docs or {}).get(t.tool_name, ""),
            presets=t.presets,
            probe_args=t.probe_args,
            timeout_s=t.timeout_s,
            verifier=t.is_verifier,
            read_only=t.read_only,
        )
        for t in spec.tools
    ]
    from importlib.metadata import PackageNotFoundError, version

    try:
        generator = f"harnesslab {version('harnesslab')}"
    except PackageNotFoundError:
        generator = "harnesslab"
    return Manifest(
        name=spec.name,
        description=spec.description,
        command=command,
        args=[f"{rel}/server.py", "--workspace", "."],
        cwd=".",
        startup_timeout_s=spec.startup_timeout_s,
        tool_timeout_s=max(t.timeout_s for t in tools),
        tools=tools,
        self_test=SelfTest(
            args=[f"{rel}/server.py", "--workspace", ".", "--self-test"],
            timeout_s=spec.startup_timeout_s + sum(t.timeout_s for t in tools),
        ),
        tests="tests",
        generator=generator,
        writes=spec.writes if spec.writes is not None else [output_dir(spec.name)],
    )


def skill_description(spec: ServerSpec) -> str:
    names = ", ".join(t.tool_name for t in spec.tools)
    when = spec.when_to_use or f"Use it when working on this workspace's task and you need {names}."
    text = " ".join(f"{spec.description.strip()} {when.strip()} (MCP server '{spec.name}')".split())
    return text[:SKILL_DESCRIPTION_MAX]


def _check_tools(
    spec: ServerSpec, sdir: Path, files: dict[str, str], preset_check: PresetCheck | None
) -> tuple[list[str], dict[str, str]]:
    """(warnings, docstrings of the custom functions by tool name); raises for what cannot work."""
    warnings: list[str] = []
    docs: dict[str, str] = {}
    parsed: dict[str, ast.Module | None] = {}
    for tool in spec.tools:
        if tool.builtin is not None:
            if tool.builtin not in KNOWN_BUILTINS:
                raise UsageError(
                    f"tool {tool.tool_name!r}: unknown built-in {tool.builtin!r}.",
                    next_step=f"use one of: {', '.join(KNOWN_BUILTINS)}",
                )
            if preset_check is not None:
                problems = preset_check(tool.builtin, tool.presets, tool.probe_args)
                if problems:
                    raise UsageError(
                        f"tool {tool.tool_name!r} ({tool.builtin}): {'; '.join(problems)}",
                        next_step="fix presets/probe_args to match the built-in's arguments",
                    )
            continue
        ref = tool.custom
        assert ref is not None
        if ref.file not in parsed:
            source = files.get(ref.file)
            rel = f"{STATE}/mcp/{spec.name}/{ref.file}"
            if source is None and wf.is_file(sdir.parents[2], rel):
                source = wf.read_text(sdir.parents[2], rel)
            if source is None:
                raise UsageError(
                    f"tool {tool.tool_name!r}: custom file {ref.file!r} is missing.",
                    next_step=f"pass it in custom_files or write it to {sdir / ref.file}",
                )
            try:
                parsed[ref.file] = ast.parse(source, filename=ref.file)
            except SyntaxError as exc:
                parsed[ref.file] = None
                warnings.append(
                    f"{ref.file}: SyntaxError at line {exc.lineno}: {exc.msg}; the server will "
                    "not start and qualification will fail until it is fixed"
                )
        module = parsed[ref.file]
        if module is None:
            continue
        defs = {
            n.name: n for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        node = defs.get(ref.function)
        if node is None:
            have = ", ".join(sorted(defs)) or "none"
            raise UsageError(
                f"tool {tool.tool_name!r}: {ref.file} has no function {ref.function!r} "
                f"(top-level functions: {have}).",
                next_step=f"define `async def {ref.function}(...)` in {ref.file} or fix the spec",
            )
        if not isinstance(node, ast.AsyncFunctionDef):
            raise UsageError(
                f"tool {tool.tool_name!r}: {ref.file}:{ref.function} is not async.",
                next_step=f"declare it `async def {ref.function}(...)`",
            )
        args = node.args
        if any(a.arg == REFUSED_PARAM for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)):
            raise state_refusal(f"tool {tool.tool_name!r}: {ref.file}:{ref.function}")
        docs[tool.tool_name] = " ".join((ast.get_docstring(node) or "").split())
    return warnings, docs


def _portable_python(python: str, root: Path) -> str:
    """The interpreter for the manifest; relative when it lives inside the workspace (a venv in
    the project), so no absolute path into the workspace is written."""
    path = Path(python)
    if path.is_absolute():
        try:
            return "./" + path.relative_to(root).as_posix()
        except ValueError:
            return python
    return python


def readme(m: Manifest) -> str:
    rows = "\n".join(
        f"| `{t.name}` | {t.kind}{f' ({t.builtin})' if t.builtin else ''} | "
        f"{t.timeout_s:g} | `{json.dumps(t.presets or t.probe_args)}` |"
        for t in m.tools
    )
    return f"""# {m.name}

{m.description}

Generated by {m.generator or "harnesslab"}; `manifest.json` is the description of this server
(command, arguments, tools, timeouts, self-test). Regenerate through the meta-server rather than
editing `server.py`.

| tool | kind | timeout (s) | presets / probe arguments |
|---|---|---|---|
{rows}

Run from the workspace root: the stdio MCP server, its self-test, its tests.

    {m.command} {" ".join(m.args)}
    {m.command} {" ".join(m.self_test.args if m.self_test else m.args)}
    python -m pytest {m.args[0].rsplit("/", 1)[0] if m.args else "."}/tests -q

Custom tools are `async def` functions in this folder. They run in a sandboxed worker process:
read access to the workspace (this folder included), write access only to
{", ".join(f"`{w}`" for w in m.write_set()) or "nothing"} (manifest `writes`: the output folder
`{output_dir(m.name)}/` unless the spec declares editable files too), no network, nothing left
running after the server. A parameter named `workspace` receives the workspace root (a Path) and
is not shown to the model; parameters and results are JSON. `server.py` is the toolkit's own
(an edited copy is refused): regenerate rather than edit it.
"""


def skill_md(m: Manifest, description: str) -> str:
    tools = "\n".join(
        f"- `{t.name}`: {t.description or (f'built-in {t.builtin} with presets' if t.builtin else 'custom tool')}"
        f"{f' (presets: `{json.dumps(t.presets)}`)' if t.presets else ''}"
        for t in m.tools
    )
    desc = description.replace("\n", " ")
    return f"""---
name: {m.name}
description: {json.dumps(desc)}
---

# {m.name}

{m.description}

This skill comes with the MCP server `{m.name}` (registered in this workspace's `.mcp.json` /
`.codex/config.toml`). Its tools:

{tools}

Call them through MCP like any other tool; each answers within its timeout. What its custom
tools write lands in {", ".join(f"`{w}`" for w in m.write_set()) or "nothing"}. If a tool is
missing, the server was quarantined or not registered: run `list_servers` on the meta-server.
"""


__all__ = [
    "KNOWN_BUILTINS",
    "SERVER_NAME_RE",
    "CustomRef",
    "GeneratedServer",
    "LaunchSpec",
    "Manifest",
    "ManifestTool",
    "PresetCheck",
    "SelfTest",
    "ServerSpec",
    "ToolSpec",
    "check_server_py",
    "generate",
    "load_manifest",
    "parse_spec",
    "render_server_py",
    "server_dir",
    "skill_dir",
]
