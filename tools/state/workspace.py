"""A workspace: the agent's folder (editable files from a task template, plus views under
`.harnesslab/` it may read) bound to its trusted store under the state dir. Everything about a
workspace's paths and its candidate hash lives here.

Side of the trust boundary: both, kept apart. The task binding, the ledger, checkpoints, run
state and the registry are in the trusted store (`ws.store`, tools/state/trusted_store.py); the
folder's files are read only through tools/state/workspace_files.py. A workspace made before the store
existed is imported once, as untrusted (tools/state/legacy_import.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..settings import Settings
from ..task import kind_of
from ..task.spec import TaskSpec, is_shipped, load_task, parse_task, tasks_root
from . import task_files
from . import workspace_files as wf
from .ledger import Ledger
from .legacy_import import import_legacy, mark_imported
from .storage import hash_files
from .telemetry import read_records, usage
from .trusted_store import TrustedStore
from .workspace_files import STATE

HISTORY_VIEW = f"{STATE}/history.json"
TASK_VIEW = f"{STATE}/task.json"


@dataclass(frozen=True)
class Candidate:
    """The editable files at one moment, as one value: what a run stages, checkpoints and
    records under `digest` (their content hash), so every step of a run sees the same files."""

    files: dict[str, bytes]
    digest: str

    @classmethod
    def of(cls, files: dict[str, bytes]) -> Candidate:
        return cls(files, hash_files(files))


class Workspace:
    def __init__(self, root: Path, task: TaskSpec, store: TrustedStore) -> None:
        self.root = root
        self.task = task
        self.store = store

    # -- paths -----------------------------------------------------------------------------------
    @property
    def state(self) -> Path:
        """The workspace's own `.harnesslab/`: views and generated sources, agent-writable."""
        return self.root / STATE

    @property
    def history_path(self) -> Path:
        """The scored ledger, in the trusted store."""
        return self.store.ledger_path

    @property
    def telemetry_path(self) -> Path:
        return self.state / "telemetry.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.store.checkpoints_dir

    @property
    def runs_dir(self) -> Path:
        """Loop run state, in the trusted store (artifacts the agent may read: `artifacts_dir`)."""
        return self.store.runs_dir

    @property
    def artifacts_dir(self) -> Path:
        """Run artifacts in the workspace: prompts, transcripts, turn configs, summaries."""
        return self.state / "runs"

    def telemetry_records(self) -> list[dict[str, Any]]:
        """telemetry.jsonl's records (its kept segments: tools/state/telemetry.py), read as
        the untrusted workspace file it is."""
        return read_records(self.root, wf.inside(self.root, self.telemetry_path))

    def telemetry_usage(self) -> dict[str, dict[str, Any]]:
        """Per tool since telemetry began (rotated segments included): calls, statuses."""
        return usage(self.root, wf.inside(self.root, self.telemetry_path))

    def ledger(self) -> Ledger:
        """The trusted ledger; every append refreshes the workspace's history view."""
        kind = kind_of(self.task)
        return Ledger(
            self.history_path,
            higher_is_better=kind.higher_is_better(self.task, "dev"),
            on_append=self.write_history_view,
            mode_higher={m: kind.higher_is_better(self.task, m) for m in ("dev", "final")},
        )

    def write_history_view(self, ledger: Ledger | None = None) -> None:
        if not self.root.is_dir():  # a deleted workspace is not recreated by a view
            return
        wf.write_json(self.root, HISTORY_VIEW, (ledger or self.ledger()).view(), fsync=False)

    # -- candidate -------------------------------------------------------------------------------
    def editable_files(self) -> dict[str, bytes]:
        """The editable files as they are now: regular files inside the workspace only (no
        symlinks, size-limited). A missing or refused one is an error naming the file."""
        self.ensure_exists()
        return {
            rel: wf.read_bytes(self.root, rel, what="editable file") for rel in self.task.editable
        }

    def snapshot(self) -> Candidate:
        """The candidate as it is now: the editable files (editable_files) and their hash."""
        return Candidate.of(self.editable_files())

    def candidate_hash(self, files: dict[str, bytes] | None = None) -> str:
        return hash_files(self.editable_files() if files is None else files)

    def read_config(self, candidate: Candidate | None = None) -> dict[str, Any]:
        """kernel_config.json, parsed strictly and checked against the task's launch space:
        `candidate`'s copy when it holds one (the config the run of those files uses), else
        the workspace's."""
        if not self.task.config_file:
            return {}
        name = self.task.config_file
        data = candidate.files.get(name) if candidate is not None else None
        config = wf.read_json(self.root, name) if data is None else wf.json_of(data, source=name)
        if not isinstance(config, dict):
            raise UsageError(
                f"{name}: expected a JSON object, got {type(config).__name__}.",
                next_step='write a JSON object such as {"num_warps": 4}',
            )
        self.task.validate_config(config, source=name)
        return config

    def ensure_exists(self) -> None:
        if not self.root.is_dir():
            raise UsageError(
                f"workspace {self.root} does not exist (deleted?).",
                next_step=f"create it again: harnesslab init -w {self.root} (--task NAME for "
                "another task than rmsnorm_gate)",
            )

    def describe(self) -> dict[str, Any]:
        return {"root": str(self.root), "task": self.task.name, "editable": self.task.editable}


