"""A generated server's bundle (its folder and its skill: what qualification snapshots,
hashes and, when it passes, the registry serves) and the report of its qualification.

A leaf of meta/: the registry and qualification both import it, and it imports neither.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..state import workspace_files as wf
from ..state.workspace import STATE, Workspace
from .cleanroom import SKIP_NAMES, bundle_files
from .qualify_checks import Check


class QualificationReport(BaseModel):
    server: str
    server_dir: str
    passed: bool
    checks: list[Check]
    tools: list[str] = Field(default_factory=list)
    duration_s: float
    bundle_hash: str = Field(description="content hash of the bundle that was qualified")
    qualified_at: float
    report_path: str = ""
    failure_report_path: str = ""
    clean_room: str = Field(default="", description="kept clean room (keep_clean_room=True)")

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def reason(self) -> str:
        """The precise reason it failed: each failed check and its evidence's first line."""
        return "; ".join(f"{c.name}: {_first_line(c.evidence)}" for c in self.failed())

    def summary(self) -> str:
        if self.passed:
            return f"{self.server}: qualified, {len(self.checks)} checks in {self.duration_s:.1f}s"
        return (
            f"{self.server}: failed {len(self.failed())}/{len(self.checks)} checks: {self.reason()}"
        )


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:240]


def default_bundle(sdir: Path, name: str) -> dict[str, Path]:
    """The reusable bundle of a server: its folder and, when present, its skill."""
    bundle = {f"{STATE}/mcp/{name}": sdir}
    if sdir.parent.name == "mcp" and sdir.parent.parent.name == STATE:
        skill = sdir.parent.parent / "skills" / name
        if skill.is_dir():
            bundle[f"{STATE}/skills/{name}"] = skill
    return bundle


def hash_items(items: Iterable[tuple[str, bytes]]) -> str:
    """The bundle hash of (relative path, bytes) items in bundle order."""
    h = hashlib.sha256()
    for rel, data in items:
        h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def bundle_hash(bundle: dict[str, Path]) -> str:
    return hash_items((rel, path.read_bytes()) for rel, path in bundle_files(bundle))


def bundle_roots(name: str) -> tuple[str, str]:
    """Where a generated server's bundle lives in a workspace: its folder, then its skill."""
    return (f"{STATE}/mcp/{name}", f"{STATE}/skills/{name}")


def workspace_bundle(ws: Workspace, name: str) -> list[tuple[str, bytes]]:
    """The server's bundle as the workspace holds it now, read as untrusted input (a symlink
    anywhere in it is refused: it could pull any readable file into the bundle)."""
    items: list[tuple[str, bytes]] = []
    for rel in bundle_roots(name):
        items += wf.walk_files(ws.root, rel, skip=SKIP_NAMES)
    return items


def snapshot_bundle(ws: Workspace, name: str, dest: Path) -> tuple[dict[str, Path], str]:
    """Copy the server's bundle out of the workspace into `dest` (same relative layout): what is
    qualified, hashed and, when it passes, served is this copy, which the agent cannot change
    meanwhile. Returns (bundle mapping for qualify, bundle hash)."""
    items = workspace_bundle(ws, name)
    for rel, data in items:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    bundle = {rel: dest / rel for rel in bundle_roots(name) if (dest / rel).is_dir()}
    return bundle, hash_items(items)


def report_from_json(data: dict[str, Any]) -> QualificationReport:
    return QualificationReport.model_validate(data)


__all__ = [
    "QualificationReport",
    "bundle_hash",
    "bundle_roots",
    "default_bundle",
    "hash_items",
    "report_from_json",
    "snapshot_bundle",
    "workspace_bundle",
]
