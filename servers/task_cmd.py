"""`harnesslab task new` and `harnesslab task import-kernelbench`: a kernel task from the user's
own PyTorch reference (tools/task/scaffold.py) or from KernelBench-format files
(tools/task/kernelbench.py), each checked once by running its baseline against its reference."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harnesslab.tools.evaluation.baseline_check import check_baseline
from harnesslab.tools.evaluation.results import EvalResult
from harnesslab.tools.settings import Settings
from harnesslab.tools.task.kernelbench import import_kernelbench
from harnesslab.tools.task.scaffold import write_task
from harnesslab.tools.task.task_new import plan_new

from .cli_support import add_executor_args, command, run_async


def _args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="task_command", metavar="ACTION", required=True)
    new = sub.add_parser("new", help="a task folder from FILE.py:FUNCTION, a PyTorch reference")
    new.add_argument("name", help="task name (lowercase letters, digits, _ and -)")
    new.add_argument("--reference", required=True, help="FILE.py:FUNCTION, the PyTorch reference")
    new.add_argument(
        "--kernel", help="FILE.py:FUNCTION, your kernel as the baseline (default: the reference)"
    )
    new.add_argument(
        "--input",
        action="append",
        default=[],
        help="NAME:DIM,DIM[:DTYPE] per tensor input, in call order",
    )
    new.add_argument("--dims", action="append", default=[], help="dev sizes, DIM=SIZE[,DIM=SIZE]")
    new.add_argument("--scalar", action="append", default=[], help="keyword argument NAME=VALUE")
    new.add_argument(
        "--example", help="FILE.py:FN returning example arguments (instead of --input/--dims)"
    )
    new.add_argument(
        "--dtypes", default="float16,float32", help="case dtypes (default float16,float32)"
    )
    new.add_argument(
        "--bytes", help="bytes moved per call over the dims and dtype_bytes (default: derived)"
    )
    new.add_argument("--flops", help="flops per call over the dims, e.g. '2*m*n*k'")
    new.add_argument(
        "--range",
        action="append",
        default=[],
        help="hidden final sizes DIM=MIN:MAX (default: half to twice the dev size)",
    )
    new.add_argument(
        "--knob", action="append", default=[], help="launch knob NAME=V1,V2,... for sweeps"
    )
    new.add_argument("--out", type=Path, help="task folder (default ./NAME)")
    new.add_argument("--force", action="store_true", help="write into a non-empty folder")
    new.add_argument("--no-check", action="store_true", help="skip the baseline run")
    new.add_argument("--json", action="store_true", help="print the result as JSON")
    add_executor_args(new)
    kb = sub.add_parser("import-kernelbench", help="KernelBench-format file(s) as kernel tasks")
    kb.add_argument("source", type=Path, help="a KernelBench .py file or a folder of them")
    kb.add_argument("--out", type=Path, required=True, help="folder the task folders go in")
    kb.add_argument("--dtypes", default="float32", help="case dtypes (default float32)")
    kb.add_argument("--force", action="store_true", help="overwrite existing task folders")
    kb.add_argument("--no-check", action="store_true", help="skip the baseline runs")
    kb.add_argument("--json", action="store_true", help="print the result as JSON")
    add_executor_args(kb)


def _report(folder: Path, name: str, result: EvalResult | None, as_json: bool) -> dict:
    row: dict = {"task": name, "folder": str(folder)}
    if result is not None:
        failing = [f"{c.name}: {c.reason}" for c in result.cases if c.status != "passed"]
        row.update(baseline=result.status, failing=failing, reason=result.reason)
    if not as_json:
        print(f"task {name} written to {folder}")
        if result is None:
            print("  baseline not run (--no-check)")
        elif result.status == "passed":
            print("  baseline matches the reference on every dev case")
        else:
            print(f"  baseline {result.status}: " + ("; ".join(failing) or result.reason))
        print(f"  next: harnesslab init --task {folder} -w WORKSPACE")
    return row


@command(
    "task",
    "Make kernel tasks: `task new NAME --reference FILE.py:FN` from your own PyTorch function, "
    "`task import-kernelbench FILE.py|FOLDER` from KernelBench-format problems.",
    _args,
)
def cmd_task(args: argparse.Namespace, settings: Settings) -> int:
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.task_command == "new":
        plan = plan_new(
            args.name,
            args.reference,
            kernel=args.kernel,
            inputs=args.input,
            dims=args.dims,
            scalars=args.scalar,
            example=args.example,
            dtypes=dtypes,
            knobs=args.knob,
            ranges=args.range,
        )
        plan = plan.model_copy(
            update={"bytes_formula": args.bytes or "", "flops_formula": args.flops or ""}
        )
        folder = args.out or Path(args.name)
        write_task(plan, folder, force=args.force)
        written = [(folder, plan.name)]
    else:
        written = [
            (t.root, t.name)
            for t in import_kernelbench(args.source, args.out, dtypes=dtypes, force=args.force)
        ]
    rows, ok = [], True
    for folder, name in written:
        result = None if args.no_check else run_async(check_baseline, folder, settings)
        ok = ok and (result is None or result.status == "passed")
        rows.append(_report(folder, name, result, args.json))
    if args.json:
        print(json.dumps({"status": "passed" if ok else "failed", "tasks": rows}))
    return 0 if ok else 1


__all__ = ["cmd_task"]