def _check_task_folder(task: TaskSpec, root: Path) -> None:
    """A shipped task's folder is the toolkit's; any other is the kind's to place."""
    if not is_shipped(task):
        kind_of(task).check_folder(task, root)


def bind_task(store: TrustedStore, task: TaskSpec, how: str) -> TaskSpec:
    """Record `task` in the trusted store: a shipped task by name, a folder with its task.toml
    text as it is now (later edits of the folder's task.toml change nothing). Returns the task
    as the store will give it from now on."""
    if is_shipped(task):
        store.bind(task=task.name, task_root=None, task_toml=None, how=how, language=task.language)
        return task
    folder = task.root.resolve()
    text = wf.read_text(folder, "task.toml", what="task file")
    spec = parse_task(text, folder).for_language(task.language)
    store.bind(task=spec.name, task_root=folder, task_toml=text, how=how, language=spec.language)
    if kind_of(spec).copies_task_files:  # its verifier may sit where the agent edits: keep it now
        task_files.snapshot(store, spec)
    return spec


def _bound_task(store: TrustedStore, binding: dict[str, Any]) -> TaskSpec:
    name, folder, text = binding.get("task"), binding.get("task_root"), binding.get("task_toml")
    language = binding.get("language") or "triton"
    if not isinstance(language, str):
        raise UsageError(
            f"{store.binding_path} names no kernel language.",
            next_step="re-bind with `harnesslab init --task NAME --force DIR`",
        )
    if folder and isinstance(text, str):
        return parse_task(text, Path(folder)).for_language(language)
    if not isinstance(name, str):
        raise UsageError(
            f"{store.binding_path} names no task.",
            next_step="re-bind it: harnesslab init --task NAME --force -w WORKSPACE",
        )
    return load_task(name).for_language(language)


def _write_task_view(root: Path, task: TaskSpec) -> None:
    wf.write_json(
        root,
        TASK_VIEW,
        {
            "task": task.name,
            "about": "A view: the task binding lives in the trusted store; editing this file "
            "changes nothing.",
        },
    )


def init_workspace(
    task_name: str | Path,
    dest: Path,
    settings: Settings,
    *,
    force: bool = False,
    language: str = "triton",
) -> Workspace:
    """Copy a task template into `dest` (must be new or empty unless force) and bind the task in
    the trusted store. `task_name` is the operator's: a shipped task or a task folder;
    `language` the kernel language of the template (`triton`, or one the task declares in
    `[languages.<name>]`, e.g. `cuda`)."""
    task = load_task(task_name).for_language(language)
    if dest.exists() and any(p.name != STATE for p in dest.iterdir()) and not force:
        raise UsageError(
            f"{dest} is not empty.",
            next_step="choose a new folder, or pass --force to overwrite the task files",
        )
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    _check_task_folder(task, root)
    store = TrustedStore(settings, root)
    kind = kind_of(task)
    template = kind.template(task)
    if template is not None:
        shutil.copytree(template, dest, dirs_exist_ok=True)
    elif kind.copies_task_files and task.root.resolve() != root:  # whatever the folder's layout
        task_files.write_tree(dest, task_files.workspace_template(task))
    brief = task.brief_path()
    if brief.is_file() and brief.resolve() != root / "task.md":  # not a task's own folder's
        shutil.copy2(brief, dest / "task.md")
    for junk in dest.rglob("__pycache__"):
        shutil.rmtree(junk, ignore_errors=True)
    task = bind_task(store, task, "init")
    if not store.imported_path.is_file():  # a new workspace has nothing to import
        mark_imported(store, {"nothing": "a new workspace"})
    _write_task_view(root, task)
    return Workspace(root, task, store)


