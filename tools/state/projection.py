"""Projection of servers and skills into the clients' own configuration formats.

One mechanism, used by `harnesslab config`, the meta-server's register_server and the skills
projection:
- Claude Code: `<ws>/.mcp.json`, `{"mcpServers": {name: {command, args, cwd?, env?}}}`
  (or `{type: "http", url, headers}` for a running HTTP server);
- Codex: `<ws>/.codex/config.toml`, `[mcp_servers.<name>]` with command/args/cwd/env and explicit
  startup_timeout_sec / tool_timeout_sec (or url + bearer_token_env_var);
- skills: a skill folder copied to `<ws>/.claude/skills/<name>/` and `<ws>/.agents/skills/<name>/`.

Merging keeps every other entry intact. TOML is written by hand (tomllib only reads): the
`[mcp_servers.<name>]` table and its sub-tables are cut out of the text and the new table is
appended, so comments and other tables survive byte for byte. Every write is atomic. Given an
`owned` record (tools/state/owned_config.py, in the trusted store), each writer records what it
wrote and forgets what it removed: what `doctor` and the loop compare the files against.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from . import workspace_files as wf
from .owned_config import OwnedConfig, tree_digest
from .storage import atomic_write_text

Client = Literal["claude", "codex"]
ENTRY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
SKILL_ROOTS = (".claude/skills", ".agents/skills")
MCP_JSON = ".mcp.json"
CODEX_TOML = ".codex/config.toml"

# Codex waits startup_timeout_sec for the server's first answer and tool_timeout_sec for one
# tool call. Its defaults (10 s, 60 s) are too short here: the server imports the MCP SDK
# (~1 s) and a sweep or the guarded verify can run for minutes on the GPU host.
DEFAULT_STARTUP_TIMEOUT_S = 30
DEFAULT_TOOL_TIMEOUT_S = 1800


class ServerEntry(BaseModel):
    """How a client starts (stdio) or reaches (http) one MCP server."""

    name: str = Field(description="entry name in the client's config: letters, digits, _ and -")
    command: str = ""
    args: list[str] = Field(default_factory=list)
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = Field(
        default=None, description="streamable-HTTP endpoint instead of a command"
    )
    token_env_var: str | None = Field(
        default=None, description="environment variable holding the bearer token (http only)"
    )
    startup_timeout_s: int = Field(default=DEFAULT_STARTUP_TIMEOUT_S, ge=1)
    tool_timeout_s: int = Field(default=DEFAULT_TOOL_TIMEOUT_S, ge=1)

    def checked(self) -> ServerEntry:
        check_name(self.name, "server name")
        if not self.url and not self.command:
            raise UsageError(f"server {self.name!r}: neither command nor url given.")
        return self


def check_name(name: str, what: str) -> str:
    if not ENTRY_NAME_RE.match(name or ""):
        raise UsageError(
            f"{what} {name!r} is not allowed.",
            next_step="use 1-64 letters, digits, '_' or '-', starting with a letter or digit",
        )
    return name


# -- Claude Code: .mcp.json -------------------------------------------------------------------


def claude_entry(entry: ServerEntry) -> dict[str, Any]:
    if entry.url:
        out: dict[str, Any] = {"type": "http", "url": entry.url}
        if entry.token_env_var:
            out["headers"] = {"Authorization": f"Bearer ${{{entry.token_env_var}}}"}
        return out
    out = {"command": entry.command, "args": list(entry.args)}
    if entry.cwd:
        out["cwd"] = entry.cwd
    if entry.env:
        out["env"] = dict(entry.env)
    return out


def render_mcp_json(entry: ServerEntry) -> str:
    return json.dumps({"mcpServers": {entry.name: claude_entry(entry.checked())}}, indent=2) + "\n"


def _exists(root: Path, rel: str) -> bool:
    return wf.is_file(root, rel) or (root / rel).is_symlink()


def _read_mcp_json(root: Path) -> dict[str, Any]:
    """The workspace's .mcp.json (an agent-writable file: read through workspace_files, so a
    symlink to some other JSON file is refused, not merged and written back)."""
    if not _exists(root, MCP_JSON):
        return {}
    text = wf.read_text(root, MCP_JSON)
    try:
        data = wf.parse_json(text or "{}", source=MCP_JSON)
    except UsageError as exc:
        raise UsageError(
            f"{root / MCP_JSON}: {exc.message} Not overwriting it.",
            next_step="fix or remove the file, then run this again",
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise UsageError(
            f"{root / MCP_JSON}: expected {{'mcpServers': {{...}}}}.", next_step="fix the file"
        )
    return data


def write_mcp_json(root: Path, entry: ServerEntry, *, owned: OwnedConfig | None = None) -> Path:
    """Merge `entry` into `<root>/.mcp.json` (other servers and keys are kept)."""
    data = _read_mcp_json(root)
    written = claude_entry(entry.checked())
    data.setdefault("mcpServers", {})[entry.name] = written
    wf.write_text(root, MCP_JSON, json.dumps(data, indent=2) + "\n")
    if owned is not None:
        owned.server("claude", entry.name, written)
    return root / MCP_JSON


def remove_mcp_json(root: Path, name: str, *, owned: OwnedConfig | None = None) -> bool:
    if owned is not None:
        owned.server("claude", name, None)
    data = _read_mcp_json(root)
    if name not in data.get("mcpServers", {}):
        return False
    del data["mcpServers"][name]
    wf.write_text(root, MCP_JSON, json.dumps(data, indent=2) + "\n")
    return True


# -- Codex: .codex/config.toml ------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_HEADER = re.compile(r"^\s*\[\[?\s*(.+?)\s*\]\]?\s*(#.*)?$")


def toml_string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_string(key)


def toml_value(value: Any) -> str:
    """A TOML value: bool, number, string, list, or a dict as an inline table."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def codex_entry(entry: ServerEntry) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if entry.url:
        out["url"] = entry.url
        if entry.token_env_var:
            out["bearer_token_env_var"] = entry.token_env_var
    else:
        out["command"] = entry.command
        out["args"] = list(entry.args)
        if entry.cwd:
            out["cwd"] = entry.cwd
    out["startup_timeout_sec"] = entry.startup_timeout_s
    out["tool_timeout_sec"] = entry.tool_timeout_s
    if entry.env and not entry.url:
        out["env"] = dict(entry.env)
    return out


