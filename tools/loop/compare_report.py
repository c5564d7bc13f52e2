"""The report of `harnesslab compare`: its data (`CompareReport`, written as report.json by
loop/compare.py, read back by the dashboard) and, for people, markdown tables and a plot of every
trial's score per arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class Trial(BaseModel):
    arm: str
    index: int
    workspace: str
    run_id: str = ""
    valid: bool = False
    invalid_reason: str = ""
    score: float | None = None
    verdict: str = ""
    attempts: list[str] = Field(default_factory=list, description="attempt statuses")
    tool_calls: dict[str, int] = Field(default_factory=dict)
    harness_calls: int = Field(
        default=0, description="calls of generated servers' tools (not the task/meta servers)"
    )
    meaningful: bool | None = Field(
        default=False,
        description="whether its timings mean anything (None: its objective does not say)",
    )
    certifies: str = Field(default="", description="what its last verified score certifies")
    slot: str = Field(default="", description="the GPU slot its loop was scored on (host:gpuN)")
    wall_s: float = 0.0


class ArmSummary(BaseModel):
    arm: str
    runner: str
    harnessed: bool
    servers: list[str] = Field(default_factory=list)
    trials: int
    valid: int
    invalid: int
    median: float | None = None
    p10: float | None = None
    p90: float | None = None
    best: float | None = None
    worst: float | None = None
    tool_calls_median: float | None = None
    harness_calls_median: float | None = None


class CompareReport(BaseModel):
    task: str
    case_set: str
    score_key: str
    unit: str
    higher_is_better: bool
    meaningful: bool | None = None
    config: dict[str, Any]
    arms: list[ArmSummary]
    difference: dict[str, Any] = Field(
        default_factory=dict,
        description="median(B) - median(A) with a bootstrap 95% interval, and which is better",
    )
    trials: list[Trial]
    wall_s: float = 0.0
    files: dict[str, str] = Field(default_factory=dict)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.6g}"


def difference_line(r: CompareReport, *, bold: bool = False, numbers: bool = True) -> str:
    """median(B) - median(A) with its interval and verdict; on meaningless timings (the Triton
    interpreter) no winner is claimed, and with numbers=False no figure either."""
    d = r.difference
    of = f"**{d.get('of', 'difference')}**" if bold else d.get("of", "difference")
    if r.meaningful is False and not numbers:
        return f"{of}: not compared, the timings are not meaningful (no GPU)"
    ci = d.get("ci95")
    verdict = d.get("verdict", "")
    if r.meaningful is False and d.get("value") is not None:
        verdict = "no verdict: the timings are not meaningful (no GPU)"
    return (
        f"{of}: {_f(d.get('value'))}"
        + (f" (95% bootstrap interval {_f(ci[0])} .. {_f(ci[1])})" if ci else "")
        + f" - {verdict}"
    )


def markdown(r: CompareReport) -> str:
    better = "higher" if r.higher_is_better else "lower"
    unit = f" ({r.unit})" if r.unit else ""
    lines = [
        f"# harnesslab compare: {r.task}",
        "",
        f"Score: `{r.score_key}`{unit}, {better} is better, each trial verified by the guarded "
        f"path on one hidden case set (`{r.case_set or '-'}`) shared by every trial."
        + (" Timings are NOT meaningful (no GPU)." if r.meaningful is False else ""),
        "",
        "| arm | runner | generated servers | trials | valid | invalid | median | p10 | p90 "
        "| best | median tool calls | median harness calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in r.arms:
        lines.append(
            f"| {a.arm} | {a.runner} | {', '.join(a.servers) or '-'} | {a.trials} | {a.valid} | "
            f"{a.invalid} | {_f(a.median)} | {_f(a.p10)} | {_f(a.p90)} | {_f(a.best)} | "
            f"{_f(a.tool_calls_median)} | {_f(a.harness_calls_median)} |"
        )
    lines += [
        "",
        difference_line(r, bold=True),
        "",
        "## Trials",
        "",
        "| arm | # | valid | score | verdict | attempts | tool calls | harness calls | wall s "
        "| why invalid |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in r.trials:
        lines.append(
            f"| {t.arm} | {t.index} | {'yes' if t.valid else 'no'} | {_f(t.score)} | {t.verdict} "
            f"| {', '.join(t.attempts)} | {sum(t.tool_calls.values())} | {t.harness_calls} | "
            f"{t.wall_s:.0f} | {t.invalid_reason} |"
        )
    lines += ["", f"Wall time {r.wall_s:.0f} s. Trial workspaces: `trials/<arm>-<n>/`.", ""]
    return "\n".join(lines)


def plot(r: CompareReport, path: Path) -> Path | None:
    """Every valid trial's score per arm (dots) with the arm's median (bar); None without
    matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415 - optional extra, and slow to import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 4), dpi=100)
    try:
        for i, arm in enumerate(r.arms):
            ys = [t.score for t in r.trials if t.arm == arm.arm and t.valid and t.score is not None]
            xs = [i + 0.08 * (j - (len(ys) - 1) / 2) for j in range(len(ys))]
            ax.plot(xs, ys, "o", alpha=0.7, label=f"{arm.arm} ({arm.valid}/{arm.trials} valid)")
            if arm.median is not None:
                ax.hlines(arm.median, i - 0.25, i + 0.25, colors="black")
        ax.set_xticks(range(len(r.arms)), [a.arm for a in r.arms])
        unit = f" ({r.unit})" if r.unit else ""
        better = "higher" if r.higher_is_better else "lower"
        ax.set_ylabel(f"{r.score_key}{unit}, {better} is better")
        ax.set_title(f"{r.task}: verified score per trial")
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


__all__ = ["difference_line", "markdown", "plot"]
