"""The inventory of a workspace's generated servers (`.harnesslab/registry.json`) and the one
place that decides what is projected into the clients.

Statuses: generated -> qualified -> registered, or quarantined (with the precise reason and the
report paths). Only a server whose qualification.json passed for exactly the files it has now
(same bundle hash) can be registered: registration projects it into `.mcp.json` and
`.codex/config.toml` (with explicit startup/tool timeouts) and its skill into `.claude/skills/`
and `.agents/skills/` through tools/projection.py. Quarantine, and any regeneration, removes
every projection; a quarantined server is never projected.

Read-modify-write cycles hold an exclusive lock (registry.lock), so the loop and a meta-server
running at once do not lose each other's updates; the file itself is written atomically.
"""

from __future__ import annotations

import fcntl
import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from . import projection
from .errors import UsageError
from .genserver import SERVER_NAME_RE, load_manifest, server_dir, skill_dir
from .storage import atomic_write_json
from .workspace import STATE

Status = Literal["generated", "qualified", "registered", "quarantined"]
MAX_HISTORY = 20


class ServerRecord(BaseModel):
    name: str
    status: Status
    updated: float = Field(default_factory=time.time)
    tools: list[str] = Field(default_factory=list)
    bundle_hash: str = Field(default="", description="hash of the files last qualified")
    report: str = Field(default="", description="qualification.json, relative to the workspace")
    failure_report: str = Field(default="", description="failure_report.md when it failed")
    reason: str = Field(default="", description="why it is quarantined")
    projected: list[str] = Field(default_factory=list, description="client files it is in")
    history: list[dict[str, Any]] = Field(default_factory=list)

    def set(self, status: Status, reason: str = "") -> None:
        self.status, self.reason, self.updated = status, reason, time.time()
        self.history = [
            *self.history,
            {"time": self.updated, "status": status, "reason": reason[:300]},
        ][-MAX_HISTORY:]


class Registry(BaseModel):
    version: int = 1
    servers: dict[str, ServerRecord] = Field(default_factory=dict)


def registry_path(root: Path) -> Path:
    return root / STATE / "registry.json"


def load_registry(root: Path) -> Registry:
    path = registry_path(root)
    if not path.is_file():
        return Registry()
    try:
        return Registry.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as exc:
        raise UsageError(
            f"{path} is damaged ({str(exc).splitlines()[0]}).",
            next_step="delete it; list_servers rebuilds the inventory from .harnesslab/mcp",
        ) from exc


@contextmanager
def _editing(root: Path) -> Iterator[Registry]:
    lock = root / STATE / "registry.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            reg = load_registry(root)
            yield reg
            atomic_write_json(registry_path(root), reg.model_dump(mode="json"))
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_name(name: str) -> None:
    if not SERVER_NAME_RE.match(name or ""):
        raise UsageError(
            f"{name!r} is not a server name.",
            next_step="names are lowercase letters/digits joined by single hyphens",
        )


def _record(reg: Registry, name: str) -> ServerRecord:
    return reg.servers.setdefault(name, ServerRecord(name=name, status="generated"))


