"""The machinery under every built-in tool: per-server state, the tool record, and
`register_builtin`, which binds a tool to an MCPServer (optionally with preset arguments) and
wraps every call with validation, error mapping and telemetry.

Presets: a preset argument is REMOVED from the tool's input schema, so the model never sees or
sets it; a call that names it anyway is answered with a ToolError. Generated servers use this to
pin, say, `cases` or `mode` for a task-specific tool.

Validation happens here, not in the SDK: each parameter is published with the input model's own
JSON schema (types, bounds, enums, descriptions) but typed `Any` for the SDK, and the input model
validates inside the wrapper. So a bad argument is (1) recorded in telemetry like any call and
(2) answered with a ToolError naming the argument and its allowed values. Every input field must
have a default (the schema lists no required argument): a missing argument reaches the wrapper
too, and the handler says what is missing.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ValidationError, WithJsonSchema

from harnesslab.tools.catalog import TASK_SERVER
from harnesslab.tools.errors import (
    HarnesslabError,
    InfrastructureError,
    UsageError,
    agent_text,
)
from harnesslab.tools.execution import Launcher, build_launcher
from harnesslab.tools.progress import Progress
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import Workspace, open_workspace
from harnesslab.tools.state.storage import disk_full_of
from harnesslab.tools.state.telemetry import CallStatus, Telemetry
from harnesslab.tools.task.kinds import GENERIC_TOOLS, kind_of

log = logging.getLogger("harnesslab.servers")

T = TypeVar("T")
GENERIC_NEXT = "inspect_context shows the task, its cases and the allowed values"
Handler = Callable[["ServerState", Any, "Context | None"], Awaitable[BaseModel]]


@dataclass
class ServerState:
    """What every tool of one server shares: created once per server, closed with it."""

    workspace: Workspace
    launcher: Launcher
    settings: Settings
    telemetry: Telemetry
    name: str = TASK_SERVER
    # Run by aclose() before the launcher closes (a generated server's custom-tool worker).
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @classmethod
    def open(
        cls,
        workspace: Path,
        settings: Settings,
        *,
        name: str = TASK_SERVER,
        launcher: Launcher | None = None,
    ) -> ServerState:
        ws = open_workspace(workspace, settings)
        return cls(
            workspace=ws,
            launcher=launcher or build_launcher(settings),
            settings=settings,
            telemetry=Telemetry(ws.telemetry_path, name, guard=ws.root),
            name=name,
        )

    async def aclose(self) -> None:
        for close in reversed(self.closers):
            await close()
        self.closers.clear()
        await self.launcher.aclose()


@dataclass(frozen=True)
class BuiltinTool:
    """One tool: what the model reads (name, description), what it takes and returns (pydantic
    models), how it behaves (annotations), and the async handler doing the work via tools/."""

    name: str
    title: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    handler: Handler
    read_only: bool
    destructive: bool
    idempotent: bool
    gpu: bool = field(default=False, metadata={"doc": "takes the GPU lock"})

    def __post_init__(self) -> None:
        missing = [n for n, f in self.input_model.model_fields.items() if f.is_required()]
        if missing:
            raise TypeError(f"{self.name}: input fields need defaults: {', '.join(missing)}")

    def annotations(self, title: str | None = None) -> ToolAnnotations:
        return ToolAnnotations(
            title=title or self.title,
            read_only_hint=self.read_only,
            destructive_hint=self.destructive,
            idempotent_hint=self.idempotent,
            open_world_hint=False,
        )


def reporter(ctx: Context | None) -> Progress | None:
    """A Progress callback sending MCP progress notifications (a no-op without a token). A
    client that went away must not fail the work, so send errors are only logged."""
    if ctx is None:
        return None

    async def report(done: float, total: float, message: str) -> None:
        try:
            await ctx.report_progress(done, total, message)
        except Exception as exc:  # boundary: the notification is best-effort
            log.debug("progress notification not sent: %s", exc)

    return report


class Refused(ToolError):
    """A ToolError the wrapper records with its own telemetry status and error code (a bad
    argument, a tool that does not apply, a timed-out custom tool)."""

    def __init__(self, message: str, *, status: CallStatus = "tool_error", error: str) -> None:
        super().__init__(message)
        self.status: CallStatus = status
        self.error = error


def result_bytes(value: Any) -> int:
    """The size of what the model reads: the text content of a CallToolResult, a pydantic
    result as compact JSON without nulls, anything else as JSON."""
    if isinstance(value, CallToolResult):
        return sum(len(c.text) for c in value.content if isinstance(c, TextContent))
    if isinstance(value, BaseModel):
        return len(value.model_dump_json(exclude_none=True))
    return len(json.dumps(value, default=str))


async def traced_call(
    telemetry: Telemetry,
    tool_name: str,
    work: Callable[[], Awaitable[T]],
    *,
    arg_names: list[str],
    server: str | None = None,
    gpu: bool = False,
    generic_next: str = "",
    crash_detail: bool = True,
) -> T:
    """Run one tool call: every server's tools (built-in, meta, generated, custom) go through
    here, so timing, error mapping and telemetry are one mechanism.

    Expected failures (HarnesslabError) become a ToolError with their next step (or
    `generic_next`); `Refused` passes through with its own status; anything else is logged with
    its traceback and answered with a ToolError while the server keeps serving
    (`crash_detail=False`: the exception's type only, for code whose messages may echo hostile
    values). Telemetry records argument names, duration, status, error code and result size."""
    t0 = time.perf_counter()
    status: CallStatus = "ok"
    size = 0
    error = ""
    try:
        out = await work()
        size = result_bytes(out)
        return out
    except Refused as exc:
        status, error = exc.status, exc.error
        raise
    except ToolError:
        status, error = "tool_error", "ToolError"  # never the message: it echoes values
        raise
    except HarnesslabError as exc:
        status, error = "tool_error", type(exc).__name__
        if isinstance(exc, InfrastructureError):  # the blame, for summaries: never the message
            error = f"infrastructure:{exc.kind}"
        raise ToolError(agent_text(exc, generic_next)) from exc
    except OSError as exc:  # a write the store did not name: still a named disk-full fault
        full = disk_full_of(exc)
        if full is None:
            status, error = "crash", type(exc).__name__
            log.exception("tool %s crashed", tool_name)
            raise ToolError(crash_text(exc, crash_detail)) from exc
        status, error = "tool_error", "infrastructure:disk_full"
        log.warning("tool %s: %s", tool_name, full.message)
        raise ToolError(agent_text(full)) from exc
    except anyio.get_cancelled_exc_class():
        status = "cancelled"
        raise
    except Exception as exc:  # boundary: log it, answer with a ToolError, keep serving
        status, error = "crash", type(exc).__name__
        log.exception("tool %s crashed", tool_name)
        raise ToolError(crash_text(exc, crash_detail)) from exc
    finally:
        telemetry.record(
            tool_name,
            arg_names=arg_names,
            duration_s=time.perf_counter() - t0,
            status=status,
            result_bytes=size,
            error=error,
            server=server,
            gpu=gpu,
        )


def crash_text(exc: BaseException, detail: bool) -> str:
    """An unexpected exception, for the agent: its type (and first line, with `detail`)."""
    first = (str(exc).strip().splitlines() or [""])[0][:200] if detail else ""
    return (
        f"internal error: {type(exc).__name__}{': ' + first if first else ''}"
        ". Next: the server keeps serving; retry once, and if it repeats report the "
        "traceback from the server's stderr"
    )


def check_presets(tool: BuiltinTool, presets: dict[str, Any]) -> dict[str, Any]:
    """Validate preset values against the input model's fields; returns them normalised."""
    fields = tool.input_model.model_fields
    unknown = sorted(set(presets) - set(fields))
    if unknown:
        raise UsageError(
            f"{tool.name}: no argument {unknown[0]!r} to preset.",
            next_step=f"arguments are: {', '.join(fields)}",
        )
    defaults = {n: f.get_default(call_default_factory=True) for n, f in fields.items()}
    try:
        model = tool.input_model.model_validate({**defaults, **presets})
    except ValidationError as exc:
        raise UsageError(
            f"{tool.name}: bad preset: {format_errors(tool, exc)}", next_step="fix the preset"
        ) from exc
    return {k: getattr(model, k) for k in presets}


