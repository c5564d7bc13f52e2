"""Task authoring: new task folders from the user's own reference (`harnesslab task new`,
task_new), from KernelBench-format files (`harnesslab task import-kernelbench`, kernelbench with
kernelbench_sizes), and from a HarnessGym task folder (`harnesslab import harnessgym`,
harnessgym_import); the folder writer they share (scaffold) and the one run of each new task's
baseline against its reference (baseline_check).

It sits above state/ and evaluation/ (it reads the source folder through the workspace gate and
runs baselines through run_objective); nothing below it imports it.

Side of the trust boundary: host side, trusted; it runs the user's own files as the user asked
(the folder it writes is an ordinary task folder, bound like any other).

Names are imported on first use: the KernelBench importer imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_surface

if TYPE_CHECKING:
    from .baseline_check import check_baselines
    from .kernelbench import import_kernelbench
    from .scaffold import TaskRow, failed_check, record_check, write_task
    from .task_new import plan_new

_NAMES = {
    "check_baselines": "baseline_check",
    "import_kernelbench": "kernelbench",
    "TaskRow": "scaffold",
    "failed_check": "scaffold",
    "record_check": "scaffold",
    "write_task": "scaffold",
    "plan_new": "task_new",
}
__getattr__, __dir__ = lazy_surface(__name__, _NAMES)
__all__ = [
    "TaskRow",
    "check_baselines",
    "failed_check",
    "import_kernelbench",
    "plan_new",
    "record_check",
    "write_task",
]
