"""The trusted store of one workspace: what decides a score, a verdict, a registration or a
command, kept under the state dir where the agent's files are not.

Side of the trust boundary: trusted. Nothing here is read from the workspace except through
`import_legacy`, once, as untrusted input (tools/state/workspace_files.py).

    <state_dir>/workspaces/<key>/     key = sha256 of the workspace's resolved path (as for the
                                      hidden-case secret, which stays in <state_dir>/secrets/)
        binding.json                  the task: a shipped task by name, or a task folder the
                                      operator named (its task.toml text as it was bound)
        history.jsonl                 the scored ledger (append-only)
        hidden-results.jsonl          per-case results of final runs, with the hidden shapes
        checkpoints/<hash>/           candidate files by content hash + manifest.json
        checkpoints/best/<mode>/<case set>.json   best pointers
        registry.json, registry.lock  generated servers and their status
        qualifications/<name>.json    reports of qualifications this toolkit ran
        servers/<name>/<bundle hash>/ the qualified bundle, served by `harnesslab serve-generated`
        runs/<id>/                    loop run state (state.json, config.json, scores)
        imported.json                 what was imported from the workspace's .harnesslab/ once
        client-files.json             what the toolkit wrote into .mcp.json, .claude/settings*,
                                      .codex/config.toml and the skill folders (owned_config.py)

Folders are 0700, so another OS user cannot read them; the agent running as the same user can
(DESIGN.md "Trust model", party 3: run the server as another user to close that).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..settings import Settings
from .storage import atomic_write_json


def workspace_key(workspace_root: Path) -> str:
    """The id of a workspace in the state dir (a moved workspace is a new one)."""
    return hashlib.sha256(str(workspace_root.resolve()).encode()).hexdigest()[:24]


def ensure_outside_workspace(settings: Settings, workspace_root: Path) -> None:
    """The state dir must not be where the agent's files are: inside the workspace, the trusted
    store and the hidden-case secret would be agent files."""
    state, root = settings.state_dir.expanduser().resolve(), workspace_root.resolve()
    if state == root or root in state.parents:
        raise UsageError(
            f"the state directory {state} is inside the workspace {root}: the trusted store "
            "and the hidden cases would be readable and writable by the agent.",
            next_step="set HARNESSLAB_STATE_DIR to a folder outside every workspace",
        )


def private_dir(path: Path) -> Path:
    """mkdir -p with 0700 on the folder itself."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


class TrustedStore:
    """Paths of one workspace's trusted state, and its task binding."""

    def __init__(self, settings: Settings, workspace_root: Path) -> None:
        ensure_outside_workspace(settings, workspace_root)
        self.workspace_root = workspace_root.resolve()
        self.root = self.location(settings, self.workspace_root)
        private_dir(self.root.parent.parent)
        private_dir(self.root.parent)
        private_dir(self.root)

    @staticmethod
    def location(settings: Settings, workspace_root: Path) -> Path:
        """Where the store of `workspace_root` is (nothing is created)."""
        state = settings.state_dir.expanduser().resolve()
        return state / "workspaces" / workspace_key(workspace_root)

    # -- paths ------------------------------------------------------------------------------
    @property
    def ledger_path(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def hidden_results_path(self) -> Path:
        return self.root / "hidden-results.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def registry_path(self) -> Path:
        return self.root / "registry.json"

    @property
    def registry_lock(self) -> Path:
        return self.root / "registry.lock"

    @property
    def qualifications_dir(self) -> Path:
        return self.root / "qualifications"

    @property
    def servers_dir(self) -> Path:
        return self.root / "servers"

    @property
    def binding_path(self) -> Path:
        return self.root / "binding.json"

    @property
    def imported_path(self) -> Path:
        return self.root / "imported.json"

    # -- binding ----------------------------------------------------------------------------
    def binding(self) -> dict[str, Any] | None:
        if not self.binding_path.is_file():
            return None
        try:
            data = json.loads(self.binding_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(
                f"{self.binding_path} is damaged.",
                next_step="re-bind the workspace: harnesslab init --task NAME --force -w WORKSPACE",
            ) from exc
        return data if isinstance(data, dict) else None

    def bind(
        self,
        *,
        task: str,
        task_root: Path | None,
        task_toml: str | None,
        how: str,
        language: str = "triton",
    ) -> None:
        """Record the task: `task_root`/`task_toml` only for a folder task (operator's);
        `language` the kernel language the workspace was made in (its editable files)."""
        atomic_write_json(
            self.binding_path,
            {
                "task": task,
                "task_root": str(task_root) if task_root is not None else None,
                "task_toml": task_toml,
                "task_toml_sha256": (
                    hashlib.sha256(task_toml.encode()).hexdigest() if task_toml else None
                ),
                "workspace": str(self.workspace_root),
                "language": language,
                "bound_at": time.time(),
                "how": how,
            },
        )


__all__ = ["TrustedStore", "ensure_outside_workspace", "private_dir", "workspace_key"]
