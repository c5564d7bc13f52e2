"""What Claude Code and Codex need, beyond the server entry, before they start a workspace's
MCP server, and whether a workspace has it.

Measured with Claude Code 2.1.330 and codex-cli 0.169.0 (tests/servers/test_clients.py runs
both):
- Claude Code lists a `.mcp.json` server as "Pending approval" and never starts it until it is
  approved: the server's name in `enabledMcpjsonServers` of the workspace's
  `.claude/settings.local.json` (what Claude Code's own approval dialog writes), read only in a
  trusted folder: `projects[<folder>].hasTrustDialogAccepted` in its global config
  (`~/.claude.json`, or `$CLAUDE_CONFIG_DIR/.claude.json`). Both are needed.
- Codex reads a project's `.codex/config.toml` only in a trusted project: a
  `[projects."<folder>"]` table with `trust_level = "trusted"` in `~/.codex/config.toml`
  (`$CODEX_HOME`). Until then `codex mcp list` shows no servers.
Both clients key the trust on the folder they are started in (or a folder above it), so the
client has to be started inside the workspace.

Writes are merges: every other key of those files is kept, and a file that does not parse is
never overwritten. What is written into the workspace is recorded in its trusted store
(tools/state/owned_config.py): tools/meta/client_audit.py reports whatever else is there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..settings import Settings
from ..state.owned_config import OwnedConfig
from ..state.projection import read_toml_table, write_toml_table
from ..state.storage import atomic_write_text

ClientName = Literal["claude", "codex"]
CLAUDE_LOCAL_SETTINGS = Path(".claude") / "settings.local.json"
CLAUDE_PROJECT_SETTINGS = Path(".claude") / "settings.json"
CODEX_PROJECT_CONFIG = Path(".codex") / "config.toml"


class ClientStatus(BaseModel):
    """Whether a client will start the workspace's server `name`, and what is missing."""

    client: ClientName
    name: str
    configured: bool = Field(description="the entry is in the workspace's client config")
    launchable: bool = Field(description="its command exists (or it is an HTTP entry)")
    approved: bool = Field(description="Claude: approved in project settings; Codex: n/a (True)")
    trusted: bool = Field(description="the workspace is trusted in the client's user config")
    missing: list[str] = Field(default_factory=list, description="what stops the client")
    fix: str = Field(default="", description="the command that fixes what is missing")

    @property
    def ready(self) -> bool:
        return not self.missing


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text() or "{}")
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); not overwriting it.",
            next_step="fix or remove the file, then run this again",
        ) from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object.", next_step="fix or remove the file")
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def folder_key(root: Path) -> str:
    """How both clients name a folder in their trust records: its resolved absolute path."""
    return str(root.expanduser().resolve())


def _folders_up(root: Path) -> list[str]:
    path = Path(folder_key(root))
    return [str(p) for p in (path, *path.parents)]


# -- Claude Code -----------------------------------------------------------------------------


def approve_claude(root: Path, name: str, settings: Settings) -> list[Path]:
    """Approve the `.mcp.json` server `name` for the workspace and trust the workspace in
    Claude Code; returns the files written."""
    local = root / CLAUDE_LOCAL_SETTINGS
    data = _read_json(local)
    enabled = [s for s in data.get("enabledMcpjsonServers") or [] if isinstance(s, str)]
    data["enabledMcpjsonServers"] = [*enabled, name] if name not in enabled else enabled
    disabled = data.get("disabledMcpjsonServers")
    if isinstance(disabled, list) and name in disabled:  # --approve overrides an earlier "no"
        data["disabledMcpjsonServers"] = [s for s in disabled if s != name]
    _write_json(local, data)
    OwnedConfig.of(settings, root).approval(name, added=True)
    global_config = settings.claude_global_config()
    glob = _read_json(global_config)
    projects = glob.setdefault("projects", {})
    if not isinstance(projects, dict):
        raise UsageError(
            f"{global_config}: `projects` is not an object; not overwriting it.",
            next_step="fix the file, or start `claude` in the workspace and accept its trust dialog",
        )
    entry = projects.setdefault(folder_key(root), {})
    entry["hasTrustDialogAccepted"] = True
    _write_json(global_config, glob)
    return [local, global_config]


def _claude_approved(root: Path, name: str) -> bool:
    for rel in (CLAUDE_LOCAL_SETTINGS, CLAUDE_PROJECT_SETTINGS):
        data = _read_json(root / rel)
        if name in (data.get("disabledMcpjsonServers") or []):
            return False
        if data.get("enableAllProjectMcpServers") is True:
            return True
        if name in (data.get("enabledMcpjsonServers") or []):
            return True
    return False


