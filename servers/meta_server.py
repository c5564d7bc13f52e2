"""The meta-server: an agent turns what it learned into a task-specific MCP server, and the
toolkit decides whether that server is fit for the next fresh session.

    server = build_meta_server(open_workspace(Path("ws"), settings), settings)

Tools (DESIGN.md MUST names): generate_server, self_test_server, register_server, list_servers,
quarantine_server. The work happens in tools/meta/genserver.py, tools/meta/qualification.py and
tools/meta/registry.py; this module validates, reports progress, records telemetry and shapes results.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from harnesslab.tools.catalog import META_SERVER
from harnesslab.tools.errors import UsageError
from harnesslab.tools.meta import QualificationReport, qualify_workspace_server, registry
from harnesslab.tools.meta.genserver import ServerSpec, ToolSpec, generate, parse_spec
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import Workspace
from harnesslab.tools.state.telemetry import Telemetry

from .builtin import BUILTINS, check_presets
from .runtime import reporter, traced_call

log = logging.getLogger("harnesslab.meta")
SERVER_NAME = META_SERVER
ServerName = Annotated[
    str, Field(description="server name: lowercase letters/digits joined by '-'", max_length=64)
]
T = TypeVar("T", bound=BaseModel)

INSTRUCTIONS = (
    "Build task-specific MCP servers for this workspace. Write a spec (built-in tools with "
    "preset arguments, or custom async functions) -> generate_server -> self_test_server "
    "(qualification in a clean copy of the workspace) -> register_server (projects it into "
    ".mcp.json, .codex/config.toml and the skills folders for the NEXT session). A server that "
    "fails qualification is quarantined; its failure_report.md says what to fix."
)


class GenerateOut(BaseModel):
    name: str
    server_dir: str = Field(description="relative to the workspace root")
    files: list[str]
    tools: list[str]
    warnings: list[str]
    status: str
    next_step: str


class CheckOut(BaseModel):
    name: str
    passed: bool
    evidence: str = Field(description="first lines of the evidence (full text in the report)")
    duration_s: float


class QualifyOut(BaseModel):
    name: str
    qualified: bool
    status: str = Field(description="registry status after this run: qualified or quarantined")
    failed: list[str] = Field(description="names of the failed checks")
    reason: str = Field(description="the failed checks with their evidence, in one line")
    checks: list[CheckOut]
    duration_s: float
    report: str = Field(description="qualification.json, relative to the workspace root")
    failure_report: str = Field(description="failure_report.md to paste into a repair prompt")
    next_step: str


class ServerOut(BaseModel):
    name: str
    status: Literal["generated", "qualified", "registered", "quarantined"]
    tools: list[str]
    report: str
    failure_report: str
    reason: str
    projected: list[str]
    updated: float


class RegisterOut(BaseModel):
    server: ServerOut
    next_step: str


class ListOut(BaseModel):
    servers: list[ServerOut]
    next_step: str


def _server_out(rec: registry.ServerRecord) -> ServerOut:
    return ServerOut(**rec.model_dump(include=set(ServerOut.model_fields)))


def preset_check(builtin: str, presets: dict[str, Any], probe_args: dict[str, Any]) -> list[str]:
    """Presets and probe arguments against the built-in's input model (for generate)."""
    tool = BUILTINS[builtin]
    problems = []
    fixed = sorted(set(presets) & set(probe_args))
    if fixed:
        problems.append(f"probe_args set {', '.join(fixed)}, which the presets fix")
    for what, values in (("preset", presets), ("probe argument", {**presets, **probe_args})):
        try:
            check_presets(tool, values)
        except UsageError as exc:
            problems.append(f"{what}: {exc.message} {exc.next_step}".strip())
            break
    return problems


