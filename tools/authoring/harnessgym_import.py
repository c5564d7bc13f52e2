"""`harnesslab import harnessgym PATH`: a HarnessGym task folder (task.md, a benchmark and a
verifier printing JSON with a score key, the kernel, its config) as a harnesslab task folder.

- A command task by default: the agent's dev objective is the benchmark's dev mode, the final
  objective (the loop's and guarded_final_verify's) the verifier's final mode, both found in
  task.md (`python3 benchmark.py --json --mode dev`, `... verifier.py --json --mode final`) or
  by file name, with `python3` as {python}. Score key and direction come from task.md ("lowest
  `best_us`", "higher is better") unless given.
- A kernel task when an editable file defines a shipped kernel task's entry function with its
  parameters (rmsnorm_gate(x, gate, weight, eps)): the shipped task's reference and hidden
  domain, the user's kernel as the workspace.
- task.md is rewritten: the remote wrapper goes (harnesslab runs objectives on the GPU host
  itself: --gpu-host), HARNESSGYM_* variables become their HARNESSLAB_* counterparts,
  .harnessgym/ becomes .harnesslab/. What has no counterpart is listed, with what to do.
The source folder is read as untrusted input (tools/state/workspace_files.py) and never changed.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..state import workspace_files as wf
from ..task import TaskSpec, kind_of, list_tasks, load_task
from ..task.spec import NAME_RE, parse_task

SKIP = frozenset({".harnessgym", ".git", "__pycache__", ".pytest_cache", ".venv", "node_modules"})
# HarnessGym's variables and what stands for them here (None: nothing; the note says why).
ENV_MAP: dict[str, str | None] = {
    "HARNESSGYM_GPU_HOST": "HARNESSLAB_GPU_HOST",
    "HARNESSGYM_GPU_KEY": "HARNESSLAB_SSH_KEY",
    "HARNESSGYM_GPU_PORT": "HARNESSLAB_SSH_PORT",
    "HARNESSGYM_GPU_REMOTE_ROOT": "HARNESSLAB_REMOTE_ROOT",
    "HARNESSGYM_GPU_WORKSPACE": None,
}
REMOTE_WRAPPER = re.compile(
    r"python3?\s+(?:\./)?(?P<file>[\w.-]*remote[\w.-]*\.py)(?:\s+--?[\w-]+(?:[ =]\S+)?)*\s+--\s+"
)
COMMAND = re.compile(
    r"(?P<cmd>python3?\s+(?:\./)?(?P<file>[\w.-]+\.py)\b[^`\n]*?--mode[ =](?P<mode>dev|final)\b[^`\n]*)"
)
DIRECTION = re.compile(r"\b(higher|larger|bigger)\s+is\s+better\b", re.IGNORECASE)
KEY_HINTS = (
    re.compile(r"(?:lowest|highest|minimi[sz]e|maximi[sz]e|smallest|largest)\s+`(\w+)`", re.I),
    re.compile(r"score\s+key:?\s+`?(\w+)`?", re.I),
    re.compile(r"`(\w+)`\s+(?:score|metric)", re.I),
)
UNITS = (("_us", "us"), ("_ms", "ms"), ("_ns", "ns"), ("cycles", "cycles"), ("_s", "s"))


class Skipped(BaseModel):
    what: str
    why: str
    next_step: str = ""


class ImportReport(BaseModel):
    source: str
    task_folder: str
    name: str
    kind: Literal["command", "kernel"]
    editable: list[str]
    objectives: dict[str, str] = Field(default_factory=dict)
    score_key: str = ""
    unit: str = ""
    higher_is_better: bool = False
    rewritten: list[str] = Field(default_factory=list, description="task.md changes")
    not_converted: list[Skipped] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def _files(src: Path) -> dict[str, bytes]:
    items = wf.walk_files(src.parent, src.name, skip=SKIP, max_files=2000, max_bytes=64 << 20)
    return {path[len(src.name) + 1 :]: data for path, data in items}


def task_name(src: Path, given: str | None) -> str:
    name = given or re.sub(r"[^a-z0-9_-]+", "-", src.name.lower()).strip("-_") or "imported"
    if not NAME_RE.match(name):
        raise UsageError(f"{name!r} is not a task name.", next_step="pass --name lowercase_name")
    return name


def find_commands(brief: str, files: dict[str, bytes]) -> dict[str, str]:
    """mode -> the command as HarnessGym's task.md gives it (remote wrapper removed), else the
    benchmark's and the verifier's by file name."""
    found: dict[str, str] = {}
    plain = REMOTE_WRAPPER.sub("", brief)
    for m in COMMAND.finditer(plain):
        mode, cmd = m.group("mode"), m.group("cmd").strip().rstrip("`").strip()
        if m.group("file") not in files:
            continue
        # The benchmark for dev, the verifier for final, when task.md names both.
        prefer = "bench" if mode == "dev" else "verif"
        if mode not in found or (prefer in m.group("file") and prefer not in found[mode]):
            found[mode] = cmd
    for mode, names in (
        ("dev", ("benchmark.py", "verifier.py")),
        ("final", ("verifier.py", "benchmark.py")),
    ):
        if mode not in found:
            name = next((n for n in names if n in files), None)
            if name:
                found[mode] = f"python3 {name} --json --mode {mode}"
    return {mode: re.sub(r"^python3?\b", "{python}", cmd) for mode, cmd in found.items()}


def find_key(brief: str) -> str:
    for pattern in KEY_HINTS:
        m = pattern.search(brief)
        if m:
            return m.group(1)
    return ""


def unit_of(key: str) -> str:
    return next((unit for suffix, unit in UNITS if key.endswith(suffix)), "")


def find_editable(brief: str, files: dict[str, bytes]) -> list[str]:
    """The files task.md's "You may edit" list names, else kernel*.py and *config*.json."""
    section = re.search(r"may edit:?\s*\n(?P<body>(?:\s*[-*].*\n?)+)", brief, re.IGNORECASE)
    named = []
    if section:
        named = [
            n
            for n in re.findall(r"`([^`]+)`", section.group("body"))
            if n in files and "/" not in n
        ]
    if named:
        return named
    return sorted(
        n
        for n in files
        if "/" not in n
        and (
            (n.startswith("kernel") and n.endswith(".py"))
            or (n.endswith(".json") and "config" in n)
        )
    )


