"""Human-readable output for the CLI (rich, on stdout): tables that fit the terminal, reasons
written out in full under them, and scores compared only where the timings mean something.

- `fit_table` drops every column that holds nothing in any row, so an 80-column terminal keeps
  the columns that say something.
- A reason is never cut and never squeezed into a table cell: `print_reasons` writes each one
  under the table, wrapped at the terminal's width.
- `versus` is the one wording of a comparison: "1.62x slower than the best", never a signed
  percentage whose sign the reader has to decode.

Side of the trust boundary: presentation only (the operator's terminal); it decides nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from harnesslab.tools.evaluation import CaseResult, EvalResult

INTERPRETER_NOTE = "timings on the Triton interpreter are not meaningful; correctness is"
SAME_WITHIN = 0.005  # two scores within 0.5% of each other are "the same"
EMPTY = ("", "-")
SHORT = 14  # a column whose cells are all this short keeps them on one line
LONG_MIN = 12  # the narrowest a wrapping column gets
TIME_UNITS = ("us", "ms", "ns", "s", "cycles")  # scores where "faster"/"slower" fit
# Columns that only a GPU fills with something that means anything.
GPU_ONLY = ("p10-p90 us", "launch us", "GB/s", "% copy")


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def console() -> Console:
    """stdout at the terminal's width; piped output (CI logs, agents) at $COLUMNS when set,
    else 160 columns rather than 80 folded ones."""
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    # No markup: reasons and names are text from runs ("x[idx]" is not a style tag).
    return Console(width=160 if wide else None, highlight=False, markup=False)


def versus(
    value: float | None,
    ref: float | None,
    *,
    ref_name: str = "the best",
    higher_is_better: bool = False,
    timing: bool = True,
) -> str:
    """'1.62x slower than the best' / '1.20x faster than ...' / 'the same as ... (within 0.5%)'
    for times (lower is better); 'better'/'worse' for any other score. Scores that are not both
    positive compare by their difference instead of a ratio. '' when either is missing; with
    ref_name='' the phrase stops before "than" (a table column names the reference)."""
    if value is None or ref is None:
        return ""
    than = f" than {ref_name}" if ref_name else ""
    better = value > ref if higher_is_better else value < ref
    words = ("faster", "slower") if timing and not higher_is_better else ("better", "worse")
    word = words[0] if better else words[1]
    same = f"the same as {ref_name}" if ref_name else "the same"
    if value <= 0 or ref <= 0:
        return same if value == ref else f"{abs(value - ref):.4g} {word}{than}"
    ratio = max(value, ref) / min(value, ref)
    if ratio - 1 < SAME_WITHIN:
        return f"{same} (within {100 * SAME_WITHIN:.1f}%)"
    return f"{ratio:.2f}x {word}{than}"


class FitTable:
    """A table of the columns that hold something in at least one row ('' and '-' are
    nothing), laid out when printed, for the console's width: short columns (numbers,
    statuses) keep their cells on one line and the long ones share the rest, wrapping at
    spaces. The title is a line of its own above it (a rich title wraps at the table's width)."""

    def __init__(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        self.title = title
        cells = [[str(x) for x in r] for r in rows]
        keep = [i for i in range(len(columns)) if any(r[i] not in EMPTY for r in cells)] or [0]
        self.columns = [columns[i] for i in keep]
        self.rows = [[r[i] for i in keep] for r in cells]

    def widths(self, width: int) -> list[int]:
        n = range(len(self.columns))
        natural = [max([len(self.columns[i])] + [len(r[i]) for r in self.rows]) for i in n]
        least = [max([len(w) for w in self.columns[i].split()] + [len(r[i]) for r in self.rows])
                 for i in n]  # fmt: skip
        room = width - 3 * len(self.columns) + 1  # each cell's padding, one space between
        if sum(natural) <= room:
            return natural
        short = [i for i in n if least[i] <= SHORT]
        sizes = {i: least[i] for i in short}  # headers wrap before their cells do
        spare = room - sum(sizes.values())
        long = sorted((i for i in n if i not in sizes), key=natural.__getitem__)
        # Water-filling: the narrowest long columns get their natural width while it is no
        # more than an even share of what is left; the widest share the rest.
        for k, i in enumerate(long):
            sizes[i] = max(LONG_MIN, min(natural[i], spare // (len(long) - k)))
            spare -= sizes[i]
        return [sizes[i] for i in n]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.title:
            yield Text(self.title)
        # No vertical rules: at 80 columns the 2 characters per column go to the cells.
        t = Table(box=box.SIMPLE_HEAD, show_edge=False)
        for name, size in zip(self.columns, self.widths(options.max_width), strict=True):
            t.add_column(name, overflow="fold", width=size)
        for r in self.rows:
            t.add_row(*r)
        yield t


def fit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> FitTable:
    return FitTable(title, columns, rows)


def print_reasons(out: Console, reasons: Sequence[tuple[str, str]], heading: str = "") -> None:
    """Each (label, reason) under a table, in full: the reason wraps under itself."""
    if not reasons:
        return
    if heading:
        out.print(heading)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", max_width=32)
    grid.add_column(overflow="fold")
    for label, reason in reasons:
        grid.add_row(f"  {label}:" if label else " ", reason)
    out.print(grid)


def _shape(shape: dict[str, int]) -> str:
    return "x".join(str(v) for v in shape.values())


def eval_rows(result: EvalResult) -> tuple[list[str], list[list[str]]]:
    columns = ["case", "ran as", "status", "median us", *GPU_ONLY, "max abs err"]
    interpreted = not result.meaningful

    def row(c: CaseResult) -> list[str]:
        cells = [
            c.name,
            # The interpreter runs scaled-down shapes: name the one that ran.
            _shape(c.shape) if interpreted and c.status != "error" else "",
            c.status,
            _f(c.median_us, "{:.2f}"),
            "-" if c.p10_us is None else f"{c.p10_us:.2f}-{_f(c.p90_us, '{:.2f}')}",
            _f(c.launch_overhead_us, "{:.1f}"),
            _f(c.gbps, "{:.0f}"),
            _f(c.pct_of_copy_bw, "{:.0f}%"),
            _f(c.max_abs_err, "{:.2g}"),
        ]
        if interpreted:  # nothing a GPU-only column would show means anything here
            for name in GPU_ONLY:
                cells[columns.index(name)] = ""
        return cells

    return columns, [row(c) for c in result.cases]


def eval_table(result: EvalResult, title: str) -> FitTable:
    columns, rows = eval_rows(result)
    return fit_table(f"{title}: {result.status}, score {_f(result.score_us)} us", columns, rows)


def case_reasons(result: EvalResult) -> list[tuple[str, str]]:
    """Why the cases that did not pass failed (cases with one reason share a line), and the
    run's own reason when no case says it."""
    by_reason: dict[str, list[str]] = {}
    for c in result.cases:
        if c.reason:
            by_reason.setdefault(c.reason, []).append(c.name)
    out = []
    for reason, names in by_reason.items():
        label = ", ".join(names) if len(names) <= 2 else f"{len(names)} cases ({names[0]}, ...)"
        if len(names) == len(result.cases) > 2:
            label = f"all {len(names)} cases"
        out.append((label, reason))
    if result.reason and not any(result.reason.endswith(r) for _, r in out):
        out.insert(0, ("run", result.reason))
    return out


def print_eval(result: EvalResult, title: str = "eval", out: Console | None = None) -> None:
    out = out or console()
    out.print(eval_table(result, title))
    print_reasons(out, case_reasons(result), "reasons:")
    if not result.meaningful:
        out.print(INTERPRETER_NOTE)
    out.print(
        f"device: {result.env.device}  torch {result.env.torch}  triton {result.env.triton}  "
        f"candidate {result.candidate}"
    )
    # Scores compare only where timings mean something (never on the interpreter).
    if result.meaningful and result.score_us is not None and result.best_score_us is not None:
        out.print(
            f"{versus(result.score_us, result.best_score_us, ref_name='the best so far')} "
            f"({_f(result.best_score_us)} us)"
        )


def print_rows(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    console().print(fit_table(title, columns, rows))


__all__ = [
    "INTERPRETER_NOTE",
    "TIME_UNITS",
    "FitTable",
    "case_reasons",
    "console",
    "eval_table",
    "fit_table",
    "print_eval",
    "print_reasons",
    "print_rows",
    "versus",
]
