"""Which MCP servers a loop turn gets, and what happens to the servers a build turn produces.

A turn's servers are written to an MCP config file in the run folder in the Claude Code format
(`{"mcpServers": {name: {command, args, cwd, env}}}`); the claude runner passes it as is, the
codex runner turns it into `-c mcp_servers.*` overrides, the autopilot reads it. Attempts get the
task server plus every registered generated server; build and repair turns also get the
meta-server. The turn's skills (the shipped ones for the task, and each registered server's
qualified skill) go into a Claude Code plugin folder in the trusted run folder
(`write_skills_plugin`): the claude runner reads no project skill, hook or setting of the
workspace. Generated servers are qualified and registered or quarantined through
tools/qualification and tools/registry.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..catalog import META_SERVER, META_TOOLS, TASK_SERVER, TASK_TOOLS, harnesslab_argv
from ..errors import HarnesslabError
from ..meta import load_manifest, registry
from ..meta.cleanroom import SKIP_NAMES
from ..meta.qualification import (
    failure_report,
    hash_items,
    qualify_workspace_server,
    workspace_bundle,
)
from ..meta.registry import launcher_argv, load_registry, qualified_bundle, trusted_report
from ..meta.skills import skill_dir, skills_for_task
from ..settings import Settings
from ..state import workspace_files as wf
from ..state.storage import atomic_write_json
from ..state.workspace import STATE, Workspace


class TurnServers(BaseModel):
    """The servers of one turn: config entries and, per server, the tools it offers."""

    entries: dict[str, dict[str, Any]] = Field(default_factory=dict)
    tools: dict[str, list[str]] = Field(default_factory=dict)


class Qualification(BaseModel):
    name: str
    passed: bool
    report: str = ""
    tools: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


def _entry(argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    return {"command": argv[0], "args": argv[1:], "cwd": str(cwd), "env": env}


def turn_servers(ws: Workspace, settings: Settings, *, meta: bool) -> TurnServers:
    env = settings.to_env()
    out = TurnServers()
    out.entries[TASK_SERVER] = _entry(
        harnesslab_argv("serve", "--workspace", str(ws.root)), ws.root, env
    )
    out.tools[TASK_SERVER] = list(TASK_TOOLS)
    for name, (entry, tools) in registered_servers(ws, env).items():
        out.entries[name] = entry
        out.tools[name] = tools
    if meta:
        out.entries[META_SERVER] = _entry(
            harnesslab_argv("meta", "--workspace", str(ws.root)), ws.root, env
        )
        out.tools[META_SERVER] = list(META_TOOLS)
    return out


def write_mcp_config(path: Path, servers: TurnServers) -> Path:
    atomic_write_json(path, {"mcpServers": servers.entries})
    return path


PLUGIN_NAME = "harnesslab"


def write_skills_plugin(dest: Path, ws: Workspace) -> Path:
    """A Claude Code plugin folder (`claude --plugin-dir DEST`, skills named `harnesslab:NAME`)
    with the skills a turn gets: the shipped skills for the workspace's task and the qualified
    skill of every registered server, copied from the toolkit and the trusted store, never from
    the workspace. Rebuilt for every turn."""
    if dest.exists():
        shutil.rmtree(dest)
    skills = {name: skill_dir(name) for name in skills_for_task(ws.task.name)}
    for name, digest in registered_names(ws).items():
        try:
            folder = qualified_bundle(ws, name, digest) / STATE / "skills" / name
        except HarnesslabError:
            continue
        if (folder / "SKILL.md").is_file():
            skills[name] = folder
    for name, folder in skills.items():
        shutil.copytree(
            folder,
            dest / "skills" / name,
            symlinks=False,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    atomic_write_json(
        dest / ".claude-plugin" / "plugin.json",
        {
            "name": PLUGIN_NAME,
            "version": "1.0.0",
            "description": "harnesslab's skills for this turn (shipped and qualified ones)",
        },
    )
    return dest


def registered_servers(
    ws: Workspace, env: dict[str, str]
) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Registered generated servers: name -> (config entry, tool names). The entry is the
    toolkit's launcher for the qualified bundle in the trusted store (tools/meta/registry.py), never
    the command of a manifest in the workspace; a server whose kept bundle is gone or altered
    is left out."""

    out: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for name, digest in registered_names(ws).items():
        report = trusted_report(ws, name)
        if report is None or not report.passed or report.bundle_hash != digest:
            continue
        try:
            kept = qualified_bundle(ws, name, digest)
            manifest = load_manifest(kept / STATE / "mcp" / name)
        except HarnesslabError:
            continue
        entry = _entry(launcher_argv(ws, name), ws.root, env)
        out[name] = (entry, [t.name for t in manifest.enabled_tools()])
    return out


