"""Tasks: a task folder's task.toml parsed into a `TaskSpec`, and where shipped tasks live.

Side of the trust boundary: trusted (a task's reference and domain decide what is correct); a
task folder is taken only from the operator, never from a workspace.
"""

from .spec import Case, FinalDomain, TaskSpec, list_tasks, load_task

__all__ = ["Case", "FinalDomain", "TaskSpec", "list_tasks", "load_task"]
