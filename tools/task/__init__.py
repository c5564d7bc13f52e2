"""Tasks: a task folder's task.toml parsed into a `TaskSpec`, its kind (`kind_of(task)`: what
differs between a kernel and a command task), and where shipped tasks live. Writing new task
folders (task new, the importers) is authoring/'s.

Side of the trust boundary: trusted (a task's reference and domain decide what is correct); a
task folder is taken only from the operator, never from a workspace.
"""

from .case import DTYPES
from .kinds import TaskKind, kind_of
from .spec import Case, FinalDomain, TaskSpec, list_tasks, load_task

__all__ = [
    "DTYPES",
    "Case",
    "FinalDomain",
    "TaskKind",
    "TaskSpec",
    "kind_of",
    "list_tasks",
    "load_task",
]