def registered_names(ws: Workspace) -> dict[str, str]:
    """Registered servers in the trusted registry: name -> qualified bundle hash."""

    reg = load_registry(ws)
    return {
        n: rec.bundle_hash for n, rec in sorted(reg.servers.items()) if rec.status == "registered"
    }


def generated_snapshot(ws: Workspace) -> dict[str, str]:
    """name -> content hash of every generated server folder (to see what a build changed);
    a folder that cannot be read as untrusted input (a symlink in it) hashes as 'refused'."""

    out: dict[str, str] = {}
    for name in wf.list_dir(ws.root, f"{STATE}/mcp"):
        rel = f"{STATE}/mcp/{name}"
        if not wf.is_dir(ws.root, rel):
            continue
        h = hashlib.sha256()
        try:
            for path, data in wf.walk_files(ws.root, rel, skip=SKIP_NAMES):
                h.update(path[len(rel) + 1 :].encode() + b"\0" + data + b"\0")
        except HarnesslabError:
            out[name] = "refused"
            continue
        out[name] = h.hexdigest()[:16]
    return out


def build_candidates(
    before: dict[str, str], after: dict[str, str], claim: dict[str, Any] | None
) -> list[str]:
    """Servers the build turn created or changed, plus the one its result.json names."""
    names = [n for n, h in after.items() if before.get(n) != h]
    claimed = (claim or {}).get("server")
    if isinstance(claimed, str) and claimed in after and claimed not in names:
        names.append(claimed)
    return names


async def qualify(ws: Workspace, name: str, settings: Settings) -> Qualification:
    """Qualification in a clean room (tools/qualification); the registry records the outcome:
    qualified, or quarantined with the reason."""

    report = await qualify_workspace_server(ws, name, settings)
    return Qualification(
        name=name,
        passed=report.passed,
        report=report.summary() if report.passed else failure_report(report),
        tools=list(report.tools),
        details={
            "passed": report.passed,
            "failed": [c.name for c in report.failed()],
            "reason": report.reason(),
            "duration_s": report.duration_s,
            "report": report.report_path,
        },
    )


def fresh_qualification(ws: Workspace, name: str, since: float) -> Qualification | None:
    """A qualification the build turn already ran (self_test_server) for exactly the files the
    server has now, or None: read from the trusted store, never from the workspace. Saves a
    second clean-room run (~10 s on a CPU) per build."""
    rec = load_registry(ws).servers.get(name)
    report = trusted_report(ws, name)
    if rec is None or rec.status not in ("qualified", "registered") or report is None:
        return None
    if report.qualified_at < since or not report.passed:
        return None
    try:
        current = hash_items(workspace_bundle(ws, name))
    except HarnesslabError:
        return None
    if report.bundle_hash != current or rec.bundle_hash != current:
        return None
    return Qualification(
        name=name,
        passed=True,
        report=report.summary() + " (self_test_server during the build turn)",
        tools=list(report.tools),
        details={"passed": True, "reused": True, "report": report.report_path},
    )


def register(ws: Workspace, name: str, settings: Settings) -> None:
    """Project a qualified server into .mcp.json / .codex/config.toml and the skill folders."""

    registry.register(ws, name, env=settings.to_env())


def quarantine(ws: Workspace, name: str, reason: str) -> None:

    registry.quarantine(ws, name, reason)


__all__ = [
    "META_SERVER",
    "TASK_SERVER",
    "Qualification",
    "TurnServers",
    "build_candidates",
    "fresh_qualification",
    "generated_snapshot",
    "harnesslab_argv",
    "qualify",
    "quarantine",
    "register",
    "registered_servers",
    "turn_servers",
    "write_mcp_config",
    "write_skills_plugin",
]