def _allowed(schema: dict[str, Any]) -> str:
    """Allowed values of one argument, from its JSON schema, in words."""
    if "anyOf" in schema:
        return " or ".join(_allowed(s) for s in schema["anyOf"] if s.get("type") != "null")
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    kind = schema.get("type", "value")
    lo, hi = schema.get("minimum"), schema.get("maximum")
    text = str(kind)
    if lo is not None or hi is not None:
        text += f" {'' if lo is None else lo}..{'' if hi is None else hi}"
    if "pattern" in schema:
        text += " matching " + schema["pattern"]
    if kind == "array" and "items" in schema:
        text = f"a list ({schema.get('maxItems', 'any')} at most) of {_allowed(schema['items'])}"
    return text


def format_errors(tool: BuiltinTool, exc: ValidationError) -> str:
    props = tool.input_model.model_json_schema().get("properties", {})
    parts = []
    for err in exc.errors()[:4]:
        loc = [str(p) for p in err.get("loc", ())]
        arg = loc[0] if loc else "arguments"
        got = repr(err.get("input"))[:60]
        allowed = _allowed(props[arg]) if arg in props else ""
        where = ".".join(loc) or "arguments"
        parts.append(f"{where}={got}: {err['msg']}" + (f" (allowed: {allowed})" if allowed else ""))
    return "; ".join(parts)


