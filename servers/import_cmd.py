"""`harnesslab import harnessgym PATH --out DIR`: a HarnessGym task folder as a harnesslab task
(tools/authoring/harnessgym_import.py), printing what was converted and what could not be."""

from __future__ import annotations

import argparse
from pathlib import Path

from harnesslab.tools.authoring.harnessgym_import import convert, report_lines
from harnesslab.tools.settings import Settings

from .cli_support import command


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", choices=["harnessgym"], help="what the folder is from")
    p.add_argument("path", type=Path, help="the HarnessGym task folder (task.md, verifier.py, ...)")
    p.add_argument("--out", type=Path, required=True, help="the new harnesslab task folder")
    p.add_argument("--name", help="task name (default: from the folder's name)")
    p.add_argument("--score-key", help="score key (default: from task.md)")
    p.add_argument(
        "--higher-is-better",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="direction (default: from task.md; lower is better)",
    )
    p.add_argument("--dev-command", help="the agent's objective (default: from task.md)")
    p.add_argument("--final-command", help="the loop's objective (default: from task.md)")
    p.add_argument("--editable", help="comma-separated editable files (default: from task.md)")
    p.add_argument(
        "--entry",
        help="file.py:function of a kernel that takes a kernel task's parameters under another "
        "name (e.g. kernel.py:fused_rmsnorm_silu_gate): imports a kernel task (default: by the "
        "task's own entry name, else a command task)",
    )
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.add_argument("--json", action="store_true", help="print the import report as JSON")


@command(
    "import",
    "Turn a HarnessGym task folder into a harnesslab task (command task, or a kernel task when "
    "the kernel matches one), rewriting its task.md; prints what it could not convert.",
    _args,
)
def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    report = convert(
        args.path,
        args.out,
        name=args.name,
        score_key=args.score_key,
        higher_is_better=args.higher_is_better,
        dev_command=args.dev_command,
        final_command=args.final_command,
        editable=[e.strip() for e in args.editable.split(",")] if args.editable else None,
        entry=args.entry,
        force=args.force,
    )
    if args.json:
        print(report.model_dump_json())
    else:
        print("\n".join(report_lines(report)))
    return 0


__all__ = ["cmd_import"]
