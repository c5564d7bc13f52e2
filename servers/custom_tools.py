"""Custom tools of a generated server, bound to its MCPServer: the agent's `async def`s run in
one sandboxed worker per server (tools/meta/custom_host.py); this process never imports them.

    worker = bind_custom_tools(server, tools, state, bundle_dir)   # in build_server

Each tool's signature comes from the worker's description, through a fixed annotation table
(`workspace` hidden); every call has its time limit (at most MAX_CUSTOM_TIMEOUT_S; a timed-out
call kills the worker, the next call starts a new one), is recorded in telemetry, and fails as a
ToolError that names the exception type. Results carry the function's own JSON and nothing
else. The worker may write only the server's declared write set (manifest `writes`, checked
against the task's editable files here: tools/meta/writeset.py).
"""

from __future__ import annotations

import inspect
import logging
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

from harnesslab.tools.errors import HarnesslabError, UsageError
from harnesslab.tools.gpu.isolation.sandbox_policy import Limits
from harnesslab.tools.meta.custom_host import (
    CustomToolFailed,
    CustomWorker,
    ToolShape,
    public_signature,
)
from harnesslab.tools.meta.genserver import MAX_CUSTOM_TIMEOUT_S, load_manifest
from harnesslab.tools.meta.writeset import check_writes

from .runtime import Refused, ServerState, traced_call

log = logging.getLogger("harnesslab.custom_tools")


def bind_custom_tools(
    server: MCPServer,
    tools: list[dict[str, Any]],
    state: ServerState,
    bundle: Path,
    *,
    startup_timeout_s: float = 30.0,
    sandbox_report: Path | None = None,
) -> CustomWorker:
    """Describe the manifest's custom `tools` in a new sandboxed worker and add each to
    `server`. UsageError (the server does not start) for a write set that names what a custom
    tool may not write, a module that fails to import, a missing or sync function, or a
    parameter that cannot be served (`state`)."""
    manifest = load_manifest(bundle)
    writes = check_writes(manifest.name, manifest.write_set(), state.workspace.task.editable)
    worker = CustomWorker(
        bundle=bundle,
        workspace=state.workspace.root,
        python=sys.executable,
        require=not state.settings.allow_unsandboxed,
        startup_timeout_s=startup_timeout_s,
        report=sandbox_report,
        limits=Limits.from_dict(state.settings.sandbox_limits()),
        writes=writes,
        seen_at=_seen_at(state),
        name=manifest.name,
    )
    state.closers.append(worker.aclose)
    wanted = [{"file": str(t["file"]), "function": str(t["function"])} for t in tools]
    try:
        shapes = worker.describe(wanted)
        signatures = [
            public_signature(f"tool {t['name']!r} ({t['file']}:{t['function']})", shape)
            for t, shape in zip(tools, shapes, strict=True)
        ]
    except CustomToolFailed as exc:
        worker.kill_now()
        raise UsageError(
            f"the custom tools' modules failed to load: {exc.kind}: {exc.message}",
            next_step="fix the module (the server's stderr has the custom code's own output)",
        ) from None
    except BaseException:
        worker.kill_now()
        raise
    for tool, shape, signature in zip(tools, shapes, signatures, strict=True):
        _bind(server, tool, shape, signature, worker, state)
    return worker


def _seen_at(state: ServerState) -> Path | None:
    """Where qualification shows the custom tools the clean room (the served workspace's path),
    None when served."""
    seen = state.settings.custom_tools_workspace
    if seen is None:
        return None
    if not seen.is_absolute() or not seen.is_dir() or seen == Path("/"):
        raise UsageError(
            f"HARNESSLAB_CUSTOM_TOOLS_WORKSPACE={seen} is not a workspace folder.",
            next_step="unset it: qualification sets it for the servers it starts",
        )
    return seen


def _bind(
    server: MCPServer,
    tool: dict[str, Any],
    shape: ToolShape,
    signature: inspect.Signature,
    worker: CustomWorker,
    state: ServerState,
) -> None:
    name, timeout_s = str(tool["name"]), min(float(tool["timeout_s"]), MAX_CUSTOM_TIMEOUT_S)
    file, function = str(tool["file"]), str(tool["function"])

    async def run(kwargs: dict[str, Any]) -> Any:
        try:
            with anyio.fail_after(timeout_s):
                return await worker.call(file, function, kwargs)
        except TimeoutError:
            raise Refused(
                f"{name} timed out after {timeout_s:g}s and was cancelled. Next: call it with "
                "smaller arguments, or raise timeout_s in the spec and regenerate.",
                error="timeout",
            ) from None
        except CustomToolFailed as exc:
            if exc.kind == "ToolError":  # the tool's own answer to the model
                raise Refused(exc.message, error="ToolError") from None
            raise Refused(
                f"{name} failed: {exc.kind}: {exc.message}", status="crash", error=exc.kind
            ) from None
        except HarnesslabError as exc:  # the worker died or could not start
            raise Refused(
                f"{name} failed: {exc}", status="crash", error=type(exc).__name__
            ) from None

    async def call(**kwargs: Any) -> Any:
        return await traced_call(
            state.telemetry,
            name,
            lambda: run(kwargs),
            arg_names=sorted(kwargs),
            server=state.name,
            crash_detail=False,
        )

    call.__name__ = function
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__annotations__ = {
        n: p.annotation for n, p in signature.parameters.items() if p.annotation is not p.empty
    }
    if signature.return_annotation is not signature.empty:
        call.__annotations__["return"] = signature.return_annotation
    server.add_tool(
        call,
        name=name,
        description=tool.get("description") or shape.doc or name,
        annotations=ToolAnnotations(
            title=name.replace("_", " "),
            read_only_hint=bool(tool.get("read_only", False)),
            destructive_hint=False,
            open_world_hint=False,
        ),
    )


__all__ = ["bind_custom_tools"]
