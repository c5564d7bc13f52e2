"""The individual qualification checks (tools/meta/qualification.py runs them and writes the report).

Each check returns a `Check` with evidence a model can act on: the file and line, the tool's
error text with the server's stderr tail, the stdout lines that were not protocol.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from ..errors import UsageError
from ..progress import Progress, report
from ..settings import Settings
from ..state import STATE, open_workspace
from ..task import kind_of
from .genserver import SKILL_DESCRIPTION_MAX, Manifest, check_server_py

ACCEPTED = frozenset({"passed", "pass", "accepted", "ok", "success"})


class Check(BaseModel):
    name: str
    passed: bool
    evidence: str = ""
    next_step: str = ""
    duration_s: float = 0.0


class Board:
    """Collects checks in order and reports progress as each one lands."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.checks: list[Check] = []
        self.total = 10
        self.done = 0

    async def _report(self, check: Check) -> None:
        self.done += 1
        status = "ok" if check.passed else "FAILED"
        await report(
            self.progress, self.done, max(self.total, self.done), f"{check.name}: {status}"
        )

    async def add(self, check: Check) -> None:
        self.checks.append(check)
        await self._report(check)

    def lane(self, sink: list[Check]) -> Lane:
        return Lane(self, sink)


class Lane:
    def __init__(self, board: Board, sink: list[Check]) -> None:
        self.board, self.sink = board, sink

    async def add(self, check: Check) -> None:
        self.sink.append(check)
        await self.board._report(check)


class Cheat(BaseModel):
    name: str
    description: str
    files: dict[str, str] = Field(description="relative path in the workspace -> content")


# What a server under qualification inherits from the operator's environment: enough to find
# Python, CUDA and the locale. Never provider API keys, tokens or the SSH agent socket: the
# server's custom tools are the agent's code.
ENV_ALLOW = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
)
# Every process of one qualification carries this variable with the qualification's token, so
# that what escaped its process group (setsid) is found in /proc and killed afterwards.
RUN_MARK = "HARNESSLAB_QUALIFY_RUN"


def child_env(
    settings: Settings,
    *,
    base: Path,
    token: str,
    state_dir: Path,
    served_at: Path | None = None,
) -> dict[str, str]:
    """The variables a child of qualification gets on top of ENV_ALLOW: the settings it needs
    (HARNESSLAB_*) with a private `state_dir` under `base` (not the operator's trusted store
    and secrets), a private TMPDIR, the run mark, and unbuffered output so that stdout noise
    shows up when it is printed, not at exit. `served_at` (the session's server): its custom
    tools see the clean room at that path, and their sandbox's scratch folder where a served
    one's is (this user's TMPDIR, not a private one whose path would tell them apart)."""
    (base / "tmp").mkdir(parents=True, exist_ok=True)
    env = {
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(base / "tmp") if served_at is None else tempfile.gettempdir(),
        RUN_MARK: token,
    }
    update: dict[str, Any] = {"state_dir": state_dir}
    if served_at is not None:
        update["custom_tools_workspace"] = served_at
    env.update(settings.model_copy(update=update).to_env())
    return env


def remaining(deadline: float) -> float:
    return max(deadline - anyio.current_time(), 0.5)


def toolkit_server_check(server_dir: Path, name: str) -> Check:
    """A generated server's server.py is the toolkit's own rendering: the server process runs
    toolkit code only (the agent's code runs in the custom tools' sandbox)."""
    try:
        check_server_py(server_dir, name)
    except UsageError as exc:
        return Check(
            name="toolkit_server", passed=False, evidence=exc.message, next_step=exc.next_step
        )
    return Check(
        name="toolkit_server",
        passed=True,
        evidence="server.py is the toolkit's own; the custom tools run in its sandboxed worker",
    )


def sandbox_check(levels: dict[str, str], *, allowed_none: bool) -> Check:
    """Where the agent's code ran in each lane, as each sandbox reported it itself."""
    summary = "; ".join(f"{lane}: {level.split(' (')[0]}" for lane, level in levels.items())
    evidence = summary + "\n" + "\n".join(f"{lane}: {level}" for lane, level in levels.items())
    bad = [lane for lane, level in levels.items() if level == "none"]
    if bad and not allowed_none:
        return Check(
            name="sandbox",
            passed=False,
            evidence=f"no sandbox in {', '.join(bad)}: {evidence}",
            next_step="qualify on Linux with Landlock (HARNESSLAB_ALLOW_UNSANDBOXED=1 runs it "
            "anyway, knowingly)",
        )
    return Check(name="sandbox", passed=True, evidence=f"sandbox: {evidence}")