def _claude_trusted(root: Path, settings: Settings) -> bool:
    projects = _read_json(settings.claude_global_config()).get("projects") or {}
    return any((projects.get(p) or {}).get("hasTrustDialogAccepted") for p in _folders_up(root))


def _launchable(command: str | None, url: str | None) -> bool:
    if url:
        return True
    if not command:
        return False
    return Path(command).is_file() or shutil.which(command) is not None


def claude_status(root: Path, name: str, settings: Settings) -> ClientStatus:
    fix = f"harnesslab config claude -w {root} --write --approve"
    found = (_read_json(root / ".mcp.json").get("mcpServers") or {}).get(name)
    spec: dict[str, Any] = found if isinstance(found, dict) else {}
    st = ClientStatus(
        client="claude",
        name=name,
        configured=bool(spec),
        launchable=bool(spec) and _launchable(spec.get("command"), spec.get("url")),
        approved=_claude_approved(root, name),
        trusted=_claude_trusted(root, settings),
    )
    if not st.configured:
        st.missing.append(f"no {name!r} entry in {root / '.mcp.json'}")
    elif not st.launchable:
        st.missing.append(
            f"{root / '.mcp.json'}: {name!r} starts {spec.get('command')!r}, which does not "
            "exist (moved virtualenv?)"
        )
    if not st.approved:
        st.missing.append(f"{name!r} is not approved (Claude Code shows it as Pending approval)")
    if not st.trusted:
        st.missing.append(
            f"{folder_key(root)} is not trusted in {settings.claude_global_config()}, so Claude "
            "Code ignores the workspace's approvals"
        )
    if st.missing:
        st.fix = f"{fix}, then start `claude` inside {root}"
    return st


# -- Codex -----------------------------------------------------------------------------------


def trust_codex(root: Path, settings: Settings) -> Path:
    """Trust the workspace in Codex (`[projects."<folder>"] trust_level = "trusted"`), keeping
    any other setting of that project table; returns the file written."""
    path = settings.codex_config()
    key = ["projects", folder_key(root)]
    values = dict(read_toml_table(path, key) or {})
    values["trust_level"] = "trusted"
    return write_toml_table(path, key, values)


def _codex_trusted(root: Path, settings: Settings) -> bool:
    path = settings.codex_config()
    for folder in _folders_up(root):
        table = read_toml_table(path, ["projects", folder]) or {}
        if "trust_level" in table:
            return table["trust_level"] == "trusted"
    return False


def codex_status(root: Path, name: str, settings: Settings) -> ClientStatus:
    fix = f"harnesslab config codex -w {root} --write --approve"
    spec = read_toml_table(root / CODEX_PROJECT_CONFIG, ["mcp_servers", name], root=root)
    st = ClientStatus(
        client="codex",
        name=name,
        configured=spec is not None,
        launchable=spec is not None and _launchable(spec.get("command"), spec.get("url")),
        approved=True,
        trusted=_codex_trusted(root, settings),
    )
    if spec is None:
        st.missing.append(f"no [mcp_servers.{name}] in {root / CODEX_PROJECT_CONFIG}")
    elif not st.launchable:
        st.missing.append(
            f"{root / CODEX_PROJECT_CONFIG}: {name!r} starts {spec.get('command')!r}, which "
            "does not exist (moved virtualenv?)"
        )
    if not st.trusted:
        st.missing.append(
            f"{folder_key(root)} is not trusted in {settings.codex_config()}, so Codex does not "
            "read the workspace's .codex/config.toml (`codex mcp list` shows no servers)"
        )
    if st.missing:
        st.fix = f"{fix}, then start `codex` inside {root}"
    return st


def client_status(client: ClientName, root: Path, name: str, settings: Settings) -> ClientStatus:
    return (claude_status if client == "claude" else codex_status)(root, name, settings)


def approve(client: ClientName, root: Path, name: str, settings: Settings) -> list[Path]:
    """What `config CLIENT --write --approve` adds after writing the entry."""
    if client == "claude":
        return approve_claude(root, name, settings)
    return [trust_codex(root, settings)]


__all__ = [
    "ClientName",
    "ClientStatus",
    "approve",
    "approve_claude",
    "claude_status",
    "client_status",
    "codex_status",
    "folder_key",
    "trust_codex",
]