def build_meta_server(ws: Workspace, settings: Settings, *, name: str = SERVER_NAME) -> MCPServer:
    server = MCPServer(name, instructions=INSTRUCTIONS)
    telemetry = Telemetry(ws.telemetry_path, name, guard=ws.root)
    root = ws.root

    def tool(
        *, read_only: bool, destructive: bool, idempotent: bool, title: str
    ) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
        """Register with annotations; every call goes through the servers' one wrapper
        (runtime.traced_call: telemetry, error mapping)."""

        def bind(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
            @functools.wraps(fn)
            async def call(**kwargs: Any) -> T:
                return await traced_call(
                    telemetry,
                    fn.__name__,
                    lambda: fn(**kwargs),
                    arg_names=[k for k in kwargs if k != "ctx"],
                )

            server.add_tool(
                call,
                name=fn.__name__,
                description=fn.__doc__,
                annotations=ToolAnnotations(
                    title=title,
                    read_only_hint=read_only,
                    destructive_hint=destructive,
                    idempotent_hint=idempotent,
                    open_world_hint=False,
                ),
                structured_output=True,
            )
            return call

        return bind

    @tool(read_only=False, destructive=True, idempotent=True, title="Generate an MCP server")
    async def generate_server(
        name: ServerName,
        description: Annotated[
            str, Field(description="what the server is for (10-1000 characters)")
        ],
        tools: Annotated[
            list[ToolSpec],
            Field(
                description="the tools: {builtin, name?, presets, probe_args, description?} "
                "binds a built-in with fixed arguments; {custom: {function, file}, probe_args} "
                "exposes an `async def` from a .py file in the server folder"
            ),
        ],
        custom_files: Annotated[
            dict[str, str] | None,
            Field(description="file name -> Python source, written into the server folder"),
        ] = None,
        when_to_use: Annotated[
            str | None, Field(description="for its skill: when a session should use it")
        ] = None,
        writes: Annotated[
            list[str] | None,
            Field(
                description="what the custom tools may write besides nothing: their output "
                "folder .harnesslab/out/<name> (the default) or folders below it, and/or files "
                "the task declares editable (e.g. 'kernel_config.json')"
            ),
        ] = None,
    ) -> GenerateOut:
        """Write a task-specific MCP server into .harnesslab/mcp/<name>/ (server.py, manifest,
        tests, README) and its skill into .harnesslab/skills/<name>/SKILL.md. Each tool is a
        built-in (inspect_context, run_objective, sweep_kernel_config, numerical_probe,
        guarded_final_verify, rank_history, restore_best_checkpoint, profile_kernel,
        remote_health_check) with preset arguments fixed, or a custom `async def` that runs in
        a sandbox (it reads the workspace; it writes only its output folder
        .harnesslab/out/<name>/, or what `writes` declares: editable task files; no network;
        at most 600 s a call) with JSON arguments and result; a parameter named `workspace`
        (Path) is filled in by the server (`state` is refused: use a built-in for runs). Never
        edit server.py: an edited one is refused. probe_args must be ONE small, fast call (a
        single dev case): qualification runs each tool with them several times, in a fresh
        server too. Regenerating replaces the server and unregisters it. Costs no GPU time.
        Next: self_test_server."""
        spec: ServerSpec = parse_spec(
            {
                "name": name,
                "description": description,
                "tools": [t.model_dump(exclude_none=True) for t in tools],
                "when_to_use": when_to_use,
                "writes": writes,
            }
        )
        made = await anyio.to_thread.run_sync(
            functools.partial(
                generate, ws, spec, custom_files, python=settings.python, preset_check=preset_check
            )
        )
        registry.record_generated(ws, made.name, made.tools)
        return GenerateOut(
            name=made.name,
            server_dir=made.server_dir.relative_to(root).as_posix(),
            files=made.files,
            tools=made.tools,
            warnings=made.warnings,
            status="generated",
            next_step=f"self_test_server(name={made.name!r}) to qualify it in a clean room"
            + (" (fix the warnings first: it will fail)" if made.warnings else ""),
        )

    @tool(read_only=False, destructive=False, idempotent=True, title="Qualify a server")
    async def self_test_server(
        name: ServerName,
        ctx: Context,
        timeout_s: Annotated[
            float, Field(ge=10, le=1800, description="limit for the whole qualification")
        ] = 300,
    ) -> QualifyOut:
        """Qualify a generated server in a clean room: a fresh copy of the task's workspace
        template plus only the server's bundle. Starts it over stdio with a real MCP client;
        checks tools/list schemas, calls each tool with its probe_args, runs its --self-test and
        its own tests, requires nothing but protocol on stdout and no absolute paths into this
        workspace, makes a verifier-like tool reject cheating kernels, and calls the custom
        tools again in a server started anew. Passing marks it
        qualified; failing QUARANTINES it, with a failure report to fix it from. Costs about
        10-60 s of CPU/GPU time. Next: register_server, or fix and generate again."""

        report: QualificationReport = await qualify_workspace_server(
            ws, name, settings, timeout_s=timeout_s, progress=reporter(ctx)
        )
        rel = lambda p: Path(p).relative_to(root).as_posix() if p else ""  # noqa: E731
        status = registry.load_registry(ws).servers[name].status
        return QualifyOut(
            name=name,
            qualified=report.passed,
            status=status,
            failed=[c.name for c in report.failed()],
            reason=report.reason(),
            checks=[
                CheckOut(
                    name=c.name,
                    passed=c.passed,
                    evidence="\n".join(c.evidence.splitlines()[:8])[:800],
                    duration_s=c.duration_s,
                )
                for c in report.checks
            ],
            duration_s=report.duration_s,
            report=rel(report.report_path),
            failure_report=rel(report.failure_report_path),
            next_step=(
                f"register_server(name={name!r}) to hand it to the next session"
                if report.passed
                else f"read {rel(report.failure_report_path)}, fix the server (generate_server "
                "again with the fix), then self_test_server"
            ),
        )

    @tool(read_only=False, destructive=False, idempotent=True, title="Register a server")
    async def register_server(name: ServerName) -> RegisterOut:
        """Hand a QUALIFIED server to the clients: add it to .mcp.json (Claude Code) and
        .codex/config.toml (Codex, with startup/tool timeouts) and copy its skill into
        .claude/skills and .agents/skills. Refused for a server that failed, was never
        qualified, or changed since it qualified. The running session does not see it; the
        next one does. Next: list_servers."""
        rec = registry.register(ws, name, env=settings.to_env())
        return RegisterOut(
            server=_server_out(rec),
            next_step="the next agent session gets its tools and skill; list_servers shows it",
        )

    @tool(read_only=True, destructive=False, idempotent=True, title="List generated servers")
    async def list_servers() -> ListOut:
        """Every generated server of this workspace with its status (generated, qualified,
        registered, quarantined), its tools, its qualification report and, when quarantined,
        the reason. Cheap. Next: self_test_server or register_server as the status says."""
        servers = [_server_out(r) for r in registry.list_servers(ws)]
        waiting = [s.name for s in servers if s.status == "qualified"]
        return ListOut(
            servers=servers,
            next_step=(
                f"register_server for {', '.join(waiting)}"
                if waiting
                else "generate_server to build one"
                if not servers
                else "nothing pending"
            ),
        )

    @tool(read_only=False, destructive=True, idempotent=True, title="Quarantine a server")
    async def quarantine_server(
        name: ServerName,
        reason: Annotated[str, Field(max_length=500, description="why, for the inventory")],
    ) -> RegisterOut:
        """Withdraw a server: remove it from .mcp.json, .codex/config.toml and the skills
        folders, and mark it quarantined with the reason. Its files stay for repair. Next:
        fix it, generate_server again, self_test_server."""
        rec = registry.quarantine(ws, name, reason)
        return RegisterOut(
            server=_server_out(rec),
            next_step="fix it, then generate_server and self_test_server again",
        )

    return server


__all__ = ["SERVER_NAME", "build_meta_server", "preset_check"]
