"""Where a generated server's custom tools may write: the declared write set.

The agent's custom code runs in a sandbox that can write only the paths of its server's write
set (tools/meta/custom_host.py grants them, Landlock enforces them): the server's output folder
`.harnesslab/out/<name>/` (the default) or folders below it, and files the task declares
editable. Never the workspace root, a client's configuration (`.mcp.json`, `.claude/`,
`.codex/`, `.agents/`), a skill, the rest of `.harnesslab/` or anything else a client reads or
runs. The output folder is outside the server's bundle, so what the tools write never changes
what was qualified.

Trusted side of the boundary: the write set is the agent's declaration, checked here where the
spec is generated and again where the worker starts.
"""

from __future__ import annotations

from ..errors import UsageError
from ..state import workspace_files as wf
from ..state.workspace_files import STATE

# What a client reads, runs or injects into the agent's context: never in a write set, even
# where a task would declare it editable.
CLIENT_PATHS = frozenset(
    {".mcp.json", ".claude", ".codex", ".agents", "skills", STATE, "CLAUDE.md", "CLAUDE.local.md",
     "AGENTS.md", "AGENTS.override.md", ".git", ".vscode", ".cursor"}
)  # fmt: skip


def output_dir(name: str) -> str:
    """A generated server's output folder, relative to the workspace root."""
    return f"{STATE}/out/{name}"


def is_output(name: str, rel: str) -> bool:
    out = output_dir(name)
    return rel == out or rel.startswith(out + "/")


def check_writes(name: str, writes: list[str], editable: list[str]) -> list[str]:
    """The write set of server `name`, each entry checked: the output folder or a folder below
    it, or a file of `editable` (the task's); never a path a client reads or runs. UsageError
    naming the first entry that is not allowed."""
    checked = []
    for rel in writes:
        pure = wf.check_relative(rel, what="writes entry").as_posix()
        editable_file = pure in editable and pure.split("/")[0] not in CLIENT_PATHS
        if not (is_output(name, pure) or editable_file):
            raise UsageError(
                f"writes: {rel!r} is not a place a custom tool may write.",
                next_step=f"write into {output_dir(name)}/ (the server's output folder) or a "
                f"file the task declares editable ({', '.join(editable) or 'none'}); never the "
                "workspace root, .mcp.json, .claude/, .codex/, .agents/, skills or the rest of "
                ".harnesslab/",
            )
        checked.append(pure)
    return checked


__all__ = ["CLIENT_PATHS", "check_writes", "is_output", "output_dir"]
