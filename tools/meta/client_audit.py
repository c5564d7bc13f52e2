"""What is in a workspace's client files that harnesslab did not write, and `prune`, which takes
it out.

A client starts what these files name outside every sandbox of the toolkit, with the user's
whole environment: a server in `.mcp.json` or `.codex/config.toml`, a hook or a `statusLine`
command in `.claude/settings*.json`, Codex's `.codex/hooks.json`; approvals (Claude Code's
`enabledMcpjsonServers`, `permissions`, Codex's rules) let them run unasked; skills are read into
the agent's context. The toolkit records in the trusted store what it wrote there
(tools/state/owned_config.py); every server, hook, approval, setting, skill or file found beyond
that record is a `Finding`, reported by `doctor`, `config`, `serve` and the loop with the command
that removes it, `harnesslab config --prune -w WS`.

Trusted side of the boundary: the files are read as untrusted input (tools/state/
workspace_files.py: no symlinks, size and depth limits, a symlink where a file should be is a
finding of its own), and nothing in them decides what is the toolkit's.
"""

from __future__ import annotations

import os
import shutil
import stat
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from ..errors import UsageError
from ..settings import Settings
from ..state import workspace_files as wf
from ..state.owned_config import OwnedConfig, OwnedRecord
from ..state.projection import CODEX_TOML, MCP_JSON, SKILL_ROOTS, render_toml_table, skill_digest

FindingKind = Literal["server", "hook", "approval", "setting", "skill", "file"]
CLAUDE_SETTINGS = (".claude/settings.json", ".claude/settings.local.json")
# Claude Code settings that run a command besides hooks, and those that load code or change
# what runs (plugins, marketplaces, environment variables).
CLAUDE_COMMAND_KEYS = (
    "statusLine",
    "apiKeyHelper",
    "awsAuthRefresh",
    "awsCredentialExport",
    "otelHeadersHelper",
    "fileSuggestion",
)
CLAUDE_CODE_KEYS = ("enabledPlugins", "extraKnownMarketplaces", "env")
CODEX_HOOK_KEYS = ("hooks", "notify")
CODEX_APPROVAL_KEYS = ("approval_policy", "sandbox_mode", "sandbox_workspace_write", "projects")
# Folders and files the toolkit reads or writes in each client folder; anything else there is
# reported (agents, commands, output styles, hook scripts, rules: the clients load them).
KNOWN = {
    ".claude": {"settings.json", "settings.local.json", "skills"},
    ".codex": {"config.toml"},
    ".agents": {"skills"},
}
DETAIL_CHARS = 200


class Finding(BaseModel):
    """One entry of a client file that harnesslab did not write."""

    kind: FindingKind
    file: str
    key: str = ""
    detail: str

    def line(self) -> str:
        where = f"{self.file} {self.key}" if self.key else self.file
        return f"{self.kind} in {where}: {self.detail}"


def prune_command(root: Path) -> str:
    return f"harnesslab config --prune -w {root}"


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


def _kind_of(root: Path, rel: str) -> str:
    """'missing', 'file', 'dir', or 'other' (a symlink, a hard link, a special file): what
    `rel` is, every component below `root` taken without following. Under a folder that is
    not a plain folder it is 'missing' (that folder is the finding)."""
    parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
    if parent and not wf.is_dir(root, parent):
        return "missing"
    try:
        st = os.lstat(root / rel)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "other"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else "other"


def _refused(rel: str) -> Finding:
    return Finding(
        kind="file",
        file=rel,
        detail="a symlink, hard link or special file where a client reads its configuration "
        "(the client follows it; harnesslab never wrote it)",
    )


def _read(root: Path, rel: str, what: str) -> tuple[Any, list[Finding]]:
    """(parsed content or None, findings) of the JSON or TOML file `rel`."""
    kind = _kind_of(root, rel)
    if kind == "missing":
        return None, []
    if kind != "file":
        return None, [_refused(rel)]
    try:
        text = wf.read_text(root, rel)
        data = wf.parse_json(text or "{}", source=rel) if what == "json" else tomllib.loads(text)
    except (UsageError, tomllib.TOMLDecodeError) as exc:
        why = exc.message if isinstance(exc, UsageError) else str(exc)
        return None, [Finding(kind="file", file=rel, detail=f"does not parse ({_short(why)})")]
    if not isinstance(data, dict):
        return None, [Finding(kind="file", file=rel, detail="is not an object")]
    return data, []


def _server_text(spec: Any) -> str:
    if not isinstance(spec, dict):
        return _short(repr(spec))
    if spec.get("url"):
        return f"connects to {_short(spec['url'])}"
    args = spec.get("args")
    words = [spec.get("command", ""), *(args if isinstance(args, list) else [])]
    return f"starts `{_short(' '.join(str(w) for w in words))}`"


