"""Per-workspace secrets for hidden final cases, kept under the user's state directory (never in
the workspace). The same secret gives the same case set until it is rotated."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path

from .errors import UsageError
from .settings import Settings
from .storage import atomic_write_text


def _secret_path(settings: Settings, workspace_root: Path) -> Path:
    key = hashlib.sha256(str(workspace_root.resolve()).encode()).hexdigest()[:24]
    return settings.secrets_dir() / f"{key}.json"


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


def ensure_outside_workspace(settings: Settings, workspace_root: Path) -> None:
    """The secret must live where the agent's files do not: a state dir inside the workspace
    would hand the hidden cases to the candidate."""
    state, root = settings.state_dir.expanduser().resolve(), workspace_root.resolve()
    if state == root or root in state.parents:
        raise UsageError(
            f"the state directory {state} is inside the workspace {root}: hidden cases would "
            "be readable by the candidate.",
            next_step="set HARNESSLAB_STATE_DIR to a folder outside every workspace",
        )


def case_set_id(seed_hex: str) -> str:
    """A public name for a case set that reveals nothing about the seed."""
    return "final-" + hashlib.sha256(("case-set:" + seed_hex).encode()).hexdigest()[:12]


__all__ = ["case_set_id", "ensure_outside_workspace", "workspace_secret"]
