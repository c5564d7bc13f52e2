"""`harnesslab task list` and `task show` (the shipped tasks; one task's settings as parsed), and
`harnesslab task new` and `harnesslab task import-kernelbench`: a kernel task from the user's
own PyTorch reference (tools/authoring/task_new.py) or from KernelBench-format files
(tools/authoring/kernelbench.py), each checked once by running its baseline against its reference.
Every file gets a row (written and its baseline's outcome, or refused and why), printed as a
table or as JSON; the outcome is kept beside the task's task.toml for `harnesslab init`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harnesslab.tools.settings import Settings
from harnesslab.tools.task import list_tasks, load_task

from .cli_support import add_executor_args, command, run_async

if TYPE_CHECKING:
    from harnesslab.tools.authoring import TaskRow

# tools.authoring is imported by the commands that write tasks, not with the CLI: it loads torch
# (KernelBench's sizes run the user's file), ~2 s of every other command's start-up.


def _args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="task_command", metavar="ACTION", required=True)
    listed = sub.add_parser("list", help="the shipped tasks: name, kind, summary")
    listed.add_argument("--json", action="store_true", help="print the rows as JSON")
    show = sub.add_parser("show", help="one task's settings (a shipped name or a task folder)")
    show.add_argument("task", help="a task name or a task folder")
    show.add_argument("--json", action="store_true", help="print the settings as JSON")
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
    kb.add_argument(
        "--module-mode",
        choices=["train", "eval"],
        default="train",
        help="train (default): as KernelBench runs the Model (BatchNorm by the batch's "
        "statistics; a random op such as dropout is refused); eval: running statistics, "
        "dropout off",
    )
    kb.add_argument("--force", action="store_true", help="overwrite existing task folders")
    kb.add_argument("--no-check", action="store_true", help="skip the baseline runs")
    kb.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_executor_args(kb)


def _list(args: argparse.Namespace) -> int:
    rows = [load_task(name) for name in list_tasks()]
    if args.json:
        print(json.dumps([{"name": t.name, "kind": t.kind, "summary": t.summary} for t in rows]))
        return 0
    width = max(len(t.name) for t in rows)
    for t in rows:
        print(f"{t.name:<{width}}  {t.kind:<7}  {t.summary}")
    print("next: harnesslab task show NAME, or harnesslab init --task NAME -w WORKSPACE")
    return 0


def _show(args: argparse.Namespace) -> int:
    """task.toml as parsed: the fields it sets (a kind's own tables included), nothing else."""
    task = load_task(args.task)
    fields = task.model_dump(mode="json", exclude_defaults=True, exclude={"root"})
    if args.json:
        print(json.dumps({**fields, "root": str(task.root)}))
        return 0
    for key, value in fields.items():
        print(f"{key}: {value if isinstance(value, str) else json.dumps(value)}")
    print(f"folder: {task.root}")
    print(f"next: harnesslab init --task {args.task} -w WORKSPACE")
    return 0


def _new(args: argparse.Namespace, dtypes: list[str]) -> TaskRow:
    from harnesslab.tools.authoring import TaskRow, plan_new, write_task

    started = time.perf_counter()
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
        bytes_formula=args.bytes or "",
        flops_formula=args.flops or "",
    )
    folder = args.out or Path(args.name)
    task = write_task(plan, folder, force=args.force)
    return TaskRow(
        file=Path(args.reference.rpartition(":")[0]).name,
        task=task.name,
        status="written",
        folder=str(folder),
        seconds=round(time.perf_counter() - started, 3),
    )


def _check(rows: list[TaskRow], settings: Settings) -> None:
    """Each written task's baseline against its reference, kept in the task folder."""
    from harnesslab.tools.authoring import check_baselines, record_check

    written = [r for r in rows if r.status == "written"]
    results = run_async(check_baselines, [Path(r.folder) for r in written], settings)
    for row, result in zip(written, results, strict=True):
        if isinstance(result, str):
            row.baseline, row.failing = "failed", [result]
        else:
            row.baseline = "passed" if result.status == "passed" else "failed"
            row.failing = [f"{c.name}: {c.reason}" for c in result.cases if c.status != "passed"]
            if row.baseline == "failed" and not row.failing:
                row.failing = [result.reason or result.status]
        record_check(Path(row.folder), row.baseline, row.failing)


def _print_new(row: TaskRow) -> None:
    print(f"task {row.task} written to {row.folder}")
    if row.baseline == "passed":
        print("  baseline matches the reference on every dev case")
    elif row.baseline == "failed":
        print("  baseline FAILS: " + "; ".join(row.failing))
    else:
        print("  baseline not run (--no-check)")


def _print_table(rows: list[TaskRow]) -> None:
    width = min(48, max(len(r.file) for r in rows))
    for r in rows:
        if r.status == "refused":
            outcome, detail = "refused", r.reason
        elif r.baseline == "failed":
            outcome, detail = "baseline FAILS", "; ".join(r.failing[:2])
        elif r.baseline == "passed":
            outcome, detail = "baseline passes", r.folder
        else:
            outcome, detail = "written", f"{r.folder} (baseline not run)"
        print(f"{r.file[:width]:<{width}}  {outcome:<15}  {detail}")


def _summary(rows: list[TaskRow]) -> dict[str, int]:
    return {
        "files": len(rows),
        "written": sum(r.status == "written" for r in rows),
        "baseline_passes": sum(r.baseline == "passed" for r in rows),
        "baseline_fails": sum(r.baseline == "failed" for r in rows),
        "refused": sum(r.status == "refused" for r in rows),
    }


@command(
    "task",
    "List and show tasks (`task list`, `task show NAME`); make kernel tasks: `task new NAME "
    "--reference FILE.py:FN` from your own PyTorch function, "
    "`task import-kernelbench FILE.py|FOLDER` from KernelBench-format problems (one row per "
    "file: written and its baseline checked, or refused and why).",
    _args,
)
def cmd_task(args: argparse.Namespace, settings: Settings) -> int:
    if args.task_command in ("list", "show"):
        return _list(args) if args.task_command == "list" else _show(args)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.task_command == "new":
        rows = [_new(args, dtypes)]
    else:
        from harnesslab.tools.authoring import import_kernelbench

        rows = import_kernelbench(
            args.source, args.out, dtypes=dtypes, force=args.force, mode=args.module_mode
        )
    if args.no_check:
        for r in rows:
            r.baseline = "not run" if r.status == "written" else ""
    else:
        _check(rows, settings)
    totals = _summary(rows)
    ok = totals["written"] > 0 and not totals["baseline_fails"]
    if args.json:
        print(json.dumps({"status": "passed" if ok else "failed", "totals": totals,
                          "tasks": [r.model_dump() for r in rows]}))  # fmt: skip
        return 0 if ok else 1
    if args.task_command == "new":
        _print_new(rows[0])
    else:
        _print_table(rows)
    if len(rows) > 1:
        print(
            f"{totals['files']} files: {totals['written']} tasks written "
            f"({totals['baseline_passes']} baselines pass, {totals['baseline_fails']} fail), "
            f"{totals['refused']} refused"
        )
    good = [r for r in rows if r.baseline in ("passed", "not run")]
    if good and ok:
        print(f"next: harnesslab init --task {good[0].folder} -w WORKSPACE")
    elif totals["baseline_fails"]:
        print(
            "a task whose baseline fails its own check is kept for you to fix (see its task.md "
            "and the failing cases above); `harnesslab init` refuses it until a new check passes"
        )
    return 0 if ok else 1


__all__ = ["cmd_task"]