def expected_checks(manifest: Manifest) -> list[str]:
    tools = manifest.enabled_tools()
    return [
        "startup",
        "tools_list",
        *(f"tool:{t.name}" for t in tools),
        *(f"verifier:{t.name}" for t in tools if t.verifier),
        "stdout_protocol_only",
        *(["served_rerun"] if any(t.kind == "custom" for t in tools) else []),
        "self_test",
        "own_tests",
    ]


# -- static checks --------------------------------------------------------------------------------


def syntax_check(files: list[tuple[str, Path]]) -> Check:
    bad = []
    for rel, path in files:
        if path.suffix != ".py":
            continue
        try:
            compile(path.read_bytes(), rel, "exec", dont_inherit=True)
        except SyntaxError as exc:
            line = (exc.text or "").rstrip()
            bad.append(f"{rel} line {exc.lineno}: {exc.msg}" + (f"\n    {line}" if line else ""))
        except ValueError as exc:  # null bytes
            bad.append(f"{rel}: {exc}")
    n = sum(1 for _, p in files if p.suffix == ".py")
    if bad:
        return Check(
            name="syntax",
            passed=False,
            evidence="SyntaxError in " + "\n".join(bad),
            next_step="fix the file(s) named above (check with `python -m py_compile FILE`)",
        )
    return Check(name="syntax", passed=True, evidence=f"{n} Python files compile")


def path_check(files: list[tuple[str, Path]], dirty_roots: list[Path]) -> Check:
    """No absolute path into the dirty workspace: it would not exist for another session."""
    forms = {str(r) for r in dirty_roots} | {str(r.resolve()) for r in dirty_roots}
    patterns = [
        re.compile(re.escape(f).encode() + rb"(?![\w.-])") for f in sorted(forms) if f != "/"
    ]
    hits = []
    for rel, path in files:
        data = path.read_bytes()
        for pat in patterns:
            for m in pat.finditer(data):
                lineno = data.count(b"\n", 0, m.start()) + 1
                start = data.rfind(b"\n", 0, m.start()) + 1
                end = data.find(b"\n", m.start())
                snippet = data[start : end if end >= 0 else None].decode(errors="replace").strip()
                hits.append(f"{rel}:{lineno}: {snippet[:200]}")
    if hits:
        return Check(
            name="portable_paths",
            passed=False,
            evidence=f"{hits[0]} (an absolute path into the dirty workspace "
            f"{', '.join(sorted(forms))})\n" + "\n".join(hits[1:20]),
            next_step="use paths relative to the workspace root (the server runs with cwd = "
            "workspace root) or the injected `workspace` parameter of a custom tool",
        )
    return Check(name="portable_paths", passed=True, evidence=f"{len(files)} files scanned")


def _front_matter(text: str) -> dict[str, str] | None:
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---", 4)
    if end < 0:
        return None
    out: dict[str, str] = {}
    for line in text[4:end].splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith((" ", "\t")):
            value = value.strip()
            if value.startswith('"'):
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            out[key.strip()] = str(value).strip("'")
    return out


def skill_check(bundle: dict[str, Path], manifest: Manifest) -> Check:
    skills = {rel: p for rel, p in bundle.items() if rel.startswith(f"{STATE}/skills/")}
    if not skills:
        if manifest.generator.startswith("harnesslab"):
            return Check(
                name="skill",
                passed=False,
                evidence=f"no {STATE}/skills/{manifest.name}/SKILL.md next to the generated server",
                next_step="run generate_server again (it writes the skill)",
            )
        return Check(name="skill", passed=True, evidence="no skill (optional for brought servers)")
    problems = []
    for rel, folder in skills.items():
        md = folder / "SKILL.md"
        if not md.is_file():
            problems.append(f"{rel}/SKILL.md is missing")
            continue
        meta = _front_matter(md.read_text(errors="replace"))
        if meta is None:
            problems.append(f"{rel}/SKILL.md has no front matter (--- name/description ---)")
            continue
        if meta.get("name") != folder.name:
            problems.append(f"{rel}/SKILL.md: name {meta.get('name')!r} != folder {folder.name!r}")
        desc = meta.get("description", "")
        if not desc or len(desc) > SKILL_DESCRIPTION_MAX + 1:
            problems.append(f"{rel}/SKILL.md: description must be 1-1024 characters ({len(desc)})")
    if problems:
        return Check(
            name="skill",
            passed=False,
            evidence="\n".join(problems),
            next_step="fix the front matter: `name` equal to the folder name, a `description` "
            "that says when to use it, under 1024 characters",
        )
    return Check(name="skill", passed=True, evidence=", ".join(f"{r}/SKILL.md" for r in skills))