class Contract(NamedTuple):
    """A shipped kernel task's contract an imported kernel takes: `function` in `file` (an
    editable file) has the task's entry parameters; a name other than the task's entry function
    gets a shim (`shim_source`)."""

    task: TaskSpec
    file: str
    function: str


# (shipped kernel task, its baseline entry's parameters), the most parameters first.
Contracts = list[tuple[TaskSpec, list[str]]]


def kernel_contract(
    contracts: Contracts, files: dict[str, bytes], editable: list[str], entry: str | None = None
) -> Contract | None:
    """The shipped kernel task (of `contracts`: shipped_contracts()) whose entry function an
    editable file defines with the same leading parameters as the shipped baseline's (or, with
    `entry` 'file.py:function', whose parameters that function has under any name), or None."""
    for task, want in contracts:
        for rel, function in _entries(editable, entry, task.entry_function):
            if rel.endswith(".py") and rel in files:
                got = _params(files[rel].decode("utf-8", "replace"), function)
                if got and got[: len(want)] == want:
                    return Contract(task, rel, function)
    return None


def shipped_contracts() -> Contracts:
    """(shipped kernel task, its baseline entry's parameters) for every task with a contract,
    the most parameters first: a kernel taking (x, gate, weight, eps) is rmsnorm_gate's, not
    softmax's (x). It loads every shipped task: an import takes it once."""
    out = []
    for name in list_tasks():
        task = load_task(name)
        if (contract := kind_of(task).contract_baseline(task)) is None:
            continue
        baseline, function = contract
        if want := _params(baseline.read_text(), function):
            out.append((task, want))
    return sorted(out, key=lambda tw: -len(tw[1]))


def _entries(editable: list[str], entry: str | None, function: str) -> list[tuple[str, str]]:
    if entry is None:
        return [(rel, function) for rel in editable]
    rel, _, named = entry.partition(":")
    return [(rel, named)] if rel in editable and named else []


def lookalikes(
    contracts: Contracts, files: dict[str, bytes], editable: list[str]
) -> dict[str, TaskSpec]:
    """'file.py:function' -> the shipped kernel task (of `contracts`) whose entry parameters
    that top-level function of an editable file has under another name (what `--entry` could
    name)."""
    found: dict[str, TaskSpec] = {}
    for task, want in contracts:  # the most parameters first: the closest contract wins
        for rel in editable:
            if not rel.endswith(".py") or rel not in files:
                continue
            for name, got in _signatures(files[rel].decode("utf-8", "replace")).items():
                if name != task.entry_function and got[: len(want)] == want:
                    found.setdefault(f"{rel}:{name}", task)
    return found


