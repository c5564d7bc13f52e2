"""The inventory of a workspace's generated servers and the one place that decides what is
projected into the clients.

Side of the trust boundary: trusted. The registry, the qualification reports and the qualified
bundles live in the workspace's trusted store (tools/state/trusted_store.py); a qualification.json or
registry.json in the workspace is a view, or a forgery, and decides nothing.

Statuses: generated -> qualified -> registered, or quarantined (with the precise reason and the
report paths). Only a server that a qualification run by this toolkit passed, for exactly the
files it has now (same bundle hash), can be registered. Registration projects the toolkit's own
launcher for it (`<python> -m harnesslab.servers serve-generated NAME -w WS`: it serves the
qualified snapshot from the store after re-hashing it) into `.mcp.json` and
`.codex/config.toml`, never a command, argument, folder or variable from the server's manifest,
and its qualified skill into `.claude/skills/` and `.agents/skills/` through
tools/state/projection.py. Quarantine, and any regeneration, removes every projection; a quarantined
server is never projected.

Read-modify-write cycles hold an exclusive lock (registry.lock in the store), so the loop and a
meta-server running at once do not lose each other's updates; the file is written atomically.
"""

from __future__ import annotations

import fcntl
import json
import math
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from ..catalog import harnesslab_argv
from ..errors import UsageError
from ..state import projection
from ..state import workspace_files as wf
from ..state.owned_config import OwnedConfig
from ..state.storage import atomic_write_json
from ..state.trusted_store import private_dir
from ..state.workspace import STATE, Workspace
from .bundle import (
    QualificationReport,
    bundle_roots,
    hash_items,
    report_from_json,
    workspace_bundle,
)
from .genserver import SERVER_NAME_RE, load_manifest

Status = Literal["generated", "qualified", "registered", "quarantined"]
MAX_HISTORY = 20
# Bounds on the client timeouts taken from a qualified manifest (numbers the agent chose).
MAX_STARTUP_TIMEOUT_S = 600
MAX_TOOL_TIMEOUT_S = 3600


class ServerRecord(BaseModel):
    name: str
    status: Status
    updated: float = Field(default_factory=time.time)
    tools: list[str] = Field(default_factory=list)
    bundle_hash: str = Field(default="", description="hash of the files last qualified")
    report: str = Field(default="", description="qualification.json view, relative to the ws")
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


def registry_path(ws: Workspace) -> Path:
    return ws.store.registry_path


def load_registry(ws: Workspace) -> Registry:
    path = registry_path(ws)
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
def _editing(ws: Workspace) -> Iterator[Registry]:
    lock = ws.store.registry_lock
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            reg = load_registry(ws)
            yield reg
            atomic_write_json(registry_path(ws), reg.model_dump(mode="json"))
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


def _unproject(ws: Workspace, rec: ServerRecord) -> list[str]:
    owned = OwnedConfig.in_store(ws.store)
    removed = [f"{c} config" for c in projection.unproject_server(ws.root, rec.name, owned=owned)]
    removed += [_rel(ws.root, p) for p in projection.remove_skill(ws.root, rec.name, owned=owned)]
    rec.projected = []
    return removed


# -- trusted qualification records --------------------------------------------------------------


def trusted_report_path(ws: Workspace, name: str) -> Path:
    return ws.store.qualifications_dir / f"{name}.json"


def trusted_report(ws: Workspace, name: str) -> QualificationReport | None:
    """The last qualification this toolkit ran for `name`, or None."""

    path = trusted_report_path(ws, name)
    if not path.is_file():
        return None
    try:
        return report_from_json(json.loads(path.read_text()))
    except (ValueError, ValidationError):
        return None


def bundle_dir(ws: Workspace, name: str, digest: str) -> Path:
    """Where the qualified bundle `digest` of `name` is kept."""
    return ws.store.servers_dir / name / digest


def qualified_bundle(ws: Workspace, name: str, digest: str) -> Path:
    """The kept bundle of `name` with hash `digest`, re-hashed: UsageError when it is missing
    or its files no longer hash to `digest`."""

    folder = bundle_dir(ws, name, digest)
    items: list[tuple[str, bytes]] = []
    for rel in bundle_roots(name):
        items += wf.walk_files(folder, rel)
    if not items or hash_items(items) != digest:
        raise UsageError(
            f"the qualified bundle of {name} ({digest}) is missing or altered.",
            next_step=f"run self_test_server for {name} again, then register it",
        )
    return folder


def record_generated(ws: Workspace, name: str, tools: list[str]) -> ServerRecord:
    """A server was (re)generated: its code changed, so any earlier qualification and
    projection no longer hold."""
    _check_name(name)
    with _editing(ws) as reg:
        rec = _record(reg, name)
        _unproject(ws, rec)
        rec.tools, rec.bundle_hash = list(tools), ""
        rec.report = rec.failure_report = ""
        rec.set("generated")
        return rec.model_copy()


