"""Core subcommands: init, eval, verify. Other modules register more on import (`demo` and
`run` live in run_cmd.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harnesslab.tools.authoring import failed_check
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation import run_objective, run_step_objective
from harnesslab.tools.execution import build_launcher
from harnesslab.tools.integrity import guarded_step_verify, guarded_verify
from harnesslab.tools.integrity.verdict_view import public_result, public_verdict
from harnesslab.tools.meta.skills import project_skills
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import Workspace, init_workspace, open_workspace
from harnesslab.tools.state.owned_config import OwnedConfig
from harnesslab.tools.task import kind_of, list_tasks

from .cli_progress import CliProgress
from .cli_support import add_executor_args, command, run_async
from .command_report import eval_command, verify_command
from .report import print_eval, print_rows


def workspace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-w", "--workspace", type=Path, default=Path("."), help="workspace folder (default .)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    add_executor_args(p)


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--workspace", type=Path, help="folder for the new workspace (default .)")
    # `harnesslab init DIR` from before -w: still works, with a note.
    p.add_argument("folder", nargs="?", type=Path, help=argparse.SUPPRESS)
    p.add_argument(
        "--task",
        default="rmsnorm_gate",
        help=f"task name ({', '.join(list_tasks())}) or a task folder",
    )
    p.add_argument(
        "--lang",
        default="triton",
        help="kernel language of the template: triton, or one the task also comes in (cuda: "
        "rmsnorm_gate, softmax, swiglu)",
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite task files in a non-empty folder"
    )
    p.add_argument(
        "--allow-failed-baseline",
        action="store_true",
        help="bind a task whose baseline failed its check when `task new`/`import-kernelbench` "
        "made it",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def init_folder(args: argparse.Namespace) -> Path:
    if args.folder is not None and args.workspace is not None and args.folder != args.workspace:
        raise UsageError(
            f"two folders given: {args.folder} and -w {args.workspace}.",
            next_step=f"use one: harnesslab init -w {args.workspace}",
        )
    if args.folder is not None:
        print(
            f"note: `harnesslab init {args.folder}` is deprecated; use "
            f"`harnesslab init -w {args.folder}` like every other command",
            file=sys.stderr,
        )
        return args.folder
    return args.workspace or Path(".")


@command("init", "Create a workspace from a task template.", _init_args)
def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    failed = failed_check(Path(args.task)) if Path(args.task).is_dir() else None
    if failed and not args.allow_failed_baseline:
        raise UsageError(
            f"{args.task}: the task's own baseline failed its check when it was made ({failed}).",
            next_step="fix the task (its reference, sizes or kernel) and make it again, or pass "
            "--allow-failed-baseline to bind it anyway",
        )
    ws = init_workspace(
        args.task, init_folder(args), settings, force=args.force, language=args.lang
    )
    # .claude/skills/ and .agents/skills/ for the agent clients, recorded as the toolkit's
    project_skills(ws.root, owned=OwnedConfig.in_store(ws.store))
    info = {
        "status": "ok",
        "workspace": str(ws.root),
        "task": ws.task.name,
        "editable": ws.task.editable,
    }
    if args.json:
        print(json.dumps(info))
    else:
        print(
            f"workspace {ws.root} ready for task {ws.task.name}; edit {', '.join(ws.task.editable)}"
        )
        print(f"next: harnesslab eval -w {ws.root}")
        print(
            f"      harnesslab config claude -w {ws.root} --write --approve   (or codex), then "
            f"start the client inside {ws.root}"
        )
    return 0


def _bind_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--workspace", type=Path, default=Path("."), help="workspace folder")
    p.add_argument(
        "--task", required=True, help="a task name or a task folder (yours, not the agent's)"
    )


@command(
    "bind",
    "Bind an existing workspace to a task in the trusted store without touching its files (a "
    "workspace made from a task folder before the store existed needs this once).",
    _bind_args,
)
def cmd_bind(args: argparse.Namespace, settings: Settings) -> int:
    ws = open_workspace(args.workspace, settings, task=args.task)
    print(f"workspace {ws.root} is bound to task {ws.task.name} ({ws.task.root})")
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    workspace_args(p)
    p.add_argument(
        "--cases", help="comma-separated dev case names (default: all; command tasks: {cases})"
    )
    p.add_argument("--warmup", type=int, help="untimed calls before timing (0..100)")
    p.add_argument("--repeats", type=int, help="timed samples per case (1..200)")


@command("eval", "Run the objective on the workspace's dev cases.", _eval_args)
def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    ws = open_workspace(args.workspace, settings)
    return EVAL_BY_KIND[kind_of(ws.task).name](ws, args, settings)


def eval_kernel(ws: Workspace, args: argparse.Namespace, settings: Settings) -> int:
    """A kernel task's dev cases on the runner (a command task's: command_report.py)."""
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else None

    async def go(progress: CliProgress):
        launcher = build_launcher(settings)
        try:
            return await run_objective(
                ws,
                launcher,
                cases=cases,
                warmup=args.warmup,
                repeats=args.repeats,
                progress=progress,
            )
        finally:
            await launcher.aclose()

    with CliProgress("eval") as progress:
        result = run_async(go, progress)
    if args.json:
        print(result.model_dump_json())
    else:
        print_eval(result, "eval (dev cases)")
    return 0 if result.status == "passed" else 1


def eval_step(ws: Workspace, args: argparse.Namespace, settings: Settings) -> int:
    """A step task's dev traces (--cases names traces): the per-trace rows, then each trace's
    per-bucket table."""
    traces = [c.strip() for c in args.cases.split(",")] if args.cases else None

    async def go(progress: CliProgress):
        launcher = build_launcher(settings)
        try:
            return await run_step_objective(ws, launcher, traces=traces, progress=progress)
        finally:
            await launcher.aclose()

    with CliProgress("eval") as progress:
        result = run_async(go, progress)
    if args.json:
        print(result.model_dump_json())
        return 0 if result.status == "passed" else 1
    print_eval(result, "eval (dev traces)")
    columns = ["trace", "bucket", "checked", "failed", "p50_us", "p95_us", "p99_us",
               "device_p50_us", "launch_overhead_us", "tokens_per_s"]  # fmt: skip
    rows = [
        [case.name, b.bucket, b.checked_steps, b.failed_steps,
         *("-" if v is None else round(v, 1) for v in (b.p50_us, b.p95_us, b.p99_us,
           b.device_p50_us, b.launch_overhead_us, b.tokens_per_s))]
        for case in result.cases for b in case.buckets or []
    ]  # fmt: skip
    print_rows("per-bucket step latency", columns, rows)
    return 0 if result.status == "passed" else 1


def _verify_args(p: argparse.ArgumentParser) -> None:
    workspace_args(p)
    p.add_argument("--rotate", action="store_true", help="draw a new hidden case set (new secret)")
    p.add_argument(
        "--reveal-cases",
        action="store_true",
        help="OPERATOR ONLY: print the hidden cases (shapes) and per-case timings; never run "
        "it where the agent reads the output, or the hidden cases stop being hidden",
    )


@command(
    "verify", "Guarded final verification on hidden cases; JSON verdict with --json.", _verify_args
)
def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    ws = open_workspace(args.workspace, settings)
    return VERIFY_BY_KIND[kind_of(ws.task).name](ws, args, settings)


def verify_kernel(
    ws: Workspace, args: argparse.Namespace, settings: Settings, verify=guarded_verify
) -> int:
    """A kernel task's guarded verify (a command task's final objective: command_report.py; a
    step task's, on hidden traces: `verify=guarded_step_verify`, the same Verdict)."""

    async def go(progress: CliProgress):
        launcher = build_launcher(settings)
        try:
            return await verify(ws, launcher, settings, rotate=args.rotate, progress=progress)
        finally:
            await launcher.aclose()

    with CliProgress("verify") as progress:
        verdict = run_async(go, progress)
    # Without the operator's flag the output is what guarded_final_verify shows an agent: no
    # hidden shape, no per-case time or bandwidth (tools/integrity/verdict_view.py says why).
    # Nor anything the candidate's run chose: an error value, which case failed, a time.
    reveal = args.reveal_cases
    if args.json:
        print(verdict.model_dump_json() if reveal else json.dumps(public_verdict(verdict)))
    else:
        shown = verdict.result if reveal else public_result(verdict)
        print_eval(shown, f"verify (hidden set {verdict.case_set})")
        print(f"verdict: {verdict.verdict} (certifies: {verdict.certifies})")
        reasons = verdict.reasons if reveal else public_verdict(verdict)["reasons"]
        for r in reasons:
            print(f"  {r['code']}: {r['detail']}")
    return 0 if verdict.verdict == "passed" else 1


def verify_step(ws: Workspace, args: argparse.Namespace, settings: Settings) -> int:
    """A step task's guarded verify on hidden traces (tools/integrity/step_verify.py)."""
    return verify_kernel(ws, args, settings, verify=guarded_step_verify)


# What `eval` and `verify` run, per task kind (tools/task/kinds.py KINDS).
EVAL_BY_KIND = {"kernel": eval_kernel, "command": eval_command, "step": eval_step}
VERIFY_BY_KIND = {"kernel": verify_kernel, "command": verify_command, "step": verify_step}
