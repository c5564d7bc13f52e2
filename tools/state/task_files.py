"""A command task's own files: what `init` copies into a workspace, and the copy of them the
trusted store keeps from the moment the task is bound, from which every final objective runs.

Side of the trust boundary: trusted. A command task may be its own folder (HarnessGym's layout:
task.md, verifier.py, benchmark.py and kernel.py side by side), which is also the agent's
workspace: its verifier is then the agent's to edit. So the task folder is read once, when the
operator binds it (through tools/state/workspace_files.py: no links, bounded), kept under the store
with a hash per file, and the final objective runs in a fresh folder made from that copy plus
the candidate's editable files. Nothing the agent edits later but those files reaches it.

Layouts: a task folder with a `workspace/` subfolder copies only that into a workspace (the rest,
e.g. a hidden verifier, stays with the task); without one, every file but task.toml and the
task's `private` list is a workspace file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path, PurePosixPath

from ..errors import UsageError
from ..task import TaskSpec
from . import workspace_files as wf
from .trusted_store import TrustedStore, private_dir

# Never task files: the toolkit's and the clients' own folders (a task that is its own
# workspace has them), caches, version control.
SKIP = frozenset(
    {
        ".harnesslab", ".harnessgym", ".git", "__pycache__", ".pytest_cache", ".venv",
        "node_modules", ".claude", ".agents", ".codex", ".mcp.json",
    }
)  # fmt: skip
MAX_FILES, MAX_BYTES = 2000, 64 << 20
SNAPSHOT = "task_files"


def folder_files(task: TaskSpec) -> dict[str, bytes]:
    """Every regular file of the task folder (relative path -> bytes), read as untrusted input:
    a symlink or a special file is refused, counts and sizes are bounded."""
    root = task.root.resolve()
    try:
        items = wf.walk_files(
            root.parent, root.name, skip=SKIP, max_files=MAX_FILES, max_bytes=MAX_BYTES
        )
    except UsageError as exc:
        raise UsageError(
            f"task folder {root}: {exc.message}",
            next_step="keep a command task's folder to its sources and small data (no links)",
        ) from exc
    return {path[len(root.name) + 1 :]: data for path, data in items}


def _private(task: TaskSpec, rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return rel == "task.toml" or any(
        rel == p or parts[: len(PurePosixPath(p).parts)] == PurePosixPath(p).parts
        for p in task.private
    )


def workspace_template(task: TaskSpec, files: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """The files `init` copies into a new workspace of a command task."""
    files = folder_files(task) if files is None else files
    nested = {
        rel[len("workspace/") :]: d for rel, d in files.items() if rel.startswith("workspace/")
    }
    if nested:
        return nested
    return {rel: d for rel, d in files.items() if not _private(task, rel)}


def room_files(files: dict[str, bytes]) -> dict[str, bytes]:
    """The folder a final objective runs in, before the candidate's files go over it: the task
    folder's files, with a `workspace/` subfolder's files at the top (as a workspace has them)."""
    out = {rel: d for rel, d in files.items() if not rel.startswith("workspace/")}
    out.update(
        {rel[len("workspace/") :]: d for rel, d in files.items() if rel.startswith("workspace/")}
    )
    return out


def snapshot(store: TrustedStore, task: TaskSpec) -> None:
    """Keep the task folder's files as they are now in the trusted store (replacing an older
    copy): the final objective will run from this copy only."""
    files = folder_files(task)
    base = private_dir(store.root / SNAPSHOT)
    tmp = base / f".new-{uuid.uuid4().hex[:8]}"
    manifest = {}
    for rel, data in files.items():
        path = tmp / "files" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        manifest[rel] = hashlib.sha256(data).hexdigest()
    (tmp / "files").mkdir(parents=True, exist_ok=True)
    (tmp / "manifest.json").write_text(json.dumps({"task": task.name, "files": manifest}))
    current = base / "current"
    if current.exists():
        shutil.rmtree(current)
    tmp.rename(current)


def has_snapshot(store: TrustedStore) -> bool:
    return (store.root / SNAPSHOT / "current" / "manifest.json").is_file()


def kept_files(store: TrustedStore) -> dict[str, bytes]:
    """The task files kept at bind time, each re-hashed against the manifest."""
    folder = store.root / SNAPSHOT / "current"
    try:
        manifest = json.loads((folder / "manifest.json").read_text())["files"]
        if not isinstance(manifest, dict):
            raise TypeError(f"'files' is a {type(manifest).__name__}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"the task files kept in {folder} are missing or damaged.",
            next_step="bind the task again: harnesslab init --task FOLDER --force -w WS",
        ) from exc
    out: dict[str, bytes] = {}
    for rel, digest in manifest.items():
        wf.check_relative(rel, what="kept task file")
        data = (folder / "files" / rel).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise UsageError(
                f"the kept task file {rel} no longer matches its hash.",
                next_step="bind the task again: harnesslab init --task FOLDER --force -w WS",
            )
        out[rel] = data
    return out


def write_tree(dest: Path, files: dict[str, bytes]) -> None:
    """Write `files` under a new folder `dest` (the toolkit's own folder: plain writes)."""
    for rel, data in files.items():
        wf.check_relative(rel, what="task file")
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


__all__ = [
    "folder_files",
    "has_snapshot",
    "kept_files",
    "room_files",
    "snapshot",
    "workspace_template",
    "write_tree",
]
