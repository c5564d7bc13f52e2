"""Per-workspace secrets for hidden final cases, kept under the user's state directory (never in
the workspace). The same secret gives the same case set until it is rotated."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path

from ..settings import Settings
from .storage import atomic_write_text
from .trusted_store import ensure_outside_workspace, workspace_key


def _secret_path(settings: Settings, workspace_root: Path) -> Path:
    return settings.secrets_dir() / f"{workspace_key(workspace_root)}.json"


def workspace_secret(settings: Settings, workspace_root: Path, *, rotate: bool = False) -> dict:
    """{'seed': hex, 'created': t, 'generation': n}; created on first use, replaced on rotate."""
    path = _secret_path(settings, workspace_root)
    current = None
    if path.is_file():
        try:
            current = json.loads(path.read_text())
        except json.JSONDecodeError:
            current = None
    if current is None or rotate:
        generation = (current or {}).get("generation", 0) + 1
        current = {"seed": secrets.token_hex(32), "created": time.time(), "generation": generation}
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        atomic_write_text(path, json.dumps(current))
        os.chmod(path, 0o600)
    return current


def adopt_secret(settings: Settings, workspace_root: Path, secret: dict) -> None:
    """Give `workspace_root` the hidden-case secret `secret` (another workspace's, or one made
    for the purpose): `harnesslab compare` scores every trial on one case set."""
    path = _secret_path(settings, workspace_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    atomic_write_text(path, json.dumps(secret))
    os.chmod(path, 0o600)


def case_set_id(seed_hex: str) -> str:
    """A public name for a case set that reveals nothing about the seed."""
    return "final-" + hashlib.sha256(("case-set:" + seed_hex).encode()).hexdigest()[:12]


__all__ = ["adopt_secret", "case_set_id", "ensure_outside_workspace", "workspace_secret"]
