"""`harnesslab eval` and `harnesslab verify` on a command task: the dev objective and the final
one (tools/evaluation/command.py, tools/integrity/command_verify.py), printed with the task's own score key,
unit and direction. A verdict shows what guarded_final_verify shows an agent unless the operator
asks for more with --reveal-cases (the hidden cases and the objective's output)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from harnesslab.tools.evaluation.command import CommandRun, run_command_objective
from harnesslab.tools.execution import build_launcher
from harnesslab.tools.integrity.command_verify import CommandVerdict, command_verify
from harnesslab.tools.integrity.verdict_view import public_command_verdict
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import Workspace
from harnesslab.tools.state.storage import read_jsonl
from harnesslab.tools.task import kind_of

from .cli_progress import CliProgress
from .cli_support import run_async
from .report import TIME_UNITS, console, fit_table, print_reasons, versus


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _meaningful(m: bool | None) -> str:
    if m is None:
        return "the objective does not say whether its timings are meaningful"
    return "timings meaningful" if m else "timings NOT meaningful (the objective says so)"


def eval_command(ws: Workspace, args: argparse.Namespace, settings: Settings) -> int:
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else None

    async def go(progress: CliProgress) -> CommandRun:
        launcher = build_launcher(settings)
        try:
            return await run_command_objective(
                ws,
                launcher,
                warmup=args.warmup,
                repeats=args.repeats,
                cases=cases,
                progress=progress,
            )
        finally:
            await launcher.aclose()

    with CliProgress("eval") as progress:
        run = run_async(go, progress)
    if args.json:
        print(run.model_dump_json())
        return 0 if run.status == "passed" else 1
    label = kind_of(ws.task).score_label(ws.task, "dev")
    out = console()
    title = f"eval (dev objective): {run.status}, {run.score_key} {_f(run.score)} {run.unit}"
    rows = [
        ["score", f"{_f(run.score)} ({label})"],
        ["timings", _meaningful(run.meaningful)],
        ["exit", f"{run.exit_code}{' (timed out)' if run.timed_out else ''} in {run.wall_s:.1f}s"],
        ["sandbox", run.sandbox],
        ["candidate", run.candidate],
    ]
    out.print(fit_table(title.rstrip(), ["", "value"], rows))
    print_reasons(out, [("reason", run.reason)] if run.reason else [])
    if run.meaningful is not False and run.score is not None:  # never on meaningless timings
        vs = versus(
            run.score,
            run.best_score,
            ref_name="the best so far",
            higher_is_better=run.higher_is_better,
            timing=run.unit in TIME_UNITS,
        )
        if vs:
            out.print(f"{vs} ({_f(run.best_score)} {run.unit})".replace(" )", ")"))
    return 0 if run.status == "passed" else 1


def verify_command(ws: Workspace, args: argparse.Namespace, settings: Settings) -> int:
    async def go(progress: CliProgress) -> CommandVerdict:
        launcher = build_launcher(settings)
        try:
            return await command_verify(
                ws, launcher, settings, rotate=args.rotate, progress=progress
            )
        finally:
            await launcher.aclose()

    with CliProgress("verify") as progress:
        v = run_async(go, progress)
    hidden = _hidden_record(ws, v.record_id) if args.reveal_cases else None
    if args.json:
        shown = public_command_verdict(v)
        if hidden is not None:  # the operator's: the whole verdict and what the store kept
            shown = {**v.model_dump(mode="json"), "hidden": hidden}
        print(json.dumps(shown))
        return 0 if v.verdict == "passed" else 1
    out = console()
    cases = f"{v.hidden_cases} hidden cases" if v.hidden_cases else "the objective's own cases"
    out.print(
        f"verify (final objective, {cases}, set {v.case_set}): {v.verdict}, "
        f"{v.score_key} {_f(v.score)} {v.unit}".rstrip()
    )
    out.print(f"score: {v.score_label()}; {_meaningful(v.meaningful)}; sandbox {v.sandbox}")
    vs = versus(
        v.score,
        v.best_final_score,
        ref_name="the best final score before",
        higher_is_better=v.higher_is_better,
        timing=v.unit in TIME_UNITS,
    )
    if vs and v.meaningful is not False:  # never on meaningless timings
        new = ": a new best" if v.is_new_best else ""
        out.print(f"{vs} ({_f(v.best_final_score)} {v.unit}".rstrip() + f"){new}")
    print(f"verdict: {v.verdict}")
    for r in [*v.reasons, *v.warnings]:
        print(f"  {r['code']}: {r['detail']}")
    if hidden is not None:
        print("hidden cases and output (OPERATOR ONLY):")
        print(json.dumps(hidden, indent=1)[:20000])
    return 0 if v.verdict == "passed" else 1


def _hidden_record(ws: Workspace, record_id: str | None) -> dict[str, Any] | None:
    for rec in reversed(list(read_jsonl(ws.store.hidden_results_path))):
        if rec.get("record") == record_id:
            return rec
    return None


__all__ = ["eval_command", "verify_command"]
