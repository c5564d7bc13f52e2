"""Custom tools of a generated server, bound to its MCPServer: the agent's `async def`s run in
one sandboxed worker per server (tools/meta/custom_host.py); this process never imports them.

    worker = bind_custom_tools(server, tools, state, bundle_dir)   # in build_server

Each tool's signature comes from the worker's description, through a fixed annotation table
(`workspace` hidden); every call has its time limit (a timed-out call kills the worker, the
next call starts a new one), is recorded in telemetry, and fails as a ToolError that names the
exception type. Results carry the function's own JSON and nothing else.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from harnesslab.tools.errors import HarnesslabError, UsageError
from harnesslab.tools.meta.custom_host import (
    CustomToolFailed,
    CustomWorker,
    ToolShape,
    public_signature,
)

from .runtime import ServerState

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
    `server`. UsageError (the server does not start) for a module that fails to import, a
    missing or sync function, or a parameter that cannot be served (`state`)."""
    worker = CustomWorker(
        bundle=bundle,
        workspace=state.workspace.root,
        python=sys.executable,
        require=not state.settings.allow_unsandboxed,
        startup_timeout_s=startup_timeout_s,
        report=sandbox_report,
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


def _bind(
    server: MCPServer,
    tool: dict[str, Any],
    shape: ToolShape,
    signature: inspect.Signature,
    worker: CustomWorker,
    state: ServerState,
) -> None:
    name, timeout_s = str(tool["name"]), float(tool["timeout_s"])
    file, function = str(tool["file"]), str(tool["function"])

    async def call(**kwargs: Any) -> Any:
        started, status, size, error = time.perf_counter(), "ok", 0, ""
        try:
            with anyio.fail_after(timeout_s):
                result = await worker.call(file, function, kwargs)
            size = len(json.dumps(result))
            return result
        except TimeoutError:
            status, error = "tool_error", "timeout"
            raise ToolError(
                f"{name} timed out after {timeout_s:g}s and was cancelled. Next: call it with "
                "smaller arguments, or raise timeout_s in the spec and regenerate."
            ) from None
        except CustomToolFailed as exc:
            if exc.kind == "ToolError":  # the tool's own answer to the model
                status, error = "tool_error", "ToolError"  # never the message: it echoes values
                raise ToolError(exc.message) from None
            status, error = "crash", exc.kind
            raise ToolError(f"{name} failed: {exc.kind}: {exc.message}") from None
        except HarnesslabError as exc:  # the worker died or could not start
            status, error = "crash", type(exc).__name__
            raise ToolError(f"{name} failed: {exc}") from None
        except anyio.get_cancelled_exc_class():
            status = "cancelled"
            raise
        except Exception as exc:  # the server boundary: log the traceback, tell the model why
            status, error = "crash", type(exc).__name__
            log.exception("tool %s failed", name)
            raise ToolError(f"{name} failed: {type(exc).__name__}") from exc
        finally:
            state.telemetry.record(
                name,
                arg_names=sorted(kwargs),
                duration_s=time.perf_counter() - started,
                status=status,  # type: ignore[arg-type]
                result_bytes=size,
                error=error,
                server=state.name,
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