def render_codex_toml(entry: ServerEntry) -> str:
    entry.checked()
    return render_toml_table(["mcp_servers", entry.name], codex_entry(entry))


def _header_path(line: str) -> list[str] | None:
    """The key path of a table header line (`[a."b.c"]` -> ["a", "b.c"]), else None."""
    m = _HEADER.match(line)
    if not m or line.lstrip().startswith("[["):
        return [] if m else None  # an array-of-tables header ends a section too
    try:
        node: Any = tomllib.loads(f"[{m.group(1)}]\n")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        key = next(iter(node))
        path.append(key)
        node = node[key]
    return path


def _load_toml(path: Path, root: Path | None = None) -> tuple[str, dict[str, Any]]:
    """(text, data) of a TOML file; inside a workspace (`root`) read through workspace_files,
    so a symlink planted by the agent is refused rather than followed."""
    rel = path.relative_to(root).as_posix() if root is not None else ""
    if not (_exists(root, rel) if root is not None else path.is_file()):
        return "", {}
    text = wf.read_text(root, rel) if root is not None else path.read_text()
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(
            f"{path} is not valid TOML ({exc}); not overwriting it.",
            next_step="fix or remove the file, then run this again",
        ) from exc


def _cut_table(text: str, key_path: list[str]) -> str:
    """`text` without the table at `key_path` (e.g. `[mcp_servers.<name>]`) and its sub-tables."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        path = _header_path(line)
        if path is not None:
            skipping = path[: len(key_path)] == key_path
        if not skipping:
            kept.append(line)
    return "".join(kept)


def _dig(data: dict[str, Any], key_path: list[str]) -> Any:
    node: Any = data
    for key in key_path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _require_tables(path: Path, data: dict[str, Any], key_path: list[str]) -> None:
    """Refuse a file where a key on the way to a table holds a plain value (`mcp_servers =
    "x"`): a table cannot be written under it."""
    node: Any = data
    for i, key in enumerate(key_path):
        node = node.get(key) if isinstance(node, dict) else None
        if node is not None and not isinstance(node, dict):
            where = _header(key_path[: i + 1])
            raise UsageError(
                f"{path}: {where} is not a table, so no entry can be written under it.",
                next_step=f"remove or rename {where} in the file by hand and run this again",
            )


def _header(key_path: list[str]) -> str:
    return ".".join(toml_key(k) for k in key_path)


def render_toml_table(key_path: list[str], values: dict[str, Any]) -> str:
    """`[a.b]` with its plain values, then one sub-table per dict value (`[a.b.env]`)."""
    head = _header(key_path)
    lines = [f"[{head}]"]
    lines += [
        f"{toml_key(k)} = {toml_value(v)}" for k, v in values.items() if not isinstance(v, dict)
    ]
    for k, v in values.items():
        if isinstance(v, dict):
            lines += ["", f"[{head}.{toml_key(k)}]"]
            lines += [f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in sorted(v.items())]
    return "\n".join(lines) + "\n"


def write_toml_table(
    path: Path, key_path: list[str], values: dict[str, Any], root: Path | None = None
) -> Path:
    """Replace the table at `key_path` in the TOML file `path` with `values`; every other table,
    key and comment is kept byte for byte. Refuses a table written as an inline table or with
    dotted keys, and never writes a file that does not read back as `values`. A file inside a
    workspace (`root`) is written through workspace_files."""
    text, data = _load_toml(path, root)
    _require_tables(path, data, key_path[:-1])
    rest = _cut_table(text, key_path)
    where = _header(key_path)
    if _dig(tomllib.loads(rest), key_path) is not None:
        raise UsageError(
            f"{path}: {where} is defined in a form this tool does not edit "
            "(inline table or dotted keys).",
            next_step=f"rewrite it as a [{where}] table or remove it by hand",
        )
    new = rest.rstrip("\n") + ("\n\n" if rest.strip() else "") + render_toml_table(key_path, values)
    if _dig(tomllib.loads(new), key_path) != values:
        raise UsageError(
            f"{path}: the merged file does not read back as the new {where}.",
            next_step=f"remove {where} from the file by hand and run this again",
        )
    if root is not None:
        wf.write_text(root, path.relative_to(root).as_posix(), new)
    else:
        atomic_write_text(path, new)
    return path


def read_toml_table(
    path: Path, key_path: list[str], root: Path | None = None
) -> dict[str, Any] | None:
    """The table at `key_path` in the TOML file `path` (None when absent)."""
    _, data = _load_toml(path, root)
    node = _dig(data, key_path)
    return node if isinstance(node, dict) else None


def write_codex_toml(root: Path, entry: ServerEntry, *, owned: OwnedConfig | None = None) -> Path:
    """Merge `entry` into `<root>/.codex/config.toml` (other tables and comments are kept)."""
    path = root / CODEX_TOML
    table = codex_entry(entry.checked())
    write_toml_table(path, ["mcp_servers", entry.name], table, root=root)
    if owned is not None:
        owned.server("codex", entry.name, table)
    return path


def remove_codex_toml(root: Path, name: str, *, owned: OwnedConfig | None = None) -> bool:
    if owned is not None:
        owned.server("codex", name, None)
    path = root / CODEX_TOML
    text, data = _load_toml(path, root)
    servers = data.get("mcp_servers")
    if not isinstance(servers, dict) or name not in servers:
        return False
    rest = _cut_table(text, ["mcp_servers", name])
    if name in tomllib.loads(rest).get("mcp_servers", {}):
        raise UsageError(
            f"{path}: mcp_servers.{name} is defined in a form this tool does not edit "
            "(inline table or dotted keys).",
            next_step=f"rewrite it as a [mcp_servers.{name}] table or remove it by hand",
        )
    wf.write_text(root, CODEX_TOML, rest)
    return True


# -- both clients -------------------------------------------------------------------------------


def project_server(
    root: Path, entry: ServerEntry, clients: tuple[Client, ...], *, owned: OwnedConfig | None = None
) -> list[Path]:
    """Write the entry into every named client's config under `root`; returns the files."""
    writers = {"claude": write_mcp_json, "codex": write_codex_toml}
    return [writers[c](root, entry, owned=owned) for c in clients]


