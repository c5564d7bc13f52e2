"""`harnesslab doctor`: what is missing to work on a workspace, and what is in its client files
that harnesslab did not write, with the command that fixes it. Exit 0 when nothing is missing
or foreign, 1 otherwise (the report says what)."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from rich.table import Table

from harnesslab.tools.doctor import run_doctor
from harnesslab.tools.meta.client_setup import ClientName
from harnesslab.tools.settings import Settings

from .cli_support import add_executor_args, command, run_async
from .report import console

MARK = {"ok": "ok     ", "missing": "MISSING", "skipped": "skipped", "foreign": "FOREIGN"}


def _doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-w", "--workspace", type=Path, default=Path("."), help="workspace folder (default .)"
    )
    p.add_argument(
        "--client",
        choices=["claude", "codex", "all"],
        default="all",
        help="which agent client to check (CLI and config; default both)",
    )
    p.add_argument("--name", default="harnesslab", help="the server's entry name in the configs")
    p.add_argument(
        "--no-executor", action="store_true", help="skip the executor check (a runner start)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    add_executor_args(p)


@command(
    "doctor",
    "Check the workspace, the executor, the agent CLIs and the client configs; print what is "
    "missing with the command that fixes it.",
    _doctor_args,
)
def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    clients: tuple[ClientName, ...] = (
        ("claude", "codex") if args.client == "all" else (args.client,)
    )
    report = run_async(
        partial(
            run_doctor,
            args.workspace,
            settings,
            clients=clients,
            name=args.name,
            executor=not args.no_executor,
        )
    )
    if args.json:
        print(json.dumps(report.model_dump()))
    else:
        # One row per check; a long detail or fix wraps under itself (80 columns).
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for c in report.checks:
            grid.add_row(MARK[c.status], c.name, c.detail + (f"\nfix: {c.fix}" if c.fix else ""))
        console().print(grid)
        missing = sum(c.status == "missing" for c in report.checks)
        foreign = sum(c.status == "foreign" for c in report.checks)
        summary = f"{missing} missing" + (
            f", {foreign} not written by harnesslab" if foreign else ""
        )
        print("all set" if report.ok else summary, file=sys.stderr)
    return 0 if report.ok else 1


__all__ = ["cmd_doctor"]
