"""The one-time import of a workspace made before the trusted store existed.

Side of the trust boundary: the gate, once. Its `.harnesslab/` was the agent's to write, so it
is read as untrusted input (tools/state/workspace_files.py) and nothing in it decides anything:
- the task binding comes from tools/state/workspace.py (a shipped task by name only);
- ledger records are copied with `untrusted: true`: shown, never a best until re-scored;
- checkpoints are re-hashed and kept under the hash of what they hold, when they hold exactly
  the task's editable files; best pointers are not imported (they decide restores);
- the old registry and qualification reports are not imported (a server must qualify again);
  every generated server is taken out of the clients' configs, whose commands the agent could
  have chosen;
- loop run state is not imported (`--resume` of an old run starts a new one).
`imported.json` in the store records what happened, so this runs once.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from ..catalog import SERVER_NAME_RE
from ..errors import UsageError
from . import workspace_files as wf
from .checkpoints import CheckpointedWorkspace, Checkpoints
from .owned_config import OwnedConfig
from .projection import unproject_server
from .storage import append_jsonl, atomic_write_json
from .trusted_store import TrustedStore
from .workspace_files import STATE

MAX_LEGACY_LEDGER_BYTES = 64 << 20


class LegacyWorkspace(CheckpointedWorkspace, Protocol):
    """What the import uses of the workspace that opens it (tools/state/workspace.py): its
    checkpoints, its trusted store, the history view it refreshes."""

    store: TrustedStore

    def write_history_view(self) -> None: ...


def mark_imported(store: TrustedStore, info: dict[str, Any]) -> None:
    atomic_write_json(store.imported_path, {"time": time.time(), **info})


def import_legacy(ws: LegacyWorkspace) -> dict[str, Any]:
    """Import `ws.state` once (see the module docstring); returns what imported.json says."""
    store = ws.store
    info: dict[str, Any] = {"ledger_records": 0, "checkpoints": 0, "skipped": [], "unprojected": []}
    skipped: list[str] = info["skipped"]

    rel = f"{STATE}/history.jsonl"
    if wf.is_file(ws.root, rel) or (ws.root / rel).is_symlink():
        try:
            text = wf.read_text(ws.root, rel, max_bytes=MAX_LEGACY_LEDGER_BYTES)
        except UsageError as exc:
            text = ""
            skipped.append(f"{rel}: {exc.message}")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = wf.parse_json(line, source=f"{rel} line {n}")
            except UsageError:
                skipped.append(f"{rel} line {n}: not a JSON record")
                continue
            if not isinstance(rec, dict):
                continue
            append_jsonl(store.ledger_path, {**rec, "untrusted": True, "imported": True})
            info["ledger_records"] += 1

    ckpt = Checkpoints(ws)
    for name in wf.list_dir(ws.root, f"{STATE}/checkpoints"):
        mrel = f"{STATE}/checkpoints/{name}/manifest.json"
        if not wf.is_file(ws.root, mrel):
            continue
        try:
            manifest = wf.read_json(ws.root, mrel)
            rels = manifest.get("files") if isinstance(manifest, dict) else None
            ckpt.check_files(rels)  # the same rule as the store's own
            files = {
                r: wf.read_bytes(ws.root, f"{STATE}/checkpoints/{name}/{r}") for r in rels or []
            }
            ckpt.save(files)  # stored under the hash of what it holds, not its folder name
            info["checkpoints"] += 1
        except UsageError as exc:
            skipped.append(f"checkpoint {name[:64]}: {exc.message}")

    names = {n for n in wf.list_dir(ws.root, f"{STATE}/mcp") if SERVER_NAME_RE.match(n)}
    if wf.is_file(ws.root, f"{STATE}/registry.json"):
        try:
            old = wf.read_json(ws.root, f"{STATE}/registry.json")
            servers = old.get("servers") if isinstance(old, dict) else None
            names |= {n for n in (servers or {}) if isinstance(n, str) and SERVER_NAME_RE.match(n)}
        except UsageError as exc:
            skipped.append(f"registry.json: {exc.message}")
    for name in sorted(names):
        try:
            if unproject_server(ws.root, name, owned=OwnedConfig.in_store(store)):
                info["unprojected"].append(name)
        except UsageError as exc:
            skipped.append(f"projection of {name}: {exc.message}")
    info["skipped"] = skipped[:50]
    mark_imported(store, info)
    if info["ledger_records"]:
        ws.write_history_view()
    return info


__all__ = ["import_legacy", "mark_imported"]
