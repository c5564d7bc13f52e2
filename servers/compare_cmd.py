"""`harnesslab compare`: plain vs harnessed (or any two runner setups) over N trials each, every
trial in a fresh workspace and scored by the guarded path (tools/loop/compare.py). Prints the arms'
summary and where the report is; --json prints report.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harnesslab.tools.errors import HarnesslabError, UsageError
from harnesslab.tools.loop.compare import (
    Arm,
    CompareConfig,
    CompareReport,
    compare,
    finished_trials,
)
from harnesslab.tools.loop.compare_report import difference_line
from harnesslab.tools.settings import Settings

from .cli_support import add_executor_args, command, run_async
from .report import INTERPRETER_NOTE, console, fit_table
from .run_cmd import duration_s, durations_s

RUNNERS = ["exec", "claude", "codex", "autopilot"]


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help="task name or task folder (each trial's template)")
    p.add_argument("--out", type=Path, required=True, help="new folder: trials and the report")
    p.add_argument("--trials", type=int, default=3, help="trials per arm (default 3)")
    p.add_argument("--iterations", type=int, default=1, help="attempts per trial (default 1)")
    p.add_argument(
        "--harness-from",
        type=Path,
        metavar="WORKSPACE",
        help="arm B gets this workspace's registered generated servers (a finished run's harness)",
    )
    p.add_argument("--runner", choices=RUNNERS, default="autopilot", help="both arms' runner")
    p.add_argument("--agent-cmd", default="", help="exec runner command (both arms)")
    p.add_argument("--agent-arg", action="append", default=[], help="runner argument (both arms)")
    p.add_argument("--b-runner", choices=RUNNERS, help="arm B's runner, when it differs")
    p.add_argument("--b-agent-cmd", help="arm B's exec command, when it differs")
    p.add_argument("--b-agent-arg", action="append", help="arm B's runner arguments instead")
    p.add_argument("--a-name", default="plain", help="arm A's name (default plain)")
    p.add_argument("--b-name", default="", help="arm B's name (default harnessed, or b)")
    p.add_argument("--attempt-timeout", type=duration_s, default=300.0, help="e.g. 5m")
    p.add_argument("--attempt-timeouts", type=durations_s, default=None, help="e.g. 5m,8m")
    p.add_argument(
        "--require-harness-tool-use",
        action="store_true",
        help="a trial of an arm with generated servers counts only if it called one of them",
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument(
        "--parallel",
        type=int,
        default=0,
        metavar="N",
        help="trials at once, each on its own GPU (--gpus 0,1,...; default: one per GPU; "
        "1: one after another)",
    )
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="finish the compare started in --out (same settings; its finished trials are kept)",
    )
    again.add_argument(
        "--force", action="store_true", help="start over in a used --out (its trials are removed)"
    )
    p.add_argument("--json", action="store_true", help="print report.json on stdout")
    add_executor_args(p)


def arms_from(args: argparse.Namespace) -> list[Arm]:
    a = Arm(
        name=args.a_name, runner=args.runner, agent_cmd=args.agent_cmd, agent_args=args.agent_arg
    )
    b = Arm(
        name=args.b_name or ("harnessed" if args.harness_from else "b"),
        runner=args.b_runner or args.runner,
        agent_cmd=args.b_agent_cmd if args.b_agent_cmd is not None else args.agent_cmd,
        agent_args=args.b_agent_arg if args.b_agent_arg is not None else args.agent_arg,
        servers_from=args.harness_from,
    )
    if a.model_dump(exclude={"name"}) == b.model_dump(exclude={"name"}):
        raise UsageError(
            "both arms are the same setup.",
            next_step="give arm B a harness (--harness-from WORKSPACE) or its own --b-runner / "
            "--b-agent-cmd / --b-agent-arg",
        )
    return [a, b]


@command(
    "compare",
    "A/B two loop setups (plain vs harnessed) over N fresh trials each, scored by the guarded "
    "path on one hidden case set; writes report.json, report.md and scores.png.",
    _args,
)
def cmd_compare(args: argparse.Namespace, settings: Settings) -> int:
    config = CompareConfig(
        task=args.task,
        out=args.out,
        arms=arms_from(args),
        trials=args.trials,
        iterations=args.iterations,
        attempt_timeout_s=args.attempt_timeout,
        attempt_timeouts_s=args.attempt_timeouts or [],
        require_harness_tool_use=args.require_harness_tool_use,
        seed=args.seed,
        parallel=args.parallel,
    )

    def progress(ev: dict[str, Any]) -> None:
        print(f"  {ev['message']}", file=sys.stderr, flush=True)

    async def go():
        return await compare(
            config, settings, on_event=progress, resume=args.resume, force=args.force
        )

    try:
        report = run_async(go)
    except (HarnesslabError, KeyboardInterrupt) as exc:
        if isinstance(exc, UsageError):  # refused before any trial ran: the error says it all
            raise
        kept = len(finished_trials(args.out)) if args.out.is_dir() else 0
        if kept:
            print(
                f"{kept} finished trial(s) are kept in {args.out}: the same command with "
                "--resume runs the rest",
                file=sys.stderr,
            )
        raise
    if args.json:
        print(report.model_dump_json())
        return 0
    print_compare(report)
    return 0


def print_compare(report: CompareReport) -> None:
    """The arms side by side (scores only where timings mean something), the difference, and
    where the full report is."""
    out = console()
    better = "higher" if report.higher_is_better else "lower"
    unit = f" ({report.unit})" if report.unit else ""
    out.print(
        f"compare {report.task}: {report.score_key}{unit}, {better} is better, hidden case set "
        f"{report.case_set or '-'}"
    )
    scores = report.meaningful is not False
    rows = [
        [a.arm, a.runner, ", ".join(a.servers) or "-", f"{a.valid} of {a.trials}",
         _g(a.median) if scores else "", f"{_g(a.p10)}..{_g(a.p90)}" if scores else "",
         _g(a.best) if scores else "", _g(a.tool_calls_median), _g(a.harness_calls_median)]
        for a in report.arms
    ]  # fmt: skip
    columns = ["arm", "runner", "servers", "valid", "median", "p10..p90", "best", "tool calls",
               "harness calls"]  # fmt: skip
    out.print(fit_table("", columns, rows))
    if not scores:
        out.print(INTERPRETER_NOTE)
    out.print(difference_line(report, numbers=scores))
    plot = ", scores.png" if "plot" in report.files else ""
    out.print(f"report: {report.files.get('markdown')} (+ report.json{plot})")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


__all__ = ["cmd_compare"]
