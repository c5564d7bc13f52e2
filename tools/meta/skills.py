"""Shipped agent skills (`skills/<name>/SKILL.md` + stage files) in the Agent Skills format:
find them, parse and check their front matter, and project them into a workspace where Claude
Code (`.claude/skills/<name>/`) and Codex (`.agents/skills/<name>/`) look for them.

The front matter is read by a small parser for the subset of YAML that skills use (`key: value`
lines, quoted values, `>`/`|` block scalars, one level of nested mapping such as `metadata:`),
so the toolkit needs no YAML library. It also flags plain values that a real YAML parser — the
one the clients use — would reject or read differently (a `: ` or ` #` inside, a leading `[`).
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..state import workspace_files as wf
from ..state.owned_config import OwnedConfig
from ..state.projection import project_skill
from ..state.workspace import STATE

SKILL_FILE = "SKILL.md"
# Agent Skills specification: name 1-64 chars of a-z, 0-9 and single hyphens, equal to the
# folder name; description non-empty and under 1024 characters; compatibility at most 500.
SKILL_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_NAME = 64
MAX_DESCRIPTION = 1023
MAX_COMPATIBILITY = 500

_KEY_RE = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_-]*):(?:\s+(.*))?$")
_BLOCK_RE = re.compile(r"^[|>][+-]?$")
# Plain (unquoted) YAML scalars may not start with these indicators.
_YAML_INDICATORS = tuple("[]{}&*!|>'\"%@`#,")


def skills_root() -> Path:
    """The installed `skills/` package folder."""
    return Path(str(resources.files("harnesslab.skills")))


def list_skills() -> list[str]:
    """Names of the shipped skills (folders holding a SKILL.md), sorted."""
    root = skills_root()
    return sorted(p.name for p in root.iterdir() if (p / SKILL_FILE).is_file())


def skill_dir(name: str) -> Path:
    """The folder of the shipped skill `name`."""
    if not SKILL_NAME_RE.match(name) or not (skills_root() / name / SKILL_FILE).is_file():
        raise UsageError(
            f"unknown skill {name!r}.", next_step=f"use one of: {', '.join(list_skills())}"
        )
    return skills_root() / name


def _skill_file(path: Path) -> Path:
    path = Path(path)
    return path / SKILL_FILE if path.is_dir() else path


def split_front_matter(text: str, *, source: str = "SKILL.md") -> tuple[dict[str, Any], str]:
    """(front matter, body) of a Markdown file that starts with a `---` fenced YAML block."""
    meta, body, _ = _split(text, source)
    return meta, body


def _split(text: str, source: str) -> tuple[dict[str, Any], str, list[str]]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise UsageError(
            f"{source}: no front matter.",
            next_step="start the file with '---', then 'name: ...' and 'description: ...', then '---'",
        )
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise UsageError(
            f"{source}: the front matter is not closed.",
            next_step="end the front matter with a line holding only '---'",
        ) from None
    hazards: list[str] = []
    meta = _parse_block(lines[1:end], source=source, first_line=2, hazards=hazards)
    return meta, "\n".join(lines[end + 1 :]).lstrip("\n"), hazards


def _parse_block(
    lines: list[str], *, source: str, first_line: int, hazards: list[str]
) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    i = 0
    while i < len(lines):
        raw = lines[i]
        lineno = first_line + i
        i += 1
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if raw[0] in " \t":
            raise UsageError(
                f"{source}:{lineno}: unexpected indentation.",
                next_step="front matter lines are 'key: value'; indent only continuation lines",
            )
        m = _KEY_RE.match(raw.rstrip())
        if not m:
            raise UsageError(
                f"{source}:{lineno}: expected 'key: value', got {raw.strip()[:60]!r}.",
                next_step="write one 'key: value' per line (quote values that contain ': ')",
            )
        key, value = m.group(1), (m.group(2) or "").strip()
        if key in meta:
            raise UsageError(f"{source}:{lineno}: duplicate key {key!r}.", next_step="keep one")
        # Indented lines after the key belong to it.
        cont: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i][0] in " \t"):
            cont.append(lines[i])
            i += 1
        while cont and not cont[-1].strip():
            cont.pop()
        if _BLOCK_RE.match(value):
            body = [c.strip() for c in cont]
            meta[key] = ("\n" if value[0] == "|" else " ").join(body).strip()
        elif not value and cont:
            meta[key] = _parse_block(
                [c.strip() for c in cont], source=source, first_line=lineno + 1, hazards=hazards
            )
        else:
            text = " ".join([value, *(c.strip() for c in cont)]).strip()
            meta[key] = _scalar(text, source)
            if text[:1] not in ("'", '"'):
                hazards.extend(f"{source}:{lineno}: {key}: {h}" for h in _plain_hazards(text))
    return meta


def _plain_hazards(value: str) -> list[str]:
    """Why a real YAML parser (the one the clients use) would reject or cut a plain value."""
    if ": " in value or value.endswith(":"):
        return ["a plain YAML value may not contain ': '; quote it or reword it"]
    if " #" in value:
        return ["' #' starts a YAML comment and cuts the value; quote it or reword it"]
    if value.startswith(_YAML_INDICATORS) or value.startswith(("- ", "? ")):
        return [f"a plain YAML value may not start with {value[0]!r}; quote it"]
    return []


def _scalar(value: str, source: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return str(json.loads(value))
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{source}: bad double-quoted value {value[:40]!r}.", next_step="fix the escapes"
            ) from exc
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    return value


def parse_skill(path: Path) -> dict[str, Any]:
    """The front matter of a skill (its folder or its SKILL.md) as a dict."""
    file = _skill_file(path)
    if not file.is_file():
        raise UsageError(f"{file} does not exist.", next_step="a skill folder needs a SKILL.md")
    meta, _ = split_front_matter(file.read_text(encoding="utf-8"), source=str(file))
    return meta


def skill_body(path: Path) -> str:
    """The Markdown body of a skill's SKILL.md (after the front matter)."""
    file = _skill_file(path)
    return split_front_matter(file.read_text(encoding="utf-8"), source=str(file))[1]


