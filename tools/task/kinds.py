"""Task kinds: what differs between a kernel task and a command task, in one object per kind.

Callers ask a task's kind (`kind_of(task)`) instead of testing `task.kind == ...`: which tools
apply, which case set a full run is, the score's unit and direction, what a new workspace gets
from the template, whether the task's folder must stay outside the workspace, whether the final
score is the guarded verify's on hidden cases. A new kind (a "bring your own kernel" task) is
one subclass registered in KINDS, and tests/tasks/test_task_contract.py runs over every task.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from .spec import TaskSpec

# The tools that work on every kind of task (the rest need a kernel the runner can import).
GENERIC_TOOLS = frozenset(
    {"inspect_context", "run_objective", "rank_history", "restore_best_checkpoint",
     "remote_health_check"}
)  # fmt: skip


class TaskKind:
    """The behaviour of one kind of task (a stateless singleton in KINDS)."""

    name: ClassVar[str]
    # The candidate is a kernel the runner imports: every tool applies, dev cases are named
    # shapes, a launch config is read, and the final score is the guarded verify's on cases
    # drawn from a secret (rotated for the loop's final verify).
    runs_kernel: ClassVar[bool]
    # The case set of a full run: scores compare only within one.
    full_case_set: ClassVar[str]

    def applies(self, tool: str) -> bool:
        """Whether the MCP tool `tool` works on this kind of task."""
        return self.runs_kernel or tool in GENERIC_TOOLS

    def unit(self, task: TaskSpec) -> str:
        """What a score counts."""
        return "us"

    def higher_is_better(self, task: TaskSpec) -> bool:
        return False

    def template(self, task: TaskSpec) -> Path | None:
        """The folder a new workspace is copied from (None: only task.md)."""
        raise NotImplementedError

    def problems(self, task: TaskSpec) -> list[str]:
        """What task.toml lacks for this kind (empty: a valid task)."""
        raise NotImplementedError


class KernelKind(TaskKind):
    name = "kernel"
    runs_kernel = True
    full_case_set = "all"  # run_objective with every dev case

    def template(self, task: TaskSpec) -> Path | None:
        return task.workspace_template

    def problems(self, task: TaskSpec) -> list[str]:
        out = []
        if ":" not in task.entry:
            out.append("kernel tasks need entry = 'file.py:function'")
        if not task.dev_cases or task.final is None:
            out.append("kernel tasks need dev_cases and a [final] domain")
        out += [f"no tolerance for dtype {d}" for d in task.dtypes if d not in task.tolerances]
        return out


class CommandKind(TaskKind):
    """Any folder with a task.md and an objective command printing JSON with a score key."""

    name = "command"
    runs_kernel = False
    full_case_set = "command"  # a command task's objective is one fixed case set

    def unit(self, task: TaskSpec) -> str:
        return task.score_key

    def higher_is_better(self, task: TaskSpec) -> bool:
        return task.higher_is_better

    def template(self, task: TaskSpec) -> Path | None:
        folder = task.root / "workspace"
        return folder if folder.is_dir() else None

    def problems(self, task: TaskSpec) -> list[str]:
        return [] if task.objective else ["command tasks need objective = 'command printing JSON'"]


KINDS: dict[str, TaskKind] = {k.name: k for k in (KernelKind(), CommandKind())}


def kind_of(task: TaskSpec) -> TaskKind:
    return KINDS[task.kind]


__all__ = ["GENERIC_TOOLS", "KINDS", "CommandKind", "KernelKind", "TaskKind", "kind_of"]
