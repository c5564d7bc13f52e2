"""Human-readable tables for the CLI (rich, on stdout)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from harnesslab.tools.evaluation.results import EvalResult


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def eval_table(result: EvalResult, title: str) -> Table:
    note = "" if result.meaningful else "  [timings NOT meaningful: Triton CPU interpreter]"
    t = Table(
        title=f"{title}: {result.status}, score {_f(result.score_us)} us{note}",
        title_justify="left",
    )
    for col in (
        "case",
        "status",
        "median us",
        "p10-p90 us",
        "launch us",
        "GB/s",
        "% copy",
        "max abs err",
        "reason",
    ):
        t.add_column(col, overflow="fold")
    for c in result.cases:
        t.add_row(
            c.name,
            c.status,
            _f(c.median_us, "{:.2f}"),
            f"{_f(c.p10_us, '{:.2f}')}-{_f(c.p90_us, '{:.2f}')}",
            _f(c.launch_overhead_us, "{:.1f}"),
            _f(c.gbps, "{:.0f}"),
            _f(c.pct_of_copy_bw, "{:.0f}%"),
            _f(c.max_abs_err, "{:.2g}"),
            c.reason[:80],
        )
    return t


def console() -> Console:
    # Piped output (CI logs, agents) gets a wide table instead of 80 folded columns.
    return Console(width=None if sys.stdout.isatty() else 160)


def print_eval(result: EvalResult, title: str = "eval") -> None:
    console = globals()["console"]()
    console.print(eval_table(result, title))
    console.print(
        f"device: {result.env.device}  torch {result.env.torch}  triton {result.env.triton}  candidate {result.candidate}"
    )
    if result.delta_vs_best_pct is not None:
        console.print(
            f"vs best so far ({_f(result.best_score_us)} us): {result.delta_vs_best_pct:+.1f}%"
        )


def print_rows(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    console().print(t)