def skill_problems(path: Path) -> list[str]:
    """Everything wrong with a skill folder, as sentences; empty when it is valid."""
    folder = Path(path)
    folder = folder.parent if folder.name == SKILL_FILE else folder
    file = folder / SKILL_FILE
    if not file.is_file():
        return [f"{folder}: no {SKILL_FILE}"]
    text = file.read_text(encoding="utf-8")
    try:
        meta, body, hazards = _split(text, str(file))
    except UsageError as exc:
        return [str(exc)]
    problems: list[str] = []
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append("name: missing")
    else:
        if len(name) > MAX_NAME or not SKILL_NAME_RE.match(name):
            problems.append(
                f"name: {name!r} must be 1-{MAX_NAME} characters of a-z, 0-9 and single hyphens"
            )
        if name != folder.name:
            problems.append(f"name: {name!r} must equal the folder name {folder.name!r}")
    desc = meta.get("description")
    if not isinstance(desc, str) or not desc.strip():
        problems.append("description: missing (say what the skill does and when to use it)")
    elif len(desc) > MAX_DESCRIPTION:
        problems.append(f"description: {len(desc)} characters, must be under 1024")
    compat = meta.get("compatibility")
    if isinstance(compat, str) and len(compat) > MAX_COMPATIBILITY:
        problems.append(f"compatibility: {len(compat)} characters, at most {MAX_COMPATIBILITY}")
    if not body.strip():
        problems.append("body: empty (the instructions go after the front matter)")
    problems.extend(hazards)
    return problems


def validate_skill(path: Path) -> dict[str, Any]:
    """Check a skill folder against the Agent Skills rules; return its front matter."""
    problems = skill_problems(path)
    if problems:
        raise UsageError(
            f"skill {Path(path)} is not valid: {'; '.join(problems)}.",
            next_step="fix the front matter of its SKILL.md",
        )
    return parse_skill(path)


def skill_task(path: Path) -> str | None:
    """The task a task-specific skill belongs to (front matter `metadata: task: NAME`), or None
    for a general skill."""
    meta = parse_skill(path).get("metadata")
    return meta.get("task") if isinstance(meta, dict) else None


def skills_for_task(task: str | None) -> list[str]:
    """Shipped skills for a workspace of `task`: every general skill plus the task's own.
    With no task known, every shipped skill."""
    out = []
    for name in list_skills():
        owner = skill_task(skills_root() / name)
        if owner is None or task is None or owner == task:
            out.append(name)
    return out


def _workspace_task(ws_root: Path) -> str | None:
    """The task named by the workspace's task view (it only picks which shipped skills to
    copy, so a view, read as untrusted input, is enough)."""
    try:
        task = wf.read_json(Path(ws_root), f"{STATE}/task.json").get("task")
    except (UsageError, AttributeError):
        return None
    return task if isinstance(task, str) else None


def project_skills(
    ws_root: Path, names: list[str] | None = None, *, owned: OwnedConfig | None = None
) -> list[str]:
    """Copy shipped skills into the workspace's `.claude/skills/<name>/` (Claude Code) and
    `.agents/skills/<name>/` (Codex), replacing earlier copies. By default: the general skills
    plus those of the workspace's task (from `.harnesslab/task.json`). Returns the names.
    `owned`: the trusted record of what the toolkit wrote (tools/state/owned_config.py)."""
    chosen = skills_for_task(_workspace_task(ws_root)) if names is None else list(names)
    for name in chosen:
        folder = skill_dir(name)
        validate_skill(folder)
        project_skill(Path(ws_root), folder, owned=owned)
    return chosen


__all__ = [
    "list_skills",
    "parse_skill",
    "project_skills",
    "skill_body",
    "skill_dir",
    "skill_problems",
    "skill_task",
    "skills_for_task",
    "skills_root",
    "split_front_matter",
    "validate_skill",
]