def _servers(rel: str, servers: Any, mine: dict[str, dict[str, Any]], key: str) -> list[Finding]:
    if not isinstance(servers, dict):
        return [Finding(kind="server", file=rel, key=key, detail="is not a table of servers")]
    out = []
    for name, spec in servers.items():
        ours = mine.get(name)
        if ours == spec:
            continue
        how = "not written by harnesslab" if ours is None else "changed since harnesslab wrote it"
        out.append(
            Finding(
                kind="server", file=rel, key=f"{key}.{name}", detail=f"{how}: {_server_text(spec)}"
            )
        )
    return out


def _mcp_json(root: Path, owned: OwnedRecord) -> list[Finding]:
    data, out = _read(root, MCP_JSON, "json")
    if data is None:
        return out
    mine = owned.servers.get("claude", {})
    out += _servers(MCP_JSON, data.get("mcpServers", {}), mine, "mcpServers")
    for key in sorted(set(data) - {"mcpServers"}):
        out.append(
            Finding(kind="setting", file=MCP_JSON, key=key, detail="not written by harnesslab")
        )
    return out


def _hook_commands(groups: Any) -> list[str]:
    found = []
    for group in groups if isinstance(groups, list) else [groups]:
        hooks = group.get("hooks") if isinstance(group, dict) else None
        for hook in hooks if isinstance(hooks, list) else [group]:
            if isinstance(hook, dict):
                found.append(str(hook.get("command") or hook.get("prompt") or hook))
    return found


def _claude_settings(root: Path, rel: str, owned: OwnedRecord) -> list[Finding]:
    data, out = _read(root, rel, "json")
    if data is None:
        return out

    def add(kind: FindingKind, key: str, detail: str) -> None:
        out.append(Finding(kind=kind, file=rel, key=key, detail=detail))

    hooks = data.get("hooks")
    if hooks is not None:
        for event, groups in hooks.items() if isinstance(hooks, dict) else [("?", hooks)]:
            commands = "; ".join(_hook_commands(groups)) or "(no command)"
            add("hook", f"hooks.{event}", f"runs `{_short(commands)}` on {event}")
    for key in CLAUDE_COMMAND_KEYS:
        if key in data:
            add("hook", key, f"runs a command: {_short(repr(data[key]))}")
    for key in CLAUDE_CODE_KEYS:
        if key in data:
            add("setting", key, f"changes what Claude Code runs: {_short(repr(data[key]))}")
    enabled = data.get("enabledMcpjsonServers")
    for name in enabled if isinstance(enabled, list) else []:
        if name not in owned.approvals:
            add("approval", "enabledMcpjsonServers", f"approves the .mcp.json server {name!r}")
    if data.get("enableAllProjectMcpServers"):
        add("approval", "enableAllProjectMcpServers", "approves every .mcp.json server")
    perms = data.get("permissions")
    if isinstance(perms, dict):
        for key in ("allow", "defaultMode", "additionalDirectories"):
            if perms.get(key) and perms.get(key) != "default":
                add("approval", f"permissions.{key}", _short(repr(perms[key])))
    return out


def _codex(root: Path, owned: OwnedRecord) -> list[Finding]:
    data, out = _read(root, CODEX_TOML, "toml")
    if data is None:
        return out
    mine = owned.servers.get("codex", {})
    out += _servers(CODEX_TOML, data.get("mcp_servers", {}), mine, "mcp_servers")
    for key in sorted(set(data) - {"mcp_servers"}):
        kind: FindingKind = (
            "hook"
            if key in CODEX_HOOK_KEYS
            else "approval"
            if key in CODEX_APPROVAL_KEYS
            else "setting"
        )
        out.append(
            Finding(
                kind=kind,
                file=CODEX_TOML,
                key=key,
                detail=f"not written by harnesslab: {_short(repr(data[key]))}",
            )
        )
    return out


def _skills(root: Path, owned: OwnedRecord) -> list[Finding]:
    out = []
    for base in SKILL_ROOTS:
        if _kind_of(root, base) == "other":
            out.append(_refused(base))
            continue
        for name in wf.list_dir(root, base):
            rel = f"{base}/{name}"
            if _kind_of(root, rel) != "dir":
                out.append(_refused(rel))
                continue
            try:
                digest = skill_digest(root, rel)
            except UsageError as exc:
                out.append(Finding(kind="skill", file=rel, detail=_short(exc.message)))
                continue
            ours = owned.skills.get(rel)
            if ours != digest:
                how = "not written by harnesslab" if ours is None else "changed since written"
                out.append(
                    Finding(kind="skill", file=rel, detail=f"{how} (read into the agent's context)")
                )
    return out


