"""Core subcommands: init, eval, verify, demo. Other modules register more on import."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harnesslab.tools.launcher import build_launcher
from harnesslab.tools.objective import run_objective
from harnesslab.tools.settings import Settings
from harnesslab.tools.skills import project_skills
from harnesslab.tools.tasks import list_tasks
from harnesslab.tools.verify import guarded_verify
from harnesslab.tools.workspace import init_workspace, open_workspace

from .cli import add_executor_args, command, run_async
from .report import print_eval


def progress_printer(enabled: bool):
    def cb(done: float, total: float, message: str) -> None:
        if enabled:
            print(f"  [{int(done)}/{int(total)}] {message}", file=sys.stderr, flush=True)

    return cb


def workspace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-w", "--workspace", type=Path, default=Path("."), help="workspace folder (default .)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    add_executor_args(p)


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("workspace", type=Path, help="new folder for the workspace")
    p.add_argument(
        "--task",
        default="rmsnorm_gate",
        help=f"task name ({', '.join(list_tasks())}) or a task folder",
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite task files in a non-empty folder"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


@command("init", "Create a workspace from a task template.", _init_args)
def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    ws = init_workspace(args.task, args.workspace, force=args.force)
    project_skills(ws.root)  # .claude/skills/ and .agents/skills/ for the agent clients
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
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    workspace_args(p)
    p.add_argument("--cases", help="comma-separated dev case names (default: all)")
    p.add_argument("--warmup", type=int, help="untimed calls before timing (0..100)")
    p.add_argument("--repeats", type=int, help="timed samples per case (1..200)")


@command("eval", "Run the objective on the workspace's dev cases.", _eval_args)
def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    ws = open_workspace(args.workspace)
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else None

    async def go():
        launcher = build_launcher(settings)
        try:
            return await run_objective(
                ws,
                launcher,
                cases=cases,
                warmup=args.warmup,
                repeats=args.repeats,
                progress=progress_printer(not args.json),
            )
        finally:
            await launcher.aclose()

    result = run_async(go)
    if args.json:
        print(result.model_dump_json())
    else:
        print_eval(result, "eval (dev cases)")
    return 0 if result.status == "passed" else 1


def _verify_args(p: argparse.ArgumentParser) -> None:
    workspace_args(p)
    p.add_argument("--rotate", action="store_true", help="draw a new hidden case set (new secret)")


@command(
    "verify", "Guarded final verification on hidden cases; JSON verdict with --json.", _verify_args
)
def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    ws = open_workspace(args.workspace)

    async def go():
        launcher = build_launcher(settings)
        try:
            return await guarded_verify(
                ws, launcher, settings, rotate=args.rotate, progress=progress_printer(not args.json)
            )
        finally:
            await launcher.aclose()

    verdict = run_async(go)
    if args.json:
        print(verdict.model_dump_json())
    else:
        print_eval(verdict.result, f"verify (hidden set {verdict.case_set})")
        print(f"verdict: {verdict.verdict}")
        for r in verdict.reasons:
            print(f"  {r['code']}: {r['detail']}")
    return 0 if verdict.verdict == "passed" else 1


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workspace", type=Path, help="folder for the demo workspace (default: a new temp folder)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    add_executor_args(p)


@command(
    "demo", "Init a temporary rmsnorm_gate workspace, eval, try launch configs, verify.", _demo_args
)
def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from harnesslab.tools.sweep import sweep

    from .cli import temp_workspace_dir
    from .report import print_rows

    root = args.workspace or temp_workspace_dir() / "ws"
    ws = init_workspace("rmsnorm_gate", root, force=True)
    say = progress_printer(not args.json)

    async def go():
        launcher = build_launcher(settings)
        try:
            base = await run_objective(ws, launcher, progress=say)
            swept = await sweep(
                ws,
                launcher,
                space={"num_warps": [2, 4, 8], "rows_per_program": [1, 4]},
                max_configs=4,
                apply=True,
                progress=say,
            )
            after = await run_objective(ws, launcher, progress=say)
            verdict = await guarded_verify(ws, launcher, settings, progress=say)
            return base, swept, after, verdict
        finally:
            await launcher.aclose()

    base, swept, after, verdict = run_async(go)
    summary = {
        "workspace": str(ws.root),
        "meaningful": base.meaningful,
        "baseline_score_us": base.score_us,
        "sweep_best": swept.best.model_dump() if swept.best else None,
        "after_sweep_score_us": after.score_us,
        "verdict": verdict.verdict,
        "final_score_us": verdict.score_us,
    }
    if args.json:
        print(json.dumps(summary))
        return 0 if verdict.verdict == "passed" else 1
    print_eval(base, "baseline (dev cases)")
    print_rows(
        "sweep (best first)",
        ["config", "status", "score us"],
        [
            [json.dumps(r.config), r.status, f"{r.score_us:.1f}" if r.score_us else "-"]
            for r in swept.results
        ],
    )
    print_rows(
        "demo summary"
        + ("" if base.meaningful else " (Triton CPU interpreter: timings not meaningful)"),
        ["step", "result"],
        [
            ["baseline dev score us", f"{base.score_us:.1f}" if base.score_us else base.status],
            ["best swept config", json.dumps(swept.best.config) if swept.best else "none passed"],
            ["dev score after sweep", f"{after.score_us:.1f}" if after.score_us else after.status],
            [
                f"guarded verify ({verdict.case_set})",
                f"{verdict.verdict}, {verdict.score_us:.1f} us"
                if verdict.score_us
                else verdict.verdict,
            ],
            ["workspace", str(ws.root)],
        ],
    )
    return 0 if verdict.verdict == "passed" else 1
