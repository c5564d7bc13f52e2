"""harnesslab's typed library: everything the MCP servers do, callable from Python with no MCP.

    from harnesslab.tools import Settings, build_launcher, open_workspace, run_objective

Subpackages by concern, each importing only those ranked below it (docs/architecture.md has
the ranks; tests/tools/test_layers.py checks them): gpu/ (the files staged to the GPU host),
task/ (TaskSpec, task kinds), state/ (trusted store, workspace, ledger, checkpoints), execution/
(executors, launcher, health), evaluation/ (objective, sweep, probe, profile, history, overview),
integrity/ (guarded verify, scan, cheat corpus), meta/ (generated servers, qualification,
registry), lab/ (the kernel lab), authoring/ (task new, the KernelBench and HarnessGym
importers), loop/ (`harnesslab run`), dashboard/ (the operator's page, as data). errors.py,
settings.py and catalog.py are shared by all of them. tools/ never imports mcp or servers/.

The names below are the README's "from Python" surface, imported on first use. Module paths of
the flat layout before the subpackages (harnesslab.tools.workspace, ...) still import, with a
DeprecationWarning naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import TYPE_CHECKING

from ._lazy import lazy_surface

if TYPE_CHECKING:
    from .errors import HarnesslabError
    from .evaluation import (
        numerical_probe,
        profile_kernel,
        rank_history,
        restore_candidate,
        run_objective,
        run_step_objective,
    )
    from .evaluation.command import run_command_objective
    from .evaluation.overview import overview
    from .evaluation.sweep import sweep
    from .execution import Launcher, build_launcher, health_check
    from .integrity import guarded_verify, public_verdict
    from .settings import Settings
    from .state import Workspace, init_workspace, open_workspace
    from .task import TaskSpec, load_task

_NAMES = {
    "HarnesslabError": "errors",
    "Launcher": "execution",
    "Settings": "settings",
    "TaskSpec": "task",
    "Workspace": "state",
    "build_launcher": "execution",
    "guarded_verify": "integrity",
    "health_check": "execution",
    "init_workspace": "state",
    "load_task": "task",
    "numerical_probe": "evaluation",
    "open_workspace": "state",
    "overview": "evaluation.overview",
    "profile_kernel": "evaluation",
    "public_verdict": "integrity",
    "rank_history": "evaluation",
    "restore_candidate": "evaluation",
    "run_command_objective": "evaluation.command",
    "run_objective": "evaluation",
    "run_step_objective": "evaluation",
    "sweep": "evaluation.sweep",
}
__getattr__, __dir__ = lazy_surface(__name__, _NAMES)

# harnesslab.tools.<old> -> harnesslab.tools.<new> (the flat layout, until the next release).
MOVED = {
    "agent_clis": "loop.agent_clis",
    "agent_process": "loop.agent_process",
    "agent_runners": "loop.runners",
    "agent_turn": "loop.turn",
    "checkpoints": "state.checkpoints",
    "cleanroom": "meta.cleanroom",
    "client_setup": "meta.client_setup",
    "command_task": "evaluation.command",
    "cudadrv": "gpu.cudadrv",
    "custom_host": "meta.custom_host",
    "custom_worker": "meta.custom_worker",
    "executor": "execution.executor",
    "genserver": "meta.genserver",
    "gentemplates": "meta.gentemplates",
    "gpu_lock": "execution.gpu_lock",
    "guard": "gpu.verify.guard",
    "guard_child": "gpu.verify.guard_child",
    "guard_observer": "gpu.verify.guard_observer",
    "guard_gpu": "gpu.verify.guard_gpu",
    "health": "execution.health",
    "history": "evaluation.history",
    "lab": "lab.matrix",
    "lab_claims": "lab.claims",
    "lab_gpu": "gpu.kernel_lab.lab",
    "lab_ncu": "gpu.ncu",
    "lab_report": "lab.report",
    "launcher": "execution.launcher",
    "ledger": "state.ledger",
    "legacy_import": "state.legacy_import",
    "loop": "loop.driver",
    "loop_prompts": "loop.prompts",
    "loop_servers": "loop.servers",
    "loop_state": "loop.state",
    "objective": "evaluation.objective",
    "overview": "evaluation.overview",
    "probe": "evaluation.probe",
    "profile": "evaluation.profiling",
    "projection": "state.projection",
    "qualification": "meta.qualification",
    "qualify_checks": "meta.qualify_checks",
    "qualify_session": "meta.qualify_session",
    "registry": "meta.registry",
    "replay": "gpu.verify.replay",
    "results": "evaluation.results",
    "runner": "gpu.runner",
    "sandbox": "gpu.isolation.sandbox",
    "scan": "integrity.scan",
    "secrets_store": "state.secrets_store",
    "skills": "meta.skills",
    "ssh": "execution.ssh",
    "ssh_pool": "execution.ssh_pool",
    "storage": "state.storage",
    "sweep": "evaluation.sweep",
    "tasks": "task.spec",
    "telemetry": "state.telemetry",
    "trusted_store": "state.trusted_store",
    "verdict_view": "integrity.verdict_view",
    "verify": "integrity.verify",
    "wire": "gpu.wire",
    "workspace": "state.workspace",
    "workspace_files": "state.workspace_files",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module of the flat layout as its new module (one module object, two names)."""

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        new = f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}"
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass  # the new module ran when create_module imported it


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())

__all__ = [
    "HarnesslabError",
    "Launcher",
    "Settings",
    "TaskSpec",
    "Workspace",
    "build_launcher",
    "guarded_verify",
    "health_check",
    "init_workspace",
    "load_task",
    "numerical_probe",
    "open_workspace",
    "overview",
    "profile_kernel",
    "public_verdict",
    "rank_history",
    "restore_candidate",
    "run_command_objective",
    "run_objective",
    "run_step_objective",
    "sweep",
]
