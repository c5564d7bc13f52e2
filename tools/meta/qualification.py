"""Qualification: is an MCP server fit to hand to a fresh agent session?

Run in a clean room (tools/meta/cleanroom.py): a fresh copy of the task's workspace template plus
only the server's reusable `.harnesslab/` bundle. Checks, each with evidence and a duration:

    manifest              manifest.json parses (command, args, tools, timeouts, self_test)
    syntax                every .py file of the bundle compiles
    portable_paths        no absolute path into the dirty workspace anywhere in the bundle
    skill                 SKILL.md front matter: name = folder, a description under 1024 chars
    toolkit_server        (generated servers) server.py is the toolkit's own rendering
    startup               the server answers initialize over stdio within its startup timeout
    tools_list            tools/list non-empty, every schema a valid JSON Schema object,
                          every tool the manifest enables is listed
    tool:<name>           each tool answers its probe arguments within its timeout
    verifier:<name>       a verifier-like tool accepts the honest baseline and rejects cheating
                          kernels (x.clone() and a few of integrity/cheats/cpu)
    stdout_protocol_only  nothing but JSON-RPC on the server's stdout
    served_rerun          (custom tools) the server started anew in the used room: each custom
                          tool answers again, a verifier still rejects a cheat
    self_test             `--self-test` exits 0 (a generated server's: its custom tools)
    own_tests             the server's tests pass under pytest
    sandbox               where the agent's code ran, as each sandbox reported it

The session, the self-test and the tests run at once, each in its own clean room (a fresh
workspace and a private state dir). In the session a generated server's custom tools see what
they see when served: the clean room mounted at the served workspace's own path, the bundle
at `<workspace>/.harnesslab/mcp/<name>`, the same environment. The agent's code runs sandboxed
everywhere (tools/gpu/isolation/sandbox.py: the clean room writable and nothing else, no network, the
sandbox's limits, nothing left running): a generated server's custom tools in the sandboxed
worker its server starts (the server process itself runs toolkit code only; they write only
their declared write set), the self-test and the own tests wholly inside the sandbox.
Every step is bounded by its own limit and by the overall `timeout_s`; processes are killed by
group after.
Results go to qualification.json and, on failure, failure_report.md (written to be pasted into
a repair prompt). The per-check logic lives in tools/meta/qualify_checks.py.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import anyio

from ..errors import UsageError
from ..gpu import wire
from ..gpu.isolation.sandbox_policy import Limits, import_env, import_roots, python_argv
from ..progress import Progress
from ..settings import Settings
from ..state import STATE, Workspace
from ..state import workspace_files as wf
from ..state.storage import atomic_write_json, atomic_write_text
from ..state.trusted_store import private_dir
from ..task.spec import tasks_root
from . import qualify_checks as qc
from . import qualify_session as qs
from . import registry
from .bundle import (
    QualificationReport,
    bundle_hash,
    bundle_roots,
    default_bundle,
    hash_items,
    report_from_json,
    snapshot_bundle,
    workspace_bundle,
)
from .cleanroom import bundle_files, describe_sandbox, kill_marked, make_clean_room
from .custom_host import holds_toolkit, mounts_available
from .genserver import SERVER_NAME_RE, LaunchSpec, Manifest, load_manifest
from .qualify_checks import Check

DEFAULT_TIMEOUT_S = 300.0


def infer_dirty_roots(sdir: Path) -> list[Path]:
    """The workspace a server folder sits in (…/<ws>/.harnesslab/mcp/<name>), else the folder."""
    if sdir.parent.name == "mcp" and sdir.parent.parent.name == STATE:
        return [sdir.parents[2]]
    return [sdir]


async def qualify(
    server_dir: Path,
    ws_template: str | Path,
    bundle: dict[str, Path] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    settings: Settings,
    dirty_roots: list[Path] | None = None,
    cheats_dir: Path | None = None,
    max_corpus_cheats: int = 3,
    progress: Progress | None = None,
    report_dir: Path | None = None,
    keep_clean_room: bool = False,
    generated: bool | None = None,
) -> QualificationReport:
    """Qualify the server in `server_dir` against a clean room made from `ws_template` (a task
    name or folder, see make_clean_room) plus `bundle` (relative destination -> source; default:
    the server folder and its skill). Never raises for a bad server: every problem is a failed
    check. Writes qualification.json (+ failure_report.md) into `report_dir` (default:
    server_dir).

    `generated` (default: its manifest says harnesslab generated it, or it sits in a
    workspace's .harnesslab/mcp/): its server.py must be the toolkit's own, which qualification
    starts itself (never the manifest's command) and whose custom tools run in their sandboxed
    worker. A server brought from outside is started with its manifest's command. Either way
    the self-test and the server's own tests run sandboxed."""
    started = time.perf_counter()
    deadline = anyio.current_time() + timeout_s
    sdir = Path(server_dir).resolve()
    out_dir = report_dir or sdir
    board = qc.Board(progress)
    try:
        manifest = load_manifest(sdir)
    except UsageError as exc:
        await board.add(
            Check(name="manifest", passed=False, evidence=exc.message, next_step=exc.next_step)
        )
        return _finish(sdir.name, sdir, board, {}, [], started, out_dir)
    tools = [t.name for t in manifest.enabled_tools()]
    if generated is None:
        generated = manifest.generator.startswith("harnesslab") or infer_dirty_roots(sdir) != [sdir]
    custom = any(t.kind == "custom" for t in manifest.enabled_tools())
    board.total = (
        10 + generated + custom + len(tools) + sum(t.verifier for t in manifest.enabled_tools())
    )
    bundle = bundle or default_bundle(sdir, manifest.name)
    await board.add(
        Check(
            name="manifest",
            passed=True,
            evidence=f"{len(tools)} enabled tools: {', '.join(tools) or 'none declared'}",
        )
    )
    files = bundle_files(bundle)
    syntax = qc.syntax_check(files)
    await board.add(syntax)
    await board.add(qc.path_check(files, dirty_roots or infer_dirty_roots(sdir)))
    await board.add(qc.skill_check(bundle, manifest))
    if not syntax.passed:
        await board.add(
            Check(
                name="startup",
                passed=False,
                evidence="not started: the bundle has a syntax error (see syntax)",
                next_step="fix the syntax error first",
            )
        )
        return _finish(manifest.name, sdir, board, bundle, tools, started, out_dir)
    if generated:
        toolkit = qc.toolkit_server_check(sdir, manifest.name)
        await board.add(toolkit)
        if not toolkit.passed:
            await board.add(
                Check(
                    name="startup",
                    passed=False,
                    evidence="not started: server.py is not the toolkit's (see toolkit_server)",
                    next_step="regenerate the server with generate_server",
                )
            )
            return _finish(manifest.name, sdir, board, bundle, tools, started, out_dir)

    # The bundle entry that is the server folder (the default bundle lists it first).
    srv_rel = next(
        (rel for rel, src in bundle.items() if src.resolve() == sdir), next(iter(bundle))
    )
    base = Path(tempfile.mkdtemp(prefix=f"harnesslab-qualify-{manifest.name}-"))
    # Everything qualification starts sees a private state dir per lane under `base` (never
    # the operator's trusted store or secrets), only the allowlisted environment, and carries
    # a mark by which whatever it leaves running is found and killed below.
    token = uuid.uuid4().hex
    served = _served_root(sdir, dirty_roots) if generated else None
    mounts = await anyio.to_thread.run_sync(mounts_available, settings.python)
    mountable = mounts and served is not None and not holds_toolkit(settings.python, served)
    confined = qs.Confined(
        python=settings.python,
        require=not settings.allow_unsandboxed,
        limits=Limits.from_dict(settings.sandbox_limits()),
        served=served if mountable else None,
    )
    try:
        rooms, states, envs = {}, {}, {}
        for key in ("session", "selftest", "pytest"):
            states[key] = base / f"{key}-state"
            private = settings.model_copy(update={"state_dir": states[key]})
            shown = confined.shown(base / key) if key != "session" else None
            rooms[key] = make_clean_room(
                ws_template,
                base / key,
                bundle,
                private,
                shown=None if shown == base / key else shown,
            )
            envs[key] = qc.child_env(
                settings,
                base=base,
                token=token,
                state_dir=states[key],
                served_at=served if key == "session" else None,
            )
            (base / f"{key}-io").mkdir()
        session_settings = settings.model_copy(update={"state_dir": states["session"]})
        cheats = qc.cheats_for(rooms["session"], session_settings, cheats_dir, max_corpus_cheats)
        launch, self_test_argv = _launches(
            manifest, rooms, srv_rel, settings.python, generated, base / "session-io", confined
        )
        if not generated:
            confined.levels["server"] = "unsandboxed (brought: started as its manifest says)"
        elif any(t.kind != "builtin" for t in manifest.enabled_tools()):
            confined.levels["custom tools"] = "not started"
        lanes: dict[str, list[Check]] = {"session": [], "selftest": [], "pytest": []}
        with anyio.move_on_after(max(deadline - anyio.current_time(), 1.0)):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    qs.session_checks,
                    manifest,
                    rooms["session"],
                    launch,
                    settings.python,
                    envs["session"],
                    deadline,
                    cheats,
                    board.lane(lanes["session"]),
                    base / "session-io",
                )
                tg.start_soon(
                    qs.self_test_check,
                    manifest,
                    rooms["selftest"],
                    self_test_argv,
                    states["selftest"],
                    envs["selftest"],
                    deadline,
                    board.lane(lanes["selftest"]),
                    confined,
                )
                tg.start_soon(
                    qs.tests_check,
                    manifest,
                    rooms["pytest"],
                    srv_rel,
                    states["pytest"],
                    envs["pytest"],
                    deadline,
                    board.lane(lanes["pytest"]),
                    confined,
                )
        for lane in lanes.values():
            for check in lane:
                # Paths in tracebacks read as the workspace's own: ".harnesslab/mcp/x/fix.py".
                for room in [*rooms.values(), *([served] if served else [])]:
                    check.evidence = check.evidence.replace(f"{room}/", "")
                board.checks.append(check)
        names = {c.name for c in board.checks}
        # A session check that failed (startup, tools_list) explains the session checks that
        # never ran; anything else missing ran out of time.
        stopper = next((c.name for c in lanes["session"] if not c.passed), "")
        for missing in qc.expected_checks(manifest):
            if missing in names:
                continue
            if stopper and missing not in ("self_test", "own_tests"):
                evidence = f"not run: {stopper} failed first"
                next_step = f"fix {stopper}"
            else:
                evidence = f"not finished: qualification ran out of its {timeout_s:g}s budget"
                next_step = "make the server start and answer faster, or raise the timeout"
            await board.add(
                Check(name=missing, passed=False, evidence=evidence, next_step=next_step)
            )
        if "custom tools" in confined.levels:
            confined.levels["custom tools"] = _worker_level(base / "session-io" / SANDBOX_REPORT)
        environment = environment_check(board.checks)
        if environment is not None:  # first: the reason a repair prompt reads starts with it
            board.checks.insert(0, environment)
        await board.add(qc.sandbox_check(confined.levels, allowed_none=settings.allow_unsandboxed))
    finally:
        kill_marked(token)  # synchronous: runs even when the caller was cancelled
        if not keep_clean_room:
            shutil.rmtree(base, ignore_errors=True)
    report = _finish(manifest.name, sdir, board, bundle, tools, started, out_dir)
    if keep_clean_room:
        report.clean_room = str(base)
    return report


SANDBOX_REPORT = "custom-tools-sandbox.jsonl"


def _served_root(sdir: Path, dirty_roots: list[Path] | None) -> Path | None:
    """The workspace the server will be served in (its custom tools are shown the clean room at
    that path), or None for a server folder outside a workspace."""
    root = (dirty_roots or infer_dirty_roots(sdir))[0].resolve()
    return root if root != sdir and (root / STATE).is_dir() else None


def _launches(
    manifest: Manifest,
    rooms: dict[str, Path],
    srv_rel: str,
    python: str,
    generated: bool,
    session_io: Path,
    confined: qs.Confined,
) -> tuple[LaunchSpec, list[str]]:
    """How the session starts the server, and the self-test's command. A generated server:
    the toolkit's own server.py with the toolkit's interpreter in isolated mode (-I: nothing of
    the bundle folder is importable by it) through the import bootstrap (the toolkit's own
    import roots, however it was installed), never the manifest's command; the self-test names
    the room where its sandbox shows it (the served workspace's path). A brought server:
    its manifest's."""
    if not generated:
        session = manifest.launch(rooms["session"], rooms["session"] / srv_rel)
        room = rooms["selftest"]
        self_test = manifest.launch(room, room / srv_rel, self_test=True)
        return session, self_test.argv

    def server(room: Path) -> list[str]:
        return python_argv(python, [str(room / srv_rel / "server.py"), "--workspace", str(room)])

    session = LaunchSpec(
        argv=[*server(rooms["session"]), "--sandbox-report", str(session_io / SANDBOX_REPORT)],
        cwd=rooms["session"],
        env=import_env(import_roots()),  # -I drops PYTHONPATH: the toolkit's roots, explicitly
    )
    # Built-ins are called by the session (which has the network an SSH executor needs); the
    # sandboxed self-test calls the agent's custom tools.
    return session, [*server(confined.shown(rooms["selftest"])), "--self-test", "--custom-only"]


MISSING_MODULE = re.compile(r"No module named '([A-Za-z0-9_.]{1,100})'")


def environment_check(checks: list[Check]) -> Check | None:
    """A failed check whose evidence says a child could not import a module that this process
    (the toolkit's own Python) imports: the installation's fault, not the server's."""
    for check in checks:
        if check.passed:
            continue
        for match in MISSING_MODULE.finditer(check.evidence):
            top = match.group(1).split(".")[0]
            try:
                found = importlib.util.find_spec(top) is not None
            except (ImportError, ValueError):
                found = False
            if found:
                return Check(
                    name="environment",
                    passed=False,
                    evidence=f"environment: cannot import {top} in the server's processes "
                    f"({check.name} failed on it), though the toolkit's own Python imports it",
                    next_step="not the server's doing: its checks ran where the toolkit's "
                    "dependencies are not importable; install the toolkit and its dependencies "
                    "in one environment (a venv), or report how it was installed",
                )
    return None


def _worker_level(path: Path) -> str:
    """What the custom tools' sandbox applied in the session (the server wrote down each
    worker's sandbox report, read before the worker ran: the weakest of them)."""
    levels = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            report = wire.json_object(line)
            if report is not None:
                levels.append(report)
    if not levels:
        return "not started"
    rank = {"full": 2, "partial": 1}
    return describe_sandbox(min(levels, key=lambda r: rank.get(str(r.get("level")), 0)))


def _finish(
    name: str,
    sdir: Path,
    board: qc.Board,
    bundle: dict[str, Path],
    tools: list[str],
    started: float,
    out_dir: Path,
) -> QualificationReport:
    report = QualificationReport(
        server=name,
        server_dir=str(sdir),
        passed=all(c.passed for c in board.checks) and bool(board.checks),
        checks=board.checks,
        tools=tools,
        duration_s=round(time.perf_counter() - started, 3),
        bundle_hash=bundle_hash(bundle) if bundle else "",
        qualified_at=time.time(),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    report.report_path = str(out_dir / "qualification.json")
    failure = out_dir / "failure_report.md"
    if report.passed:
        failure.unlink(missing_ok=True)
    else:
        report.failure_report_path = str(failure)
        atomic_write_text(failure, failure_report(report))
    atomic_write_json(out_dir / "qualification.json", report.model_dump(mode="json"))
    return report


def failure_report(report: QualificationReport) -> str:
    """Markdown for a repair prompt: what failed, the evidence, what to change."""
    failed = report.failed()
    lines = [
        f"# Server `{report.server}` failed qualification",
        "",
        f"It was started in a clean copy of the workspace (task template + only its "
        f"`.harnesslab/` bundle) and failed {len(failed)} of {len(report.checks)} checks. Fix "
        "these, keep every other check passing, then run self_test_server again.",
        "",
    ]
    for c in failed:
        lines += [f"## {c.name}", "", "Evidence:", "", "```", c.evidence.strip()[:3000], "```", ""]
        if c.next_step:
            lines += [f"What to change: {c.next_step}", ""]
    passed = [c.name for c in report.checks if c.passed]
    if passed:
        lines += ["Passed: " + ", ".join(passed), ""]
    return "\n".join(lines)


def template_for(ws: Workspace) -> str | Path:
    """What a clean copy of `ws` is made from: its shipped task's name, else its task folder."""
    try:
        ws.task.root.relative_to(tasks_root())
        return ws.task.name
    except ValueError:
        return ws.task.root


async def qualify_workspace_server(
    ws: Workspace,
    name: str,
    settings: Settings,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    cheats_dir: Path | None = None,
    max_corpus_cheats: int = 3,
) -> QualificationReport:
    """Qualify the generated server `name` of a workspace: a snapshot of its bundle (taken from
    the workspace as untrusted input) is qualified; the outcome goes to the trusted store (the
    report, and the snapshot itself when it passed: registration serves exactly that) and to
    the registry (qualified, or quarantined with the precise reason). The workspace gets
    qualification.json / failure_report.md as views to read."""
    if not SERVER_NAME_RE.match(name or ""):
        raise UsageError(
            f"{name!r} is not a server name.",
            next_step="names are lowercase letters/digits joined by single hyphens",
        )
    sdir_rel = bundle_roots(name)[0]
    if not wf.is_dir(ws.root, sdir_rel):
        raise UsageError(
            f"no generated server {name!r} in {ws.root}.",
            next_step="create it with generate_server (list_servers shows what exists)",
        )
    incoming = Path(tempfile.mkdtemp(prefix=".incoming-", dir=private_dir(ws.store.servers_dir)))
    try:
        bundle, digest = snapshot_bundle(ws, name, incoming)
        with tempfile.TemporaryDirectory(prefix="harnesslab-reports-") as reports:
            report = await qualify(
                incoming / sdir_rel,
                template_for(ws),
                bundle,
                timeout_s,
                settings=settings,
                dirty_roots=[ws.root],
                cheats_dir=cheats_dir,
                max_corpus_cheats=max_corpus_cheats,
                progress=progress,
                report_dir=Path(reports),
                generated=True,
            )
        report.bundle_hash = digest
        report.server_dir = str(ws.root / sdir_rel)
        report.report_path = str(ws.root / sdir_rel / "qualification.json")
        failure_rel = f"{sdir_rel}/failure_report.md"
        if report.passed:
            report.failure_report_path = ""
            if wf.is_file(ws.root, failure_rel):
                (ws.root / failure_rel).unlink()
        else:
            report.failure_report_path = str(ws.root / failure_rel)
            wf.write_text(ws.root, failure_rel, failure_report(report))
        wf.write_json(ws.root, f"{sdir_rel}/qualification.json", report.model_dump(mode="json"))
        registry.record_qualification(ws, report, snapshot=incoming if report.passed else None)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)  # a passing snapshot was moved away
    return report


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Check",
    "QualificationReport",
    "bundle_hash",
    "bundle_roots",
    "default_bundle",
    "failure_report",
    "hash_items",
    "qualify",
    "qualify_workspace_server",
    "report_from_json",
    "snapshot_bundle",
    "template_for",
    "workspace_bundle",
]