def _sent_names(ctx: Context | None, kwargs: dict[str, Any]) -> list[str]:
    """Names of the arguments the client actually sent (kwargs has the defaults filled in)."""
    try:
        params = ctx.request_context.params if ctx is not None else None
        sent = (params or {}).get("arguments")
    except (ValueError, AttributeError):
        sent = None
    return sorted(sent) if isinstance(sent, dict) else sorted(kwargs)


def register_builtin(
    server: MCPServer,
    tool: BuiltinTool,
    state: ServerState,
    *,
    name: str | None = None,
    description: str | None = None,
    presets: dict[str, Any] | None = None,
) -> str:
    """Register `tool` on `server` under `name` (default: the tool's own) with `presets` fixed
    (removed from the input schema). Returns the registered name."""
    presets = check_presets(tool, presets or {})
    tool_name = name or tool.name
    schema = tool.input_model.model_json_schema()
    props = schema.get("properties", {})
    if "$defs" in schema:
        raise TypeError(f"{tool.name}: input models must be flat (no nested models)")
    exposed = [n for n in tool.input_model.model_fields if n not in presets]
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    for fname in exposed:
        f = tool.input_model.model_fields[fname]
        params.append(
            inspect.Parameter(
                fname,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[Any, WithJsonSchema(props[fname])],
                default=f.get_default(call_default_factory=True),
            )
        )

    async def call(ctx: Context, **kwargs: Any) -> CallToolResult:
        sent = _sent_names(ctx, kwargs)

        async def work() -> CallToolResult:
            fixed = sorted(set(sent) & set(presets))
            unknown = sorted(set(sent) - set(exposed) - set(presets))
            if fixed or unknown:
                bad = (fixed or unknown)[0]
                why = "is fixed by this server" if fixed else "is not an argument of this tool"
                raise Refused(
                    f"argument {bad!r} {why}. Next: arguments are: {', '.join(exposed) or 'none'}",
                    status="bad_input",
                    error="preset_argument" if fixed else "unknown_argument",
                )
            try:
                args = tool.input_model.model_validate({**kwargs, **presets})
            except ValidationError as exc:
                raise Refused(
                    f"bad arguments: {format_errors(tool, exc)}. Next: fix them and call again",
                    status="bad_input",
                    error="invalid_arguments",
                ) from exc
            task = state.workspace.task
            if not kind_of(task).applies(tool.name):
                raise Refused(
                    f"{tool_name} works on kernel tasks; {task.name!r} is a {task.kind} task. "
                    f"Next: use {', '.join(sorted(GENERIC_TOOLS))}",
                    error="kernel_only",
                )
            out = await tool.handler(state, args, ctx)
            # Compact JSON for the model to read (the SDK would indent it: ~2x the tokens), the
            # full typed result as structured content for programs.
            return CallToolResult(
                content=[TextContent(type="text", text=out.model_dump_json(exclude_none=True))],
                structured_content=out.model_dump(mode="json"),
            )

        return await traced_call(
            state.telemetry,
            tool_name,
            work,
            arg_names=sent,
            server=state.name,
            gpu=tool.gpu,
            generic_next=GENERIC_NEXT,
        )

    call.__signature__ = inspect.Signature(params, return_annotation=tool.output_model)  # type: ignore[attr-defined]
    call.__annotations__ = {"ctx": Context, "return": tool.output_model}
    call.__name__ = tool_name
    server.add_tool(
        call,
        name=tool_name,
        title=tool.title,
        description=description or tool.description,
        annotations=tool.annotations(),
        structured_output=True,
    )
    return tool_name


__all__ = [
    "BuiltinTool",
    "Refused",
    "ServerState",
    "check_presets",
    "register_builtin",
    "reporter",
    "result_bytes",
    "traced_call",
]
