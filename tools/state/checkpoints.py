"""Checkpoints: the editable files of every evaluated candidate, by content hash, plus a best
pointer per mode and case set. Restoring always checkpoints the current files first.

Side of the trust boundary: trusted. Checkpoints live in the trusted store; a manifest may only
list the task's editable files (relative, no `..`), and a checkpoint's contents are re-hashed
against its name before they are staged or restored. A restore writes only the task's editable
files, through tools/state/workspace_files.py (no symlink is followed).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from ..errors import UsageError
from ..task import TaskSpec
from . import workspace_files as wf
from .storage import atomic_write_bytes, atomic_write_json, hash_files, require_space

HASH_RE = re.compile(r"^[0-9a-f]{6,64}$")


class CheckpointedWorkspace(Protocol):
    """What checkpoints use of a workspace (tools/state/workspace.py's Workspace, which
    imports what imports this module): the folder and task, where its checkpoints are kept,
    its editable files now."""

    root: Path
    task: TaskSpec

    @property
    def checkpoints_dir(self) -> Path: ...

    def editable_files(self) -> dict[str, bytes]: ...


class Checkpoints:
    def __init__(self, ws: CheckpointedWorkspace) -> None:
        self.ws = ws
        self.root = ws.checkpoints_dir

    def check_files(self, rels: list[str] | Any) -> list[str]:
        """A manifest's file list: exactly the task's editable files, each a safe relative
        path."""
        if not isinstance(rels, list) or not all(isinstance(r, str) for r in rels):
            raise UsageError("checkpoint manifest: 'files' is not a list of paths.")
        for rel in rels:
            wf.check_relative(rel, what="checkpoint file")
        if sorted(rels) != sorted(self.ws.task.editable):
            raise UsageError(
                f"checkpoint files {sorted(rels)} are not the task's editable files "
                f"{sorted(self.ws.task.editable)}.",
                next_step="pick another candidate from rank_history",
            )
        return rels

    def save(self, files: dict[str, bytes] | None = None) -> str:
        """Checkpoint `files` (default: the workspace's editable files) under their hash. The
        folder appears whole or not at all: it is written under a temp name and renamed, so a
        full disk (DiskFull) or a crash leaves no checkpoint without its manifest."""
        files = self.ws.editable_files() if files is None else files
        self.check_files(list(files))
        digest = hash_files(files)
        folder = self.root / digest
        if (folder / "manifest.json").is_file():
            return digest
        require_space(self.root, sum(len(b) for b in files.values()))
        tmp = self.root / f".{digest}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            for rel, data in files.items():
                atomic_write_bytes(tmp / rel, data)
            atomic_write_json(tmp / "manifest.json", {"hash": digest, "files": sorted(files)})
            if folder.is_dir():  # a partial folder left by an older version: replaced
                shutil.rmtree(folder)
            try:
                tmp.rename(folder)
            except OSError:
                if not (folder / "manifest.json").is_file():
                    raise
                # another process saved the same checkpoint first: the same bytes
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return digest

    def exists(self, digest: str) -> bool:
        return (
            bool(HASH_RE.match(digest or "")) and (self.root / digest / "manifest.json").is_file()
        )

    def files(self, digest: str) -> dict[str, bytes]:
        """The checkpoint's files, re-hashed: contents that do not hash to `digest` are refused
        (a damaged or altered store), so what is staged or restored is what was scored."""
        if not self.exists(digest):
            raise UsageError(
                f"no checkpoint {digest!r}.",
                next_step="pick a candidate hash from rank_history",
            )
        folder = self.root / digest
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
            rels = self.check_files(manifest.get("files") if isinstance(manifest, dict) else None)
            files = {rel: (folder / rel).read_bytes() for rel in rels}
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"checkpoint {digest} is damaged ({exc}).",
                next_step="pick another candidate from rank_history",
            ) from exc
        if hash_files(files) != digest:
            raise UsageError(
                f"checkpoint {digest}'s files hash to {hash_files(files)}: altered.",
                next_step="pick another candidate from rank_history",
            )
        return files

    # -- best pointers ------------------------------------------------------------------------
    def _best_path(self, mode: str, case_set: str) -> Path:
        key = hashlib.sha256(f"{mode}\0{case_set}".encode()).hexdigest()[:20]
        return self.root / "best" / f"{key}.json"

    def set_best(
        self, mode: str, digest: str, score: float, record_id: str, *, case_set: str
    ) -> None:
        atomic_write_json(
            self._best_path(mode, case_set),
            {
                "mode": mode,
                "case_set": case_set,
                "hash": digest,
                "score": score,
                "record": record_id,
            },
        )

    def best(self, mode: str, *, case_set: str) -> dict[str, Any] | None:
        """The best pointer of `mode` on `case_set` (scores compare only within a case set)."""
        path = self._best_path(mode, case_set)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None

    def latest_best(self, mode: str) -> dict[str, Any] | None:
        """The most recently set best pointer of `mode` on any case set: an incumbent to time
        a candidate against side by side (ABBA) on a new case set, never a score to compare."""
        folder = self.root / "best"
        pointers = (
            sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
            if folder.is_dir()
            else []
        )
        for path in reversed(pointers):
            try:
                data = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(data, dict) and data.get("mode") == mode:
                return data
        return None

    # -- restore ------------------------------------------------------------------------------
    def restore(self, digest: str) -> dict[str, Any]:
        """Write the checkpoint's files into the workspace; the current files are saved first.
        Only the task's editable files are written. Returns {"previous": hash, "restored":
        hash, "changed": [files]}."""
        target = self.files(digest)
        current: dict[str, bytes] = {}
        for rel in self.ws.task.editable:
            try:
                current[rel] = wf.read_bytes(self.ws.root, rel)
            except UsageError:  # missing or refused: exactly what a restore should repair
                continue
        previous = self.save(current) if len(current) == len(self.ws.task.editable) else None
        changed = [rel for rel, data in target.items() if current.get(rel) != data]
        for rel in changed:
            wf.write_bytes(self.ws.root, rel, target[rel])
        return {"previous": previous, "restored": digest, "changed": changed}


__all__ = ["HASH_RE", "Checkpoints"]
