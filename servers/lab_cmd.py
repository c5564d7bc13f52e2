"""`harnesslab lab`: the kernel lab. Runs every kernel task's strategies (baseline, reference
solutions, torch eager, torch.compile) over its matrix on the GPU (this machine or --gpu-host),
with correctness for every row, the runner's timing, Nsight Compute on the best strategy per
task, and writes report.md (with the claims ledger), results.csv, results.json and PNG plots
into --out. A step task (decode_step) gets the decode row: torch eager, torch.compile
(reduce-overhead) and its solutions over its traces, p50/p95 per bucket (tools/gpu/kernel_lab/lab_step.py). Without a GPU it runs on the Triton interpreter and the report says the numbers
are not meaningful; --from-results rebuilds a report from an earlier results.json.

Exit codes: 0 report written, 2 usage or environment error."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from harnesslab.tools.execution import build_launcher
from harnesslab.tools.lab import build_report
from harnesslab.tools.lab.matrix import LabOptions, load_results, run_lab
from harnesslab.tools.settings import Settings

from .cli_support import add_executor_args, command, run_async


def _lab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="folder for the report and results")
    p.add_argument("--tasks", help="comma-separated kernel or step tasks (default: all)")
    p.add_argument("--from-results", type=Path, help="build the report from this results.json")
    p.add_argument("--quick", action="store_true", help="smallest case + 4 claim cases per task")
    p.add_argument("--max-cases", type=int, default=0, help="first N matrix cases per task")
    p.add_argument("--repeats", type=int, default=3, help="measurements of each claim row (1..10)")
    p.add_argument("--no-ncu", action="store_true", help="skip Nsight Compute")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile strategy")
    p.add_argument("--tune", action="store_true", help="also time each solution's TUNE_SPACE")
    p.add_argument("--budget-s", type=float, default=330.0, help="GPU-side time budget")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    add_executor_args(p)


def _progress():
    """One line per measured row on stderr (with --json too: stdout holds only the JSON)."""

    def show(event: dict[str, Any]) -> None:
        if "strategy" in event:
            value = event.get("tflops") if event.get("tflops") else event.get("pct_of_copy_bw")
            print(f"  {event.get('task')} {event.get('case')} {event.get('strategy')}: "
                  f"{event.get('status')} {event.get('median_us') or 0:.1f} us ({value or 0:.0f})",
                  file=sys.stderr, flush=True)  # fmt: skip

    return show


@command("lab", "Kernel lab: benchmark matrix, correctness, ncu, claims ledger, report.", _lab_args)
def cmd_lab(args: argparse.Namespace, settings: Settings) -> int:
    if args.from_results:
        results = load_results(args.from_results)
    else:
        opts = LabOptions(
            tasks=[t.strip() for t in args.tasks.split(",")] if args.tasks else [],
            quick=args.quick,
            max_cases=args.max_cases,
            repeats=args.repeats,
            ncu=not args.no_ncu,
            compile=not args.no_compile,
            tune=args.tune,
            budget_s=args.budget_s,
        )

        async def go() -> dict[str, Any]:
            launcher = build_launcher(settings)
            try:
                return await run_lab(launcher, opts, args.out, on_progress=_progress())
            finally:
                await launcher.aclose()

        results = run_async(go)
    command_line = "harnesslab lab " + " ".join(shlex.quote(_portable(a)) for a in sys.argv[2:])
    summary = build_report(results, args.out, command=command_line)
    if args.json:
        print(summary.model_dump_json())
        return 0
    note = "" if summary.meaningful else "  (interpreter run: NOT MEANINGFUL for speed)"
    print(f"report: {args.out / 'report.md'}{note}")
    print("claims: " + ", ".join(f"{n} {k}" for k, n in summary.claims.items()))
    for line in summary.misses[:20]:
        print(f"  miss: {line}")
    if summary.plot_error:
        print(summary.plot_error, file=sys.stderr)
    print(f"files in {args.out}: {', '.join(summary.files)}")
    return 0


def _portable(arg: str) -> str:
    """A command-line argument as a committed report may show it: an absolute path outside the
    current folder names its file only (reports carry no paths of the machine they ran on)."""
    path = Path(arg)
    if not path.is_absolute():
        return arg
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return f".../{path.name}"
