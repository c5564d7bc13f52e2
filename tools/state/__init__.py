"""Workspace state: the trusted store under the state dir (task binding, ledger, checkpoints,
hidden-case secrets, telemetry), the workspace the agent writes, and the one gate its files are
read through (workspace_files). Writes are atomic or fsynced appends (storage).

Side of the trust boundary: the store is trusted; the workspace is untrusted input.
"""

from . import workspace_files
from .checkpoints import Checkpoints
from .ledger import Ledger
from .secrets_store import case_set_id, ensure_outside_workspace, workspace_secret
from .trusted_store import TrustedStore
from .workspace import STATE, Candidate, Workspace, init_workspace, open_workspace

__all__ = [
    "STATE",
    "Candidate",
    "Checkpoints",
    "Ledger",
    "TrustedStore",
    "Workspace",
    "case_set_id",
    "ensure_outside_workspace",
    "init_workspace",
    "open_workspace",
    "workspace_files",
    "workspace_secret",
]