def record_qualification(
    ws: Workspace, report: QualificationReport, *, snapshot: Path | None = None
) -> ServerRecord:
    """Store the outcome of a qualification this toolkit ran: the report in the trusted store
    and, when it passed, the qualified `snapshot` of its bundle (moved into the store under
    its hash). Qualified, or quarantined with the failed checks as the reason (a quarantined server
    loses its projections). A registered server that qualifies again with the same files stays
    registered."""
    _check_name(report.server)
    private_dir(ws.store.qualifications_dir)
    atomic_write_json(trusted_report_path(ws, report.server), report.model_dump(mode="json"))
    if report.passed and snapshot is not None:
        keep = bundle_dir(ws, report.server, report.bundle_hash)
        private_dir(keep.parent)
        if keep.exists():
            shutil.rmtree(keep)
        snapshot.rename(keep)
        for older in keep.parent.iterdir():  # one kept bundle per server: the last that passed
            if older.name != keep.name and not older.name.startswith("."):
                shutil.rmtree(older, ignore_errors=True)
    with _editing(ws) as reg:
        rec = _record(reg, report.server)
        rec.tools = list(report.tools)
        rec.report = _rel(ws.root, report.report_path) if report.report_path else ""
        rec.failure_report = (
            _rel(ws.root, report.failure_report_path) if report.failure_report_path else ""
        )
        if report.passed:
            same = rec.status == "registered" and rec.bundle_hash == report.bundle_hash
            rec.bundle_hash = report.bundle_hash
            rec.set("registered" if same else "qualified")
        else:
            _unproject(ws, rec)
            rec.set("quarantined", report.reason())
        return rec.model_copy()


def launcher_argv(ws: Workspace, name: str) -> list[str]:
    """How a client starts a registered server: the toolkit's own launcher, which serves the
    qualified bundle from the trusted store after checking its hash."""
    return harnesslab_argv("serve-generated", name, "-w", str(ws.root))


def register(
    ws: Workspace, name: str, *, env: dict[str, str] | None = None, clients: tuple[str, ...] = ()
) -> ServerRecord:
    """Project a qualified server into the clients' configs and its qualified skill into the
    skill folders. Refused unless a qualification this toolkit ran passed for the files it has
    now. `env` is the toolkit's (its settings), never the manifest's."""

    _check_name(name)
    with _editing(ws) as reg:
        if not wf.is_dir(ws.root, f"{STATE}/mcp/{name}"):
            raise UsageError(
                f"no generated server {name!r}.", next_step="create it with generate_server"
            )
        report = trusted_report(ws, name)
        if report is None:
            raise UsageError(
                f"{name} has not been qualified.", next_step=f"run self_test_server for {name}"
            )
        if not report.passed:
            raise UsageError(
                f"{name} failed qualification: {report.reason()}",
                next_step=f"fix it (see .harnesslab/mcp/{name}/failure_report.md), then "
                "self_test_server again",
            )
        current = hash_items(workspace_bundle(ws, name))
        if current != report.bundle_hash:
            raise UsageError(
                f"{name} changed since it qualified (bundle {current} != {report.bundle_hash}).",
                next_step=f"run self_test_server for {name} again, then register it",
            )
        kept = qualified_bundle(ws, name, report.bundle_hash)
        manifest = load_manifest(kept / STATE / "mcp" / name)
        argv = launcher_argv(ws, name)
        entry = projection.ServerEntry(
            name=name,
            command=argv[0],
            args=argv[1:],
            cwd=str(ws.root),
            env=dict(env or {}),
            startup_timeout_s=min(math.ceil(manifest.startup_timeout_s), MAX_STARTUP_TIMEOUT_S),
            tool_timeout_s=min(math.ceil(manifest.tool_timeout_s), MAX_TOOL_TIMEOUT_S),
        )
        owned = OwnedConfig.in_store(ws.store)
        files = projection.project_server(
            ws.root,
            entry,
            clients or ("claude", "codex"),  # type: ignore[arg-type]
            owned=owned,
        )
        skill = kept / STATE / "skills" / name
        if (skill / "SKILL.md").is_file():
            files += projection.project_skill(ws.root, skill, name, owned=owned)
        rec = _record(reg, name)
        rec.tools = [t.name for t in manifest.enabled_tools()]
        rec.bundle_hash = report.bundle_hash
        rec.report = f"{STATE}/mcp/{name}/qualification.json"
        rec.failure_report = ""
        rec.projected = sorted({_rel(ws.root, p) for p in files})
        rec.set("registered")
        return rec.model_copy()


def quarantine(ws: Workspace, name: str, reason: str) -> ServerRecord:
    """Take a server out of every client config and skill folder and mark it quarantined."""
    _check_name(name)
    with _editing(ws) as reg:  # checked under the lock: no check-then-act race
        if name not in reg.servers and not wf.is_dir(ws.root, f"{STATE}/mcp/{name}"):
            raise UsageError(f"no server {name!r}.", next_step="list_servers shows what exists")
        rec = _record(reg, name)
        _unproject(ws, rec)
        rec.set("quarantined", reason or "quarantined by request")
        return rec.model_copy()


def list_servers(ws: Workspace) -> list[ServerRecord]:
    """Every server in the registry plus any folder under .harnesslab/mcp it does not know yet
    (status generated)."""
    reg = load_registry(ws)
    out = dict(reg.servers)
    for name in wf.list_dir(ws.root, f"{STATE}/mcp"):
        if (
            name not in out
            and SERVER_NAME_RE.match(name)
            and wf.is_dir(ws.root, f"{STATE}/mcp/{name}")
        ):
            out[name] = ServerRecord(name=name, status="generated")
    return [out[n] for n in sorted(out)]


__all__ = [
    "Registry",
    "ServerRecord",
    "Status",
    "bundle_dir",
    "launcher_argv",
    "list_servers",
    "load_registry",
    "qualified_bundle",
    "quarantine",
    "record_generated",
    "record_qualification",
    "register",
    "registry_path",
    "trusted_report",
]
