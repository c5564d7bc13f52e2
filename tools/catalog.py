"""The names other programs rely on, in one place: the toolkit's MCP servers and their tools
(DESIGN.md's MUST names), and the server modules tools/ starts as processes (tools/ never
imports servers/; it runs them with `python -m`).

servers/builtin.py refuses to import when its built-in tools differ from TASK_TOOLS, so a tool
added to the task server is served, generated, projected into a turn and approved for the agent
CLIs from this one list.
"""

from __future__ import annotations

import re
import sys

TASK_SERVER = "harnesslab-task"
META_SERVER = "harnesslab-meta"
TASK_TOOLS = (
    "inspect_context",
    "run_objective",
    "sweep_kernel_config",
    "numerical_probe",
    "guarded_final_verify",
    "rank_history",
    "restore_best_checkpoint",
    "profile_kernel",
    "remote_health_check",
)
META_TOOLS = (
    "generate_server",
    "self_test_server",
    "register_server",
    "list_servers",
    "quarantine_server",
)
# A generated server's name (its folder, its client config key, its skill).
SERVER_NAME_RE = re.compile(r"^(?=.{1,64}$)[a-z0-9]+(?:-[a-z0-9]+)*$")
SERVERS_MODULE = "harnesslab.servers"  # the CLI: `python -m harnesslab.servers COMMAND`
AUTOPILOT_MODULE = "harnesslab.servers.autopilot"  # the built-in MCP client that plays the agent
QUALIFY_CLIENT_MODULE = "harnesslab.servers.qualify_client"  # qualification's MCP client


def harnesslab_argv(*args: str) -> list[str]:
    """argv that runs the `harnesslab` command with this interpreter."""
    return [sys.executable, "-m", SERVERS_MODULE, *args]


__all__ = [
    "AUTOPILOT_MODULE",
    "META_SERVER",
    "META_TOOLS",
    "QUALIFY_CLIENT_MODULE",
    "SERVERS_MODULE",
    "SERVER_NAME_RE",
    "TASK_SERVER",
    "TASK_TOOLS",
    "harnesslab_argv",
]