def open_workspace(root: Path, settings: Settings, *, task: str | Path | None = None) -> Workspace:
    """Open an existing workspace with its task from the trusted store.

    A workspace without a binding yet is bound once: to `task` when the operator names one (a
    shipped task or a task folder, on the command line), else to the folder's own task.toml (a
    command task that is its own folder), else by importing its pre-store `.harnesslab/` as
    untrusted input (tools/state/legacy_import.py: a shipped task by name only). With a binding,
    `task` must name the bound task."""
    root = root.expanduser()
    if not root.is_dir():
        raise UsageError(
            f"workspace {root} does not exist.",
            next_step=f"create it: harnesslab init -w {root} (--task NAME for another task "
            "than rmsnorm_gate)",
        )
    root = root.resolve()
    store = TrustedStore(settings, root)
    binding = store.binding()
    if binding is not None:
        spec = _bound_task(store, binding)
        if task is not None and not _same_task(spec, task):
            raise UsageError(
                f"{root} is bound to task {spec.name!r}, not {str(task)!r}.",
                next_step=f"use --task {spec.name}, or re-bind it: harnesslab init --task "
                f"{task} --force -w {root}",
            )
    else:
        if task is not None:
            spec = load_task(task)
        elif wf.is_file(root, "task.toml") and not wf.is_file(root, TASK_VIEW):
            spec = load_task(root)
        else:
            spec = _legacy_task(root)
        _check_task_folder(spec, root)
        spec = bind_task(store, spec, "operator" if task is not None else "first open")
        ws = Workspace(root, spec, store)
        import_legacy(ws)
        return ws
    ws = Workspace(root, spec, store)
    if not store.imported_path.is_file():
        import_legacy(ws)
    return ws


def is_workspace(root: Path, settings: Settings) -> bool:
    """Whether `root` is a workspace: bound in the trusted store, or made before the store (a
    task view) or a command task that is its own folder (a task.toml)."""
    root = root.expanduser()
    if not root.is_dir():
        return False
    bound = (TrustedStore.location(settings, root.resolve()) / "binding.json").is_file()
    return bound or wf.is_file(root, TASK_VIEW) or wf.is_file(root, "task.toml")


def _same_task(spec: TaskSpec, task: str | Path) -> bool:
    path = Path(task)
    if path.is_dir():
        return path.resolve() == spec.root.resolve()
    return str(task) == spec.name


def _legacy_task(root: Path) -> TaskSpec:
    """The task of a workspace made before the trusted store: `.harnesslab/task.json` may only
    name a shipped task (its `task_root` is the agent's to forge and is ignored)."""
    if not wf.is_file(root, TASK_VIEW):
        raise UsageError(
            f"{root} is not a harnesslab workspace (no task binding, no task.toml).",
            next_step=f"make it one: harnesslab init -w {root} (--task NAME for another task "
            "than rmsnorm_gate; --force if it holds files)",
        )
    recorded = wf.read_json(root, TASK_VIEW)
    name = recorded.get("task") if isinstance(recorded, dict) else None
    if not isinstance(name, str) or not (tasks_root() / name / "task.toml").is_file():
        raise UsageError(
            f"{root / TASK_VIEW} names {name!r}, which is not a shipped task; a task folder "
            "recorded in the workspace is not trusted.",
            next_step="bind it from the command line: `harnesslab bind --task FOLDER -w "
            f"{root}` (a task folder is taken only from the operator)",
        )
    return load_task(name)


__all__ = [
    "HISTORY_VIEW",
    "STATE",
    "Candidate",
    "Workspace",
    "bind_task",
    "hash_files",
    "init_workspace",
    "is_workspace",
    "open_workspace",
]
