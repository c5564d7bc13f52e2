"""`harnesslab doctor`'s library half: is everything in place to work on a workspace, and if not,
which command fixes it?

Checks, in order: the workspace; the executor (every GPU host reachable, the runner's torch and
triton working: tools/execution/health.py); each agent CLI as its runner checks it before a run
(installed, flags accepted, logged in: tools/loop/agent_clis.py); each client's config for the
workspace (entry present, its command there, approved and trusted: tools/meta/client_setup.py);
every server, hook, approval or skill in the workspace's client files that harnesslab did not
write (tools/meta/client_audit.py: a client would run it outside every sandbox), with the
command that removes it. Nothing here spends tokens or changes a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from .errors import HarnesslabError
from .execution import build_launcher, health_check
from .loop import build_runner
from .meta.client_audit import audit_workspace, prune_command
from .meta.client_setup import ClientName, client_status
from .settings import Settings
from .state import Workspace, open_workspace

CheckStatus = Literal["ok", "missing", "skipped", "foreign"]


class Check(BaseModel):
    name: str = Field(description="what was checked: workspace, executor, claude CLI, ...")
    status: CheckStatus
    detail: str
    fix: str = Field(default="", description="the command (or step) that fixes it")


class DoctorReport(BaseModel):
    ok: bool = Field(description="nothing missing, nothing foreign in the client files")
    checks: list[Check]


def _error_check(name: str, exc: HarnesslabError) -> Check:
    return Check(name=name, status="missing", detail=exc.message, fix=exc.next_step)


async def check_executor(ws: Workspace, settings: Settings) -> Check:
    launcher = build_launcher(settings)
    try:
        report = await health_check(launcher, ws.task)
    except HarnesslabError as exc:
        return _error_check("executor", exc)
    finally:
        await launcher.aclose()
    if report.ok:
        notes = [n.message for h in report.hosts for n in h.notes]
        return Check(name="executor", status="ok", detail="; ".join([report.summary, *notes]))
    problems = [p for h in report.hosts for p in h.problems]
    return Check(
        name="executor",
        status="missing",
        detail=report.summary,
        fix=problems[0].next_step if problems else "check --gpu-host and the SSH settings",
    )


async def check_agent_cli(client: ClientName, settings: Settings) -> Check:
    runner = build_runner(client, settings=settings)
    try:
        detail = await runner.preflight()
    except HarnesslabError as exc:
        return _error_check(f"{client} CLI", exc)
    return Check(name=f"{client} CLI", status="ok", detail=detail)


def check_client_config(client: ClientName, root: Path, name: str, settings: Settings) -> Check:
    label = f"{client} config"
    try:
        st = client_status(client, root, name, settings)
    except HarnesslabError as exc:
        return _error_check(label, exc)
    if st.ready:
        where = ".mcp.json" if client == "claude" else ".codex/config.toml"
        how = "approved, workspace trusted" if client == "claude" else "workspace trusted"
        return Check(name=label, status="ok", detail=f"{name!r} in {where}, {how}")
    return Check(name=label, status="missing", detail="; ".join(st.missing), fix=st.fix)


def check_client_files(root: Path, settings: Settings) -> list[Check]:
    """One `foreign` check per entry of the client files harnesslab did not write."""
    try:
        found = audit_workspace(root, settings)
    except HarnesslabError as exc:
        return [_error_check("client files", exc)]
    if not found:
        return [
            Check(
                name="client files",
                status="ok",
                detail="only harnesslab's entries in .mcp.json, .claude/settings*.json, "
                ".codex/config.toml and the skill folders",
            )
        ]
    fix = prune_command(root)
    return [
        Check(name=f"foreign {f.kind}", status="foreign", detail=f.line(), fix=fix) for f in found
    ]


async def run_doctor(
    root: Path,
    settings: Settings,
    *,
    clients: tuple[ClientName, ...] = ("claude", "codex"),
    name: str = "harnesslab",
    executor: bool = True,
) -> DoctorReport:
    checks: list[Check] = []
    ws: Workspace | None = None
    try:
        ws = open_workspace(root, settings)
        checks.append(
            Check(name="workspace", status="ok", detail=f"{ws.root}: task {ws.task.name}")
        )
    except HarnesslabError as exc:
        check = _error_check("workspace", exc)
        if not (root / ".harnesslab").exists():
            check.fix = f"harnesslab init -w {root} --task rmsnorm_gate   (or another task)"
        checks.append(check)
    if ws is not None and executor:
        checks.append(await check_executor(ws, settings))
    for client in clients:
        checks.append(await check_agent_cli(client, settings))
    for client in clients:
        if ws is None:
            checks.append(
                Check(name=f"{client} config", status="skipped", detail="no workspace yet")
            )
        else:
            checks.append(check_client_config(client, ws.root, name, settings))
    if ws is not None:
        checks += check_client_files(ws.root, settings)
    bad = ("missing", "foreign")
    return DoctorReport(ok=all(c.status not in bad for c in checks), checks=checks)


__all__ = [
    "Check",
    "DoctorReport",
    "check_agent_cli",
    "check_client_config",
    "check_client_files",
    "run_doctor",
]