def unproject_server(root: Path, name: str, *, owned: OwnedConfig | None = None) -> list[str]:
    """Remove a server from both clients' configs; returns the clients it was removed from."""
    check_name(name, "server name")
    removed = []
    if remove_mcp_json(root, name, owned=owned):
        removed.append("claude")
    if remove_codex_toml(root, name, owned=owned):
        removed.append("codex")
    return removed


# -- skills -----------------------------------------------------------------------------------


def skill_digest(root: Path, rel: str) -> str:
    """The content hash of the skill folder `rel` under `root` (read without symlinks)."""
    return tree_digest([(p[len(rel) + 1 :], data) for p, data in wf.walk_files(root, rel)])


def project_skill(
    root: Path, skill_dir: Path, name: str | None = None, *, owned: OwnedConfig | None = None
) -> list[Path]:
    """Copy a skill folder (SKILL.md + files) to `.claude/skills/<name>/` and
    `.agents/skills/<name>/` under `root`, replacing an older copy atomically (rename)."""
    name = check_name(name or skill_dir.name, "skill name")
    if not (skill_dir / "SKILL.md").is_file():
        raise UsageError(
            f"{skill_dir} has no SKILL.md.", next_step="a skill folder needs SKILL.md at its top"
        )
    out = []
    for rel in SKILL_ROOTS:
        parent = wf.real_dir(root, rel)  # a symlinked .claude/skills is refused, not followed
        tmp = parent / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        shutil.copytree(
            skill_dir, tmp, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), symlinks=False
        )
        dest = parent / name
        old = parent / f".{name}.{uuid.uuid4().hex[:8]}.old"
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
        out.append(dest)
        if owned is not None:
            owned.skill(f"{rel}/{name}", skill_digest(root, f"{rel}/{name}"))
    return out


def remove_skill(root: Path, name: str, *, owned: OwnedConfig | None = None) -> list[Path]:
    check_name(name, "skill name")
    removed = []
    for rel in SKILL_ROOTS:
        if owned is not None:
            owned.skill(f"{rel}/{name}", None)
        dest = root / rel / name
        if dest.is_symlink():
            dest.unlink()
            removed.append(dest)
        elif dest.is_dir():
            shutil.rmtree(dest)
            removed.append(dest)
    return removed


__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_TOOL_TIMEOUT_S",
    "ServerEntry",
    "claude_entry",
    "codex_entry",
    "project_server",
    "project_skill",
    "read_toml_table",
    "remove_codex_toml",
    "remove_mcp_json",
    "remove_skill",
    "render_codex_toml",
    "render_mcp_json",
    "render_toml_table",
    "skill_digest",
    "toml_key",
    "toml_string",
    "toml_value",
    "unproject_server",
    "write_codex_toml",
    "write_mcp_json",
    "write_toml_table",
]