def shim_source(contract: Contract, entry: str) -> str:
    """The lines appended to the entry file: the task's entry function calling the user's."""
    fn = contract.task.entry_function
    return (
        f"\n\n# Added by `harnesslab import harnessgym --entry {entry}`:\n"
        f"# the task calls {fn}, which calls {contract.function}. Keep {fn}'s name.\n"
        f"def {fn}(*args, **kwargs):\n    return {contract.function}(*args, **kwargs)\n"
    )


def _signatures(source: str) -> dict[str, list[str]]:
    """name -> positional parameters of every top-level function ({} when it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {
        node.name: [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def _params(source: str, function: str) -> list[str] | None:
    return _signatures(source).get(function)


NO_WRAPPER = (
    "harnesslab runs the objectives on the GPU host itself (whoever starts harnesslab names it "
    "with `--gpu-host` or HARNESSLAB_GPU_HOST): no wrapper script is needed"
)


def rewrite_brief(text: str, report: ImportReport, dropped: list[str] | None = None) -> str:
    """task.md with HarnessGym's references turned into harnesslab's (each change listed); a
    line that still names a `dropped` file (the remote wrapper the import leaves out) says what
    harnesslab does instead."""

    def sub(pattern: str, repl: str | Callable[[re.Match[str]], str], what: str,
            flags: int = 0) -> None:  # fmt: skip
        nonlocal text
        new, n = re.subn(pattern, repl, text, flags=flags)
        if n:
            report.rewritten.append(f"{what} ({n}x)")
            text = new

    sub(REMOTE_WRAPPER.pattern, "", "remote wrapper removed from commands (harnesslab runs "
        "objectives on the GPU host itself: --gpu-host)")  # fmt: skip
    for old, new in ENV_MAP.items():
        if new:
            sub(rf"\b{old}\b", new, f"{old} -> {new}")
    sub(r"`?\.harnessgym/(?:\.\.\./)?(?:[\w./-]*/)?result\.json`?", "the result file the loop's "
        "prompt names", "result.json path -> the loop's result file")  # fmt: skip
    for name in dropped or []:
        bullet = r"^(?P<lead>[ \t]*(?:[-*]|\d+\.)?[ \t]*)"
        sub(bullet + rf"[^\n]*\b{re.escape(name)}\b[^\n]*?(?P<colon>:?)[ \t]*$",
            lambda m: m["lead"] + NO_WRAPPER + (". The commands themselves:" if m["colon"] else ""),
            f"{name} (not imported) -> harnesslab's GPU host", re.MULTILINE)  # fmt: skip
    sub(r"^[^\n]*\bthe remote wrapper\b[^\n]*?(?P<colon>:?)[ \t]*$",
        r"To reach the GPU host, whoever starts harnesslab sets\g<colon>",
        "remote wrapper settings -> harnesslab's", re.MULTILINE)  # fmt: skip
    sub(r"\.harnessgym\b", ".harnesslab", ".harnessgym -> .harnesslab")
    sub(r"\bHarnessGym\b", "harnesslab", "HarnessGym -> harnesslab")
    sub(r"^python3?\s+(?=\S+\.py)", "python ", "python3 -> python", re.MULTILINE)
    return text


def convert(
    src: Path,
    out: Path,
    *,
    name: str | None = None,
    score_key: str | None = None,
    higher_is_better: bool | None = None,
    dev_command: str | None = None,
    final_command: str | None = None,
    editable: list[str] | None = None,
    entry: str | None = None,
    force: bool = False,
) -> ImportReport:
    src = src.expanduser().resolve()
    if not src.is_dir() or not wf.is_file(src, "task.md"):
        raise UsageError(
            f"{src} is not a HarnessGym task folder (no task.md).",
            next_step="point at the folder holding task.md, verifier.py and the kernel",
        )
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} is not empty.", next_step="choose a new --out, or pass --force")
    files = _files(src)
    brief = files["task.md"].decode("utf-8", "replace")
    name = task_name(src, name)
    edit = editable or find_editable(brief, files)
    if not edit:
        raise UsageError(
            "no editable files found (task.md has no 'You may edit' list, no kernel*.py).",
            next_step="pass --editable kernel.py,kernel_config.json",
        )
    missing = [e for e in edit if e not in files]
    if missing:
        raise UsageError(f"editable files not in {src}: {', '.join(missing)}")
    contracts = shipped_contracts()  # every shipped task loaded once, for both questions
    contract = kernel_contract(contracts, files, edit, entry)
    if entry is not None and contract is None:
        raise UsageError(
            f"--entry {entry}: no function of an editable file by that name takes a shipped "
            "kernel task's parameters.",
            next_step="name one of "
            + (
                ", ".join(lookalikes(contracts, files, edit))
                or "(none found: leave --entry out for a command task)"
            ),
        )
    report = ImportReport(
        source=str(src),
        task_folder=str(out.resolve()),
        name=name,
        kind="kernel" if contract else "command",
        editable=edit,
    )
    skipped = report.not_converted
    wrappers = [
        rel
        for rel, data in files.items()
        if rel.endswith(".py") and b"HARNESSGYM_GPU_HOST" in data and rel not in edit
    ]
    for rel in wrappers:
        skipped.append(
            Skipped(
                what=rel,
                why="HarnessGym's remote wrapper (ssh + tar): harnesslab syncs and runs "
                "objectives on the GPU host itself",
                next_step="pass --gpu-host user@host (and --ssh-key) to harnesslab commands",
            )
        )
    _harnessgym_state(src, skipped)
    for var in sorted(set(re.findall(r"\bHARNESSGYM_\w+", brief))):
        if ENV_MAP.get(var) is None:
            skipped.append(Skipped(what=var, why="no harnesslab counterpart", next_step=""))
    out.mkdir(parents=True, exist_ok=True)
    if contract is not None:
        _write_kernel_task(contract, out, name, files, edit, report)
    else:
        report.notes += [
            f"{found} takes {task.name}'s parameters ({task.entry}): `--entry {found}` imports "
            f"a {task.name} kernel task (its reference, hidden cases and guarded verify)"
            for found, task in lookalikes(contracts, files, edit).items()
        ]
        _write_command_task(
            out, name, files, wrappers, brief, report,
            score_key=score_key, higher=higher_is_better, dev=dev_command, final=final_command,
        )  # fmt: skip
    return report


def _harnessgym_state(src: Path, skipped: list[Skipped]) -> None:
    base = ".harnessgym"
    for name in wf.list_dir(src, f"{base}/mcp"):
        skipped.append(
            Skipped(
                what=f"{base}/mcp/{name}",
                why="a HarnessGym MCP server (Content-Length framed stdio, its own manifest): "
                "MCP clients and harnesslab qualify cannot talk to it",
                next_step="port it to MCP stdio (the SDK's MCPServer) with a manifest.json and "
                "`harnesslab qualify` it, or let `harnesslab run` build a server",
            )
        )
    for name in wf.list_dir(src, f"{base}/skills"):
        skipped.append(
            Skipped(
                what=f"{base}/skills/{name}",
                why="generated skills belong to a workspace, not to a task",
                next_step="copy it into a workspace's .claude/skills/ and .agents/skills/",
            )
        )
    for rel in ("runs", "history", "tests", "registry.json", "activation.json"):
        if wf.is_dir(src, f"{base}/{rel}") or wf.is_file(src, f"{base}/{rel}"):
            skipped.append(
                Skipped(
                    what=f"{base}/{rel}",
                    why="HarnessGym run state (scores, checkpoints, registry) is not trusted "
                    "input: harnesslab scores and qualifies again",
                )
            )


def _write_command_task(
    out: Path,
    name: str,
    files: dict[str, bytes],
    wrappers: list[str],
    brief: str,
    report: ImportReport,
    *,
    score_key: str | None,
    higher: bool | None,
    dev: str | None,
    final: str | None,
) -> None:
    commands = find_commands(brief, files)
    if dev:
        commands["dev"] = dev
    if final:
        commands["final"] = final
    if set(commands) != {"dev", "final"}:
        raise UsageError(
            f"no {'/'.join(sorted({'dev', 'final'} - set(commands)))} objective found in task.md "
            "or as benchmark.py/verifier.py.",
            next_step="pass --dev-command and --final-command",
        )
    key = score_key or find_key(brief)
    if not key:
        key = "score"
        report.notes.append("no score key in task.md: using 'score' (pass --score-key)")
    direction = bool(DIRECTION.search(brief)) if higher is None else higher
    report.objectives, report.score_key = commands, key
    report.unit, report.higher_is_better = unit_of(key), direction
    for rel, data in files.items():
        if rel in wrappers or rel == "task.toml":
            continue
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    (out / "task.md").write_text(rewrite_brief(brief, report, dropped=wrappers))
    toml = "\n".join(
        [
            f"# Imported from HarnessGym ({report.source}) by `harnesslab import harnessgym`.",
            f"name = {json.dumps(name)}",
            f"summary = {json.dumps(_summary(brief, name))}",
            'kind = "command"',
            f"editable = {json.dumps(report.editable)}",
            f"score_key = {json.dumps(key)}",
            f"unit = {json.dumps(report.unit)}",
            f"higher_is_better = {'true' if direction else 'false'}",
            "",
            "[objectives.dev]",
            f"command = {json.dumps(commands['dev'])}",
            "",
            "[objectives.final]",
            f"command = {json.dumps(commands['final'])}",
            "",
        ]
    )
    (out / "task.toml").write_text(toml)
    parse_task(toml, out)  # what load_task will see: fail here, not at the first run
    report.notes.append(
        "the final objective runs the verifier's own fixed final cases; for hidden cases drawn "
        "per verification, add a [final] domain and read $HARNESSLAB_FINAL_CASES in the verifier"
    )


def _write_kernel_task(
    contract: Contract,
    out: Path,
    name: str,
    files: dict[str, bytes],
    edit: list[str],
    report: ImportReport,
) -> None:
    task = contract.task
    if contract.function != task.entry_function:  # --entry: the task's entry calls the user's
        entry = f"{contract.file}:{contract.function}"
        source = files[contract.file].decode("utf-8", "replace")
        if contract.file != task.entry_file or task.entry_function in _signatures(source):
            raise UsageError(
                f"--entry {entry}: {task.name}'s entry is {task.entry}; the import adds "
                f"{task.entry_function} to {task.entry_file}, so the function must live there "
                f"and {task.entry_file} must not define {task.entry_function} already.",
                next_step=f"move {contract.function} into {task.entry_file} (or rename the "
                f"file), or rename the {task.entry_function} it defines",
            )
        files = {
            **files,
            contract.file: files[contract.file] + shim_source(contract, entry).encode(),
        }
        report.notes.append(
            f"{task.entry_file} gained a {task.entry_function}(...) that calls your "
            f"{contract.function} (--entry {entry})"
        )
    shutil.copytree(
        task.root, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    text = (out / "task.toml").read_text()
    (out / "task.toml").write_text(
        re.sub(r'^name = ".*"$', f'name = "{name}"', text, count=1, flags=re.M)
    )
    shutil.rmtree(out / "solutions", ignore_errors=True)
    for rel in edit:
        if rel in task.editable:
            (out / "workspace" / rel).write_bytes(files[rel])
    kept = [rel for rel in edit if rel in task.editable]
    report.editable = list(task.editable)
    report.notes.append(
        f"the kernel follows {task.name}'s contract ({task.entry}): a kernel task with "
        f"{task.name}'s reference, tolerances and hidden domain; your {', '.join(kept)} is "
        "the workspace baseline"
    )
    config = task.config_file
    if config in kept:
        try:
            task.validate_config(json.loads(files[config]), source=config)
        except (UsageError, ValueError) as exc:
            (out / "workspace" / config).write_bytes(
                (task.workspace_template / config).read_bytes()
            )
            report.notes.append(
                f"{config} did not fit {task.name}'s launch space ({exc}): kept its own"
            )
    load_task(out)


def _summary(brief: str, name: str) -> str:
    title = next((ln.lstrip("# ").strip() for ln in brief.splitlines() if ln.startswith("#")), "")
    return (title or name)[:200]


def report_lines(report: ImportReport) -> list[str]:
    lines = [
        f"imported {report.source} as {report.kind} task {report.name} in {report.task_folder}"
    ]
    if report.kind == "command":
        lines.append(f"  dev objective:   {report.objectives.get('dev')}")
        lines.append(f"  final objective: {report.objectives.get('final')}")
        better = "higher" if report.higher_is_better else "lower"
        lines.append(
            f"  score: {report.score_key} ({report.unit or 'no unit'}), {better} is better"
        )
    lines.append(f"  editable: {', '.join(report.editable)}")
    for r in report.rewritten:
        lines.append(f"  task.md: {r}")
    for n in report.notes:
        lines.append(f"  note: {n}")
    if report.not_converted:
        lines.append("not converted:")
        for s in report.not_converted:
            lines.append(f"  {s.what}: {s.why}" + (f"; next: {s.next_step}" if s.next_step else ""))
    lines.append(
        f"next: harnesslab init --task {report.task_folder} -w WS && harnesslab eval -w WS"
    )
    return lines


__all__ = ["ImportReport", "Skipped", "convert", "find_commands", "report_lines", "rewrite_brief"]