def _rel(root: Path, path: str | Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _unproject(root: Path, rec: ServerRecord) -> list[str]:
    removed = [f"{c} config" for c in projection.unproject_server(root, rec.name)]
    removed += [_rel(root, p) for p in projection.remove_skill(root, rec.name)]
    rec.projected = []
    return removed


def record_generated(root: Path, name: str, tools: list[str]) -> ServerRecord:
    """A server was (re)generated: its code changed, so any earlier qualification and
    projection no longer hold."""
    _check_name(name)
    with _editing(root) as reg:
        rec = _record(reg, name)
        _unproject(root, rec)
        rec.tools, rec.bundle_hash = list(tools), ""
        rec.report = rec.failure_report = ""
        rec.set("generated")
        return rec.model_copy()


def record_qualification(root: Path, report: Any) -> ServerRecord:
    """Store a qualification outcome: qualified, or quarantined with the failed checks as the
    reason (a quarantined server loses its projections). A server that was registered and
    qualifies again with the same files stays registered."""
    with _editing(root) as reg:
        rec = _record(reg, report.server)
        rec.tools = list(report.tools)
        rec.report = _rel(root, report.report_path) if report.report_path else ""
        rec.failure_report = (
            _rel(root, report.failure_report_path) if report.failure_report_path else ""
        )
        if report.passed:
            same = rec.status == "registered" and rec.bundle_hash == report.bundle_hash
            rec.bundle_hash = report.bundle_hash
            rec.set("registered" if same else "qualified")
        else:
            _unproject(root, rec)
            rec.set("quarantined", report.reason())
        return rec.model_copy()


def register(
    root: Path, name: str, *, env: dict[str, str] | None = None, clients: tuple[str, ...] = ()
) -> ServerRecord:
    """Project a qualified server into the clients' configs and its skill into the skill
    folders. Refused unless its qualification.json passed for the files it has now."""
    from .qualification import bundle_hash, default_bundle, report_from_json

    _check_name(name)
    sdir = server_dir(root, name)
    report_file = sdir / "qualification.json"
    with _editing(root) as reg:
        rec = reg.servers.get(name)
        if not sdir.is_dir():
            raise UsageError(
                f"no generated server {name!r}.", next_step="create it with generate_server"
            )
        if not report_file.is_file():
            raise UsageError(
                f"{name} has not been qualified.", next_step=f"run self_test_server for {name}"
            )
        report = report_from_json(json.loads(report_file.read_text()))
        if not report.passed:
            raise UsageError(
                f"{name} failed qualification: {report.reason()}",
                next_step=f"fix it (see {_rel(root, sdir / 'failure_report.md')}), then "
                "self_test_server again",
            )
        current = bundle_hash(default_bundle(sdir, name))
        if current != report.bundle_hash:
            raise UsageError(
                f"{name} changed since it qualified (bundle {current} != {report.bundle_hash}).",
                next_step=f"run self_test_server for {name} again, then register it",
            )
        manifest = load_manifest(sdir)
        entry = projection.ServerEntry(
            name=name,
            command=manifest.command,
            args=list(manifest.args),
            cwd=str((root / manifest.cwd).resolve()),
            env={**(env or {}), **manifest.env},
            startup_timeout_s=math.ceil(manifest.startup_timeout_s),
            tool_timeout_s=math.ceil(manifest.tool_timeout_s),
        )
        files = projection.project_server(root, entry, clients or ("claude", "codex"))  # type: ignore[arg-type]
        if (skill_dir(root, name) / "SKILL.md").is_file():
            files += projection.project_skill(root, skill_dir(root, name), name)
        rec = _record(reg, name)
        rec.tools = [t.name for t in manifest.enabled_tools()]
        rec.bundle_hash = report.bundle_hash
        rec.report = _rel(root, report_file)
        rec.failure_report = ""
        rec.projected = sorted({_rel(root, p) for p in files})
        rec.set("registered")
        return rec.model_copy()


def quarantine(root: Path, name: str, reason: str) -> ServerRecord:
    """Take a server out of every client config and skill folder and mark it quarantined."""
    _check_name(name)
    with _editing(root) as reg:  # checked under the lock: no check-then-act race
        if name not in reg.servers and not server_dir(root, name).is_dir():
            raise UsageError(f"no server {name!r}.", next_step="list_servers shows what exists")
        rec = _record(reg, name)
        _unproject(root, rec)
        rec.set("quarantined", reason or "quarantined by request")
        return rec.model_copy()


def list_servers(root: Path) -> list[ServerRecord]:
    """Every server in the registry plus any folder under .harnesslab/mcp it does not know yet
    (status generated)."""
    reg = load_registry(root)
    out = dict(reg.servers)
    mcp_dir = root / STATE / "mcp"
    if mcp_dir.is_dir():
        for folder in sorted(p for p in mcp_dir.iterdir() if p.is_dir()):
            if folder.name not in out and SERVER_NAME_RE.match(folder.name):
                out[folder.name] = ServerRecord(name=folder.name, status="generated")
    return [out[n] for n in sorted(out)]


__all__ = [
    "Registry",
    "ServerRecord",
    "Status",
    "list_servers",
    "load_registry",
    "quarantine",
    "record_generated",
    "record_qualification",
    "register",
    "registry_path",
]
