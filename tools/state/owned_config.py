"""What harnesslab wrote into a workspace's client files: the record that `doctor`, `config`,
`serve` and the loop compare `.mcp.json`, `.claude/settings*.json`, `.codex/config.toml` and the
skill folders against (tools/meta/client_audit.py).

Trusted side of the boundary: the record lives in the workspace's trusted store
(`client-files.json`), never in the workspace, so an entry the agent or its code planted in a
client's file cannot claim to be the toolkit's. Every writer of those files
(tools/state/projection.py, tools/meta/client_setup.py) records here what it wrote, and forgets
what it removed.

    owned = OwnedConfig.of(settings, ws.root)
    owned.server("claude", "harnesslab", {"command": ..., "args": [...]})   # written
    owned.server("claude", "harnesslab", None)                             # removed
    owned.load().servers["claude"]                                         # what is ours
"""

from __future__ import annotations

import fcntl
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from ..settings import Settings
from .storage import atomic_write_json
from .trusted_store import TrustedStore

ClientFile = Literal["claude", "codex"]
RECORD = "client-files.json"


class OwnedRecord(BaseModel):
    """The toolkit's own entries in the workspace's client files."""

    servers: dict[ClientFile, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description="claude: .mcp.json mcpServers entries; codex: .codex/config.toml "
        "[mcp_servers.<name>] tables, exactly as written",
    )
    approvals: list[str] = Field(
        default_factory=list,
        description="names added to enabledMcpjsonServers in .claude/settings.local.json",
    )
    skills: dict[str, str] = Field(
        default_factory=dict,
        description="skill folders written (.claude/skills/<n>, .agents/skills/<n>) -> content hash",
    )


class OwnedConfig:
    """Read and update the record of one workspace (a lock serialises writers: the loop and
    a meta-server may register at once)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of(cls, settings: Settings, root: Path) -> OwnedConfig:
        """The record of the folder `root` (a workspace, or any folder a client config was
        written into) in the trusted store under `settings.state_dir`."""
        return cls.in_store(TrustedStore(settings, root))

    @classmethod
    def in_store(cls, store: TrustedStore) -> OwnedConfig:
        return cls(store.root / RECORD)

    def load(self) -> OwnedRecord:
        """The record; an empty one when none was written or it is damaged (then everything
        in the files is reported as not written by the toolkit, the safe reading)."""
        try:
            return OwnedRecord.model_validate_json(self.path.read_text())
        except (OSError, ValidationError, ValueError):
            return OwnedRecord()

    @contextmanager
    def _editing(self) -> Iterator[OwnedRecord]:
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                record = self.load()
                yield record
                atomic_write_json(self.path, record.model_dump(mode="json"))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def server(self, client: ClientFile, name: str, entry: dict[str, Any] | None) -> None:
        """Record the entry written for `name` in `client`'s file (None: it was removed)."""
        with self._editing() as record:
            mine = record.servers.setdefault(client, {})
            if entry is None:
                mine.pop(name, None)
            else:
                mine[name] = entry

    def approval(self, name: str, *, added: bool) -> None:
        with self._editing() as record:
            kept = [n for n in record.approvals if n != name]
            record.approvals = [*kept, name] if added else kept

    def skill(self, rel: str, digest: str | None) -> None:
        """Record the skill folder `rel` (workspace-relative) with its content hash (None: it
        was removed)."""
        with self._editing() as record:
            if digest is None:
                record.skills.pop(rel, None)
            else:
                record.skills[rel] = digest


def tree_digest(files: list[tuple[str, bytes]]) -> str:
    """The content hash of a folder's files ((path relative to the folder, bytes), any order)."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


__all__ = ["RECORD", "ClientFile", "OwnedConfig", "OwnedRecord", "tree_digest"]
