"""The kernel task server: the nine MUST tools of DESIGN.md bound to one workspace.

    state = ServerState.open(Path("ws"), Settings())
    server = build_task_server(state)    # an mcp MCPServer; run it over stdio or HTTP

Command tasks (task.toml kind = "command") get the same nine tools: run_objective,
rank_history and restore_best_checkpoint work on them, the kernel-only ones answer with a
ToolError that says so.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from harnesslab.tools.catalog import TASK_TOOLS

from .builtin import BUILTINS, ServerState, register_builtin

TASK_TOOL_NAMES = TASK_TOOLS


def instructions(state: ServerState) -> str:
    task = state.workspace.task
    return (
        f"Tools for optimizing the {task.name} task in {state.workspace.root} "
        f"({task.kind} task: edit {', '.join(task.editable)}). Start with inspect_context; "
        "score edits with run_objective; tune launch configs with sweep_kernel_config; check "
        "numerics with numerical_probe; confirm a new best with guarded_final_verify; "
        "rank_history and restore_best_checkpoint roll back. Every result has a next_step."
    )


def build_task_server(state: ServerState, *, name: str | None = None) -> MCPServer:
    server = MCPServer(
        name or state.name,
        instructions=instructions(state),
        version=_version(),
        warn_on_duplicate_tools=True,
    )
    for tool_name in TASK_TOOL_NAMES:
        register_builtin(server, BUILTINS[tool_name], state)
    return server


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("harnesslab")
    except PackageNotFoundError:
        return "0"


__all__ = ["TASK_TOOL_NAMES", "build_task_server"]