def _other_files(root: Path) -> list[Finding]:
    out = []
    for folder, known in KNOWN.items():
        kind = _kind_of(root, folder)
        if kind == "other":
            out.append(_refused(folder))
            continue
        for name in wf.list_dir(root, folder):
            if name in known:
                continue
            rel = f"{folder}/{name}"
            what = {
                ".codex/hooks.json": ("hook", "project hooks Codex runs"),
                ".codex/rules": ("approval", "execpolicy rules that let Codex run commands"),
            }.get(rel, ("file", "not written by harnesslab; the client may load it"))
            out.append(Finding(kind=what[0], file=rel, detail=what[1]))  # type: ignore[arg-type]
    return out


def audit(root: Path, owned: OwnedRecord) -> list[Finding]:
    """Every server, hook, approval, setting, skill or file in `root`'s client files that the
    record `owned` does not hold (changed entries included), in a stable order."""
    root = root.resolve()
    out = _mcp_json(root, owned)
    for rel in CLAUDE_SETTINGS:
        out += _claude_settings(root, rel, owned)
    out += _codex(root, owned)
    out += _skills(root, owned)
    out += _other_files(root)
    return out


def audit_workspace(root: Path, settings: Settings) -> list[Finding]:
    """`audit` against the record in the trusted store of `root`."""
    return audit(root, OwnedConfig.of(settings, root.resolve()).load())


# -- prune ---------------------------------------------------------------------------------------


def _remove(root: Path, rel: str) -> None:
    """Remove `rel` itself (never what a symlink points to, never through a symlinked folder)."""
    kind = _kind_of(root, rel)
    parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
    if kind == "dir" and wf.is_dir(root, rel):
        shutil.rmtree(root / rel)
    elif kind in ("file", "other") and (not parent or wf.is_dir(root, parent)):
        os.unlink(root / rel)


def prune(root: Path, settings: Settings) -> list[Finding]:
    """Take every finding of `audit_workspace` out of the files: foreign or changed servers,
    hooks, commands, approvals and settings are removed from their files (the toolkit's own
    entries stay), unknown skills and files are deleted. Returns what was removed."""
    root = root.resolve()
    owned = OwnedConfig.of(settings, root).load()
    found = audit(root, owned)
    files = {f.file for f in found}
    mcp, _ = _read(root, MCP_JSON, "json")
    if MCP_JSON in files:
        if mcp is None:
            _remove(root, MCP_JSON)
        else:
            mine = owned.servers.get("claude", {})
            servers = mcp.get("mcpServers") if isinstance(mcp.get("mcpServers"), dict) else {}
            kept = {n: s for n, s in servers.items() if mine.get(n) == s}
            wf.write_json(root, MCP_JSON, {"mcpServers": kept})
    for rel in CLAUDE_SETTINGS:
        if rel in files:
            data, _ = _read(root, rel, "json")
            if data is None:
                _remove(root, rel)
            else:
                wf.write_json(root, rel, _pruned_settings(data, owned))
    if CODEX_TOML in files:
        data, _ = _read(root, CODEX_TOML, "toml")
        if data is None:
            _remove(root, CODEX_TOML)
        else:
            mine = owned.servers.get("codex", {})
            tables = data.get("mcp_servers") if isinstance(data.get("mcp_servers"), dict) else {}
            text = "\n".join(
                render_toml_table(["mcp_servers", n], t)
                for n, t in tables.items()
                if mine.get(n) == t
            )
            wf.write_text(root, CODEX_TOML, text)
    for f in found:
        if f.file not in (MCP_JSON, CODEX_TOML, *CLAUDE_SETTINGS):
            _remove(root, f.file)
    return found


def _pruned_settings(data: dict[str, Any], owned: OwnedRecord) -> dict[str, Any]:
    out = {
        k: v
        for k, v in data.items()
        if k not in ("hooks", "enableAllProjectMcpServers", *CLAUDE_COMMAND_KEYS, *CLAUDE_CODE_KEYS)
    }
    enabled = out.get("enabledMcpjsonServers")
    if isinstance(enabled, list):
        out["enabledMcpjsonServers"] = [n for n in enabled if n in owned.approvals]
    perms = out.get("permissions")
    if isinstance(perms, dict):
        out["permissions"] = {
            k: v
            for k, v in perms.items()
            if k not in ("allow", "defaultMode", "additionalDirectories")
        }
    return out


__all__ = ["Finding", "audit", "audit_workspace", "prune", "prune_command"]
