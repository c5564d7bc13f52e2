"""Checkpoints: the editable files of every evaluated candidate, by content hash, plus a
`best` pointer per mode. Restoring always checkpoints the current files first."""

from __future__ import annotations

import json
from typing import Any

from .errors import UsageError
from .storage import atomic_write_bytes, atomic_write_json
from .workspace import Workspace, hash_files


class Checkpoints:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.root = ws.checkpoints_dir

    def save(self, files: dict[str, bytes] | None = None) -> str:
        files = self.ws.editable_files() if files is None else files
        digest = hash_files(files)
        folder = self.root / digest
        if not (folder / "manifest.json").is_file():
            for rel, data in files.items():
                atomic_write_bytes(folder / rel, data)
            atomic_write_json(folder / "manifest.json", {"hash": digest, "files": sorted(files)})
        return digest

    def exists(self, digest: str) -> bool:
        return (self.root / digest / "manifest.json").is_file()

    def files(self, digest: str) -> dict[str, bytes]:
        if not _safe_hash(digest) or not self.exists(digest):
            raise UsageError(
                f"no checkpoint {digest!r}.",
                next_step="pick a candidate hash from rank_history",
            )
        manifest = json.loads((self.root / digest / "manifest.json").read_text())
        return {rel: (self.root / digest / rel).read_bytes() for rel in manifest["files"]}

    def set_best(self, mode: str, digest: str, score: float, record_id: str) -> None:
        atomic_write_json(
            self.root / f"best-{mode}.json", {"hash": digest, "score": score, "record": record_id}
        )

    def best(self, mode: str) -> dict[str, Any] | None:
        path = self.root / f"best-{mode}.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None

    def restore(self, digest: str) -> dict[str, Any]:
        """Write the checkpoint's files into the workspace; the current files are saved first.
        Returns {"previous": hash, "restored": hash, "changed": [files]}."""
        target = self.files(digest)
        try:
            current = self.ws.editable_files()
        except UsageError:  # a deleted kernel.py is exactly what a restore should repair
            current = {
                rel: (self.ws.root / rel).read_bytes()
                for rel in self.ws.task.editable
                if (self.ws.root / rel).is_file()
            }
        previous = self.save(current) if len(current) == len(self.ws.task.editable) else None
        changed = [rel for rel, data in target.items() if current.get(rel) != data]
        for rel in changed:
            atomic_write_bytes(self.ws.root / rel, target[rel])
        return {"previous": previous, "restored": digest, "changed": changed}


def _safe_hash(digest: str) -> bool:
    return bool(digest) and all(c in "0123456789abcdef" for c in digest) and len(digest) <= 64


__all__ = ["Checkpoints"]