# -- cheats and verdicts ---------------------------------------------------------------------------

CLONE_CHEAT = '''"""Cheat: returns its first input unchanged instead of computing anything."""


def {fn}(x, *args, **kwargs):
    return x.clone()
'''


def default_cheats_dir() -> Path | None:
    try:
        path = Path(str(resources.files("harnesslab.tools.integrity"))) / "cheats" / "cpu"
    except ModuleNotFoundError:
        return None
    return path if path.is_dir() else None


def cheats_for(
    room: Path, settings: Settings, cheats_dir: Path | None, max_corpus: int
) -> list[Cheat]:
    """x.clone() plus up to `max_corpus` kernels of the integrity corpus for this task, one per
    exploit class (`expect:` in its docstring) in name order. Wrong-output cheats are left to
    the clone: each costs a full run, while most exploit classes are caught by the verifier's
    static scan in well under a second, so the corpus adds breadth, not minutes."""
    try:
        task = open_workspace(room, settings).task
    except Exception:  # a plain folder: no kernel entry, no cheats apply
        return []
    if not kind_of(task).tries_cheats(task):
        return []
    out = [
        Cheat(
            name="clone",
            description="returns x.clone(): no computation at all",
            files={task.entry_file: CLONE_CHEAT.format(fn=task.entry_function)},
        )
    ]
    corpus = cheats_dir or default_cheats_dir()
    if corpus is None or max_corpus <= 0:
        return out
    if (corpus / task.name).is_dir():
        corpus = corpus / task.name
    by_class: dict[str, Cheat] = {}
    for path in sorted(corpus.iterdir()):
        if path.name.startswith(("_", ".")):
            continue
        if path.suffix == ".py":
            files = {task.entry_file: path.read_text(errors="replace")}
        elif path.is_dir() and (path / task.entry_file).is_file():
            files = {
                p.relative_to(path).as_posix(): p.read_text(errors="replace")
                for p in sorted(path.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts
            }
        else:
            continue
        text = files[task.entry_file]
        m = re.search(r"^expect:\s*(\S+)", text, re.MULTILINE)
        kind = m.group(1) if m else path.stem
        if kind != "wrong_output" and kind not in by_class:
            by_class[kind] = Cheat(
                name=path.stem, description=f"{kind}: {_doc_line(text)}", files=files
            )
    return out + [by_class[k] for k in sorted(by_class)][:max_corpus]


def _doc_line(text: str) -> str:
    m = re.search(r'"""\s*(.+)', text)
    return m.group(1).strip()[:160] if m else "integrity corpus kernel"


def verdict_of(reply: dict[str, Any] | None) -> bool | None:
    """True when a verifier result accepts the candidate, False when it rejects it, None when
    it cannot be told (no answer, or no verdict in the result)."""
    if reply is None or reply.get("timed_out"):
        return None
    if reply.get("is_error"):
        return False
    candidates: list[Any] = [reply.get("structured")]
    try:
        candidates.append(json.loads(reply.get("text") or ""))
    except json.JSONDecodeError:
        pass
    for data in candidates:
        if isinstance(data, dict) and set(data) == {"result"}:
            data = data["result"]
        if not isinstance(data, dict):
            continue
        for key in ("verdict", "status"):
            if isinstance(data.get(key), str):
                return data[key].lower() in ACCEPTED
        for key in ("accepted", "passed", "ok"):
            if isinstance(data.get(key), bool):
                return bool(data[key])
    return None


def shell(argv: list[str]) -> str:
    return shlex.join(argv)


__all__ = [
    "ACCEPTED",
    "ENV_ALLOW",
    "RUN_MARK",
    "Board",
    "Cheat",
    "Check",
    "Lane",
    "cheats_for",
    "child_env",
    "expected_checks",
    "path_check",
    "remaining",
    "sandbox_check",
    "shell",
    "skill_check",
    "syntax_check",
    "toolkit_server_check",
    "verdict_of",
]
