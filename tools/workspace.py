"""A workspace: the agent's folder (editable files from a task template) plus `.harnesslab/`
state. Everything about a workspace's paths and its candidate hash lives here."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from .errors import UsageError
from .storage import atomic_write_json
from .tasks import TaskSpec, load_task, tasks_root

STATE = ".harnesslab"


class Workspace:
    def __init__(self, root: Path, task: TaskSpec) -> None:
        self.root = root
        self.task = task

    # -- paths -----------------------------------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.root / STATE

    @property
    def history_path(self) -> Path:
        return self.state / "history.jsonl"

    @property
    def telemetry_path(self) -> Path:
        return self.state / "telemetry.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.state / "checkpoints"

    @property
    def runs_dir(self) -> Path:
        return self.state / "runs"

    # -- candidate -------------------------------------------------------------------------------
    def editable_files(self) -> dict[str, bytes]:
        """The editable files as they are now. A missing one is an error naming the file."""
        self.ensure_exists()
        files: dict[str, bytes] = {}
        for rel in self.task.editable:
            path = self.root / rel
            if not path.is_file():
                raise UsageError(
                    f"{path} is missing.",
                    next_step="restore it with restore_best_checkpoint or `harnesslab init --force`",
                )
            files[rel] = path.read_bytes()
        return files

    def candidate_hash(self, files: dict[str, bytes] | None = None) -> str:
        return hash_files(self.editable_files() if files is None else files)

    def read_config(self) -> dict[str, Any]:
        """kernel_config.json, parsed and checked against the task's launch space."""
        if not self.task.config_file:
            return {}
        path = self.root / self.task.config_file
        if not path.is_file():
            raise UsageError(
                f"{path} is missing.", next_step="restore it or re-run `harnesslab init`"
            )
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{self.task.config_file}: not valid JSON ({exc.msg} at line {exc.lineno}).",
                next_step='write a JSON object such as {"num_warps": 4}',
            ) from exc
        if not isinstance(config, dict):
            raise UsageError(
                f"{self.task.config_file}: expected a JSON object, got {type(config).__name__}.",
                next_step='write a JSON object such as {"num_warps": 4}',
            )
        self.task.validate_config(config, source=self.task.config_file)
        return config

    def ensure_exists(self) -> None:
        if not self.root.is_dir():
            raise UsageError(
                f"workspace {self.root} does not exist (deleted?).",
                next_step="create one with `harnesslab init --task NAME DIR`",
            )

    def describe(self) -> dict[str, Any]:
        return {"root": str(self.root), "task": self.task.name, "editable": self.task.editable}


def hash_files(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel] + b"\0")
    return h.hexdigest()[:16]


def init_workspace(task_name: str | Path, dest: Path, *, force: bool = False) -> Workspace:
    """Copy a task template into `dest` (must be new or empty unless force) and record the task."""
    task = load_task(task_name)
    if dest.exists() and any(p.name != STATE for p in dest.iterdir()) and not force:
        raise UsageError(
            f"{dest} is not empty.",
            next_step="choose a new folder, or pass --force to overwrite the task files",
        )
    dest.mkdir(parents=True, exist_ok=True)
    if task.kind == "kernel":
        shutil.copytree(task.workspace_template, dest, dirs_exist_ok=True)
    elif (task.root / "workspace").is_dir():
        shutil.copytree(task.root / "workspace", dest, dirs_exist_ok=True)
    brief = task.brief_path()
    if brief.is_file():
        shutil.copy2(brief, dest / "task.md")
    for junk in dest.rglob("__pycache__"):
        shutil.rmtree(junk, ignore_errors=True)
    atomic_write_json(dest / STATE / "task.json", {"task": task.name, "task_root": str(task.root)})
    return Workspace(dest.resolve(), task)


def open_workspace(root: Path, task_name: str | None = None) -> Workspace:
    """Open an existing workspace. Its task comes from .harnesslab/task.json, or from a
    task.toml in the folder itself (a command task), or from `task_name`."""
    root = root.expanduser()
    if not root.is_dir():
        raise UsageError(
            f"workspace {root} does not exist.",
            next_step="create one with `harnesslab init --task rmsnorm_gate DIR`",
        )
    root = root.resolve()
    if task_name:
        return Workspace(root, load_task(task_name))
    meta = root / STATE / "task.json"
    if meta.is_file():
        try:
            recorded = json.loads(meta.read_text())
            name = recorded["task"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UsageError(
                f"{meta} is damaged.", next_step="re-run `harnesslab init --force`"
            ) from exc
        # A workspace made from a task folder (not a shipped task) reopens from that folder.
        folder = recorded.get("task_root")
        if folder and not (tasks_root() / name / "task.toml").is_file():
            return Workspace(root, load_task(Path(folder)))
        return Workspace(root, load_task(name))
    if (root / "task.toml").is_file():
        return Workspace(root, load_task(root))
    raise UsageError(
        f"{root} is not a harnesslab workspace (no .harnesslab/task.json or task.toml).",
        next_step="create one with `harnesslab init --task rmsnorm_gate DIR`",
    )


__all__ = ["Workspace", "hash_files", "init_workspace", "open_workspace"]
