"""The registry of built-in tools, reused by every server harnesslab runs or generates.

    state = ServerState.open(workspace_dir, settings)          # once per server
    server = MCPServer("my-task")
    register_builtin(server, BUILTINS["run_objective"], state,
                     name="score_small_cases", presets={"cases": ["1024x1024_fp16"]})

A `BuiltinTool` carries the model-facing description (what it does, its GPU cost, what to call
next), pydantic input/output models, annotations and an async handler(state, args, ctx).
`register_builtin` binds it to an MCPServer: presets are removed from the input schema and
fixed; every call is validated, timed and recorded in `.harnesslab/telemetry.jsonl`; expected
failures (HarnesslabError) become a ToolError with the next step; unexpected exceptions are
logged with their traceback on stderr and answered with a ToolError, and the server keeps
serving. Handlers accept ctx=None, so `await tool.handler(state, args, None)` runs a tool from
Python with no MCP session.
"""

from __future__ import annotations

from harnesslab.tools import catalog

from .runtime import BuiltinTool, ServerState, check_presets, register_builtin, reporter
from .task_tools import TASK_TOOLS

BUILTINS: dict[str, BuiltinTool] = {t.name: t for t in TASK_TOOLS}
if tuple(BUILTINS) != catalog.TASK_TOOLS:  # one list of names: tools/catalog.py
    raise ImportError(
        f"servers/task_tools.py defines {list(BUILTINS)}, tools/catalog.py names "
        f"{list(catalog.TASK_TOOLS)}: add the tool's name to catalog.TASK_TOOLS"
    )

__all__ = [
    "BUILTINS",
    "BuiltinTool",
    "ServerState",
    "check_presets",
    "register_builtin",
    "reporter",
]
