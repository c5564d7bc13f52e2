"""The kernel lab's report from one results.json: report.md, results.csv, two PNG plots per task
(bandwidth, TFLOP/s or, for a step task, p50 step latency per case and strategy; speedup over
torch eager) and the claims ledger.

Everything here reads the results dict only, so a report can be rebuilt from an old run
(`harnesslab lab --from-results FILE`). Plots use matplotlib's Agg canvas (no display, no
pyplot state).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from . import claims as lab_claims
from .claims import Claim, claims_ledger, counts, ncu_case

EAGER = "torch_eager"
CSV_COLUMNS = (
    "task", "strategy", "case", "dtype", "shape", "passed", "status", "median_us", "p10_us",
    "p90_us", "p95_us", "p99_us", "tokens_per_s", "spread", "repeats", "repeat_spread", "host_us", "launch_overhead_us", "gbps",
    "pct_of_copy_bw", "tflops", "speedup_vs_torch_eager", "timing_method", "reason",
)  # fmt: skip


class ReportSummary(BaseModel):
    out_dir: Path
    meaningful: bool
    files: list[str] = Field(description="files written, relative to out_dir")
    claims: dict[str, int] = Field(description="claims per status")
    misses: list[str] = Field(description="targets missed or not shown, one line each")
    plot_error: str = ""


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _shape(shape: dict[str, int]) -> str:
    return "x".join(f"{k}{v}" if len(shape) > 2 else str(v) for k, v in shape.items())


def speedup(rows: list[dict[str, Any]], row: dict[str, Any]) -> float | None:
    eager = next((r for r in rows if (r["task"], r["case"], r["strategy"]) ==
                  (row["task"], row["case"], EAGER)), None)  # fmt: skip
    if not eager or not eager.get("passed") or not row.get("passed"):
        return None
    if eager.get("median_us") and row.get("median_us"):
        return eager["median_us"] / row["median_us"]
    return None


def write_csv(results: dict[str, Any], path: Path) -> None:
    rows = results["rows"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "shape": _shape(r["shape"]),
                        "repeats": len(r.get("repeat_medians_us") or []),
                        "speedup_vs_torch_eager": speedup(rows, r)})  # fmt: skip


# Per metric: (the value a cell shows beside the time, its unit, the perf plot's value and unit).
# A step task's rows ("latency") have no bytes or FLOPs: p95 beside the p50, p50 plotted.
METRICS = {
    "tflops": ("tflops", " TFLOP/s", "tflops", "TFLOP/s"),
    "latency": ("p95_us", " us p95", "median_us", "p50 us per step"),
}
BANDWIDTH = ("pct_of_copy_bw", "%", "gbps", "GB/s")


def metric_of(task: dict[str, Any]) -> tuple[str, str, str, str]:
    return METRICS.get(task.get("metric", ""), BANDWIDTH)


def _metric(task: dict[str, Any], row: dict[str, Any]) -> float | None:
    if not row.get("passed"):
        return None
    return row.get(metric_of(task)[2])


def perf_top(values: list[float], copy_gbps: float | None) -> float:
    """The perf plot's y limit: room above the highest point and above the copy line (it sat on
    the top border, where it could not be told from the frame)."""
    highest = max([*values, copy_gbps or 0.0, 0.0])
    return highest * 1.12 if highest > 0 else 1.0


def write_plots(results: dict[str, Any], out: Path) -> list[str]:
    """<task>_perf.png and <task>_speedup.png per task; returns the file names."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    files = []
    copy_gbps = results["info"].get("copy_gbps")
    for name, task in results["tasks"].items():
        rows = [r for r in results["rows"] if r["task"] == name]
        cases = task["cases"]
        x = list(range(len(cases)))
        for kind in ("perf", "speedup"):
            fig = Figure(figsize=(max(6.0, 1.1 * len(cases) + 2), 4.2))
            FigureCanvasAgg(fig)
            ax = fig.add_subplot(1, 1, 1)
            strategies = [s for s in task["strategies"] if kind == "perf" or s != EAGER]
            width = 0.8 / max(1, len(strategies))
            plotted: list[float] = []
            for i, s in enumerate(strategies):
                by_case = {r["case"]: r for r in rows if r["strategy"] == s}
                if kind == "perf":
                    ys = [_metric(task, by_case[c]) if c in by_case else None for c in cases]
                    plotted += [y for y in ys if y is not None]
                    ax.plot(x, [math.nan if y is None else y for y in ys], marker="o", label=s)
                else:
                    ys = [speedup(rows, by_case[c]) if c in by_case else None for c in cases]
                    ax.bar([xi + (i - (len(strategies) - 1) / 2) * width for xi in x],
                           [0.0 if y is None else y for y in ys], width, label=s)  # fmt: skip
            if kind == "perf":
                unit = metric_of(task)[3]
                copy_line = copy_gbps if metric_of(task) == BANDWIDTH and copy_gbps else None
                if copy_line:
                    ax.axhline(copy_line, color="gray", linestyle="--", label="1 GiB copy")
                ax.set_ylim(0, perf_top(plotted, copy_line))
                ax.set_ylabel(unit)
                better = "lower" if task["metric"] == "latency" else "higher"
                ax.set_title(f"{name}: {unit} per case ({better} is better)")
            else:
                ax.axhline(1.0, color="gray", linestyle="--")
                ax.set_ylabel(f"speedup over {EAGER}")
                ax.set_title(f"{name}: speedup over PyTorch eager (time ratio)")
            ax.set_xticks(x)
            ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=8)
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            if not results["info"].get("meaningful"):
                ax.set_title(
                    ax.get_title() + "\nNOT MEANINGFUL: Triton CPU interpreter", fontsize=9
                )
            fig.tight_layout()
            fname = f"{name}_{kind}.png"
            fig.savefig(out / fname, dpi=110)
            files.append(fname)
    return files


def _cell(task: dict[str, Any], row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if not row.get("passed"):
        reason = (row.get("reason") or "").removeprefix(f"{row.get('status')}: ")
        return f"{row.get('status')}: {reason[:40]}"
    key, unit = metric_of(task)[:2]
    return f"{_f(row.get('median_us'))} us ({_f(row.get(key), '{:.0f}')}{unit})"


def task_section(
    results: dict[str, Any], name: str, task: dict[str, Any], plots: list[str]
) -> list[str]:
    rows = [r for r in results["rows"] if r["task"] == name]
    by = {(r["case"], r["strategy"]): r for r in rows}
    metric = {"tflops": "TFLOP/s", "latency": "p95 step latency; the case is trace:bucket"}.get(
        task["metric"], "% of copy bandwidth"
    )
    lines = [f"## {name}", "", f"Best harnesslab strategy: `{task.get('best_strategy')}`. Cells: "
             f"median device time ({metric}); speedup = torch eager time / strategy time.", ""]  # fmt: skip
    strategies = task["strategies"]
    lines += ["| case | " + " | ".join(strategies) + " | best speedup |",
              "|---" * (len(strategies) + 2) + "|"]  # fmt: skip
    for case in task["cases"]:
        cells = [_cell(task, by.get((case, s))) for s in strategies]
        ups = [u for s in strategies if s.startswith(("baseline", "sol:")) and (case, s) in by
               and (u := speedup(rows, by[(case, s)])) is not None]  # fmt: skip
        lines.append(
            f"| {case} | " + " | ".join(cells) + f" | {_f(max(ups) if ups else None, '{:.2f}x')} |"
        )
    errors = task.get("strategy_errors") or {}
    lines += [""] + [f"- `{s}`: {e}" for s, e in errors.items()] + [""] * bool(errors)
    lines += [f"![{p}]({p})" for p in plots if p.startswith(f"{name}_")] + [""]
    nc = results.get("ncu", {}).get(name)
    if nc:
        lines += [f"### Nsight Compute: `{nc.get('strategy')}`", ""]
        if nc.get("error"):
            lines += [f"Not available: {nc['error']}", ""]
        lines += ["| case | ncu us | runner us | DRAM busy % | DRAM GB/s | runner GB/s | "
                  "warps active % | tensor pipe % |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for case in nc.get("by_case") or {}:
            m = ncu_case(results, name, nc["strategy"], case)
            r = by.get((case, nc["strategy"])) or {}
            lines.append(f"| {case} | {_f(m.get('time_us'))} | {_f(r.get('median_us'))} | "
                         f"{_f(m.get('dram_pct'), '{:.0f}')} | {_f(m.get('dram_gbps'), '{:.0f}')} | "
                         f"{_f(r.get('gbps'), '{:.0f}')} | {_f(m.get('warps_active_pct'), '{:.0f}')} | "
                         f"{_f(m.get('tensor_pct'), '{:.0f}')} |")  # fmt: skip
        lines.append("")
    return lines


def peers_section(results: dict[str, Any]) -> list[str]:
    """Our best kernel against what users would pick instead, per task and case: % of copy
    bandwidth (or TFLOP/s) and the time ratio over torch.compile and every peer (> 1: ours is
    faster). A peer that is missing or failed correctness is shown as such, never left out."""
    lines = ["## Against the kernels users would pick instead", "",
             "Ratio = the other kernel's median time / the best harnesslab strategy's (> 1.00x: "
             "harnesslab is faster); claim cases use the median of their repeated measurements. "
             "Peers: production kernels timed by the same protocol with correctness per row.", ""]  # fmt: skip
    for name, task in results.get("tasks", {}).items():
        best = task.get("best_strategy")
        others = [s for s in task.get("strategies", []) if s == "torch_compile"]
        others += [s for s in task.get("strategies", []) if s.startswith("peer:")]
        peers = task.get("peers") or {}
        lines += [f"### {name}", ""]
        for peer, info in peers.items():
            state = info.get("status")
            detail = f": {info.get('reason')}" if info.get("reason") else ""
            lines.append(f"- `{peer}` ({info.get('package')}): **{state}**{detail}")
        if not peers:
            lines.append("- no peers declared (reference.PEERS)")
        lines.append("")
        if best is None:
            lines += ["No harnesslab strategy passed every case: no ratios.", ""]
            continue
        key, unit = metric_of(task)[:2]
        lines += [f"| case | {best} us | {unit.strip()} | " + " | ".join(f"vs {o}" for o in others) + " |",
                  "|---" * (3 + len(others)) + "|"]  # fmt: skip
        for case in task.get("cases", []):
            mine = lab_claims.row_of(results, name, best, case)
            mine_us = lab_claims.time_of(mine) if mine and mine.get("passed") else None
            value = (mine or {}).get(key)
            cells = []
            for o in others:
                row = lab_claims.row_of(results, name, o, case)
                other_us = lab_claims.time_of(row) if row and row.get("passed") else None
                if row is None:
                    cells.append("-")
                elif other_us is None:
                    cells.append(str(row.get("status")))
                elif mine_us:
                    cells.append(f"{other_us / mine_us:.2f}x")
                else:
                    cells.append("-")
            lines.append(
                f"| {case} | {_f(mine_us)} | {_f(value, '{:.0f}')} | " + " | ".join(cells) + " |"
            )
        lines.append("")
    return lines


CUDA = "sol:cuda_"  # the lab names a task's CUDA C++ solution by its file: solutions/cuda_*.py
TIE = 0.01  # ratios within 1% of 1.00x: neither language leads


def languages_section(results: dict[str, Any]) -> list[str]:
    """CUDA C++ against Triton per task and case: the fastest passing harnesslab strategy of
    each language (CUDA: solutions/cuda_*.py; Triton: the baseline and every other solution),
    their time ratio (Triton us / CUDA us: > 1.00x, CUDA is faster) and which leads. Tasks with
    no CUDA strategy are left out."""
    lines: list[str] = []
    for name, task in results.get("tasks", {}).items():
        mine = [s for s in task.get("strategies", []) if s.startswith(("baseline", "sol:"))]
        cuda = [s for s in mine if s.startswith(CUDA)]
        if not cuda:
            continue
        triton = [s for s in mine if not s.startswith(CUDA)]
        lines += [f"### {name}", "", "| case | CUDA us | Triton us | Triton / CUDA | leads |",
                  "|---|---|---|---|---|"]  # fmt: skip
        leads = {"CUDA": 0, "Triton": 0, "neither": 0}
        for case in task.get("cases", []):
            (c_us, c_s), (t_us, t_s) = (_fastest(results, name, g, case) for g in (cuda, triton))
            if c_us is None or t_us is None:
                lines.append(f"| {case} | {_f(c_us)} | {_f(t_us)} | - | - |")
                continue
            ratio = t_us / c_us
            who = "neither" if abs(ratio - 1.0) <= TIE else ("CUDA" if ratio > 1.0 else "Triton")
            leads[who] += 1
            lines.append(f"| {case} | {_f(c_us)} (`{c_s}`) | {_f(t_us)} (`{t_s}`) | "
                         f"{ratio:.2f}x | {who} |")  # fmt: skip
        lines += ["", f"CUDA leads {leads['CUDA']}, Triton {leads['Triton']}, neither (within "
                  f"{100 * TIE:.0f}%) {leads['neither']} of the cases both passed.", ""]  # fmt: skip
    if not lines:
        return []
    return ["## CUDA C++ against Triton", "",
            "Per case, the fastest passing harnesslab strategy of each kernel language (claim "
            "cases: the median of their repeated measurements).", "", *lines]  # fmt: skip


def _fastest(
    results: dict[str, Any], task: str, strategies: list[str], case: str
) -> tuple[float | None, str]:
    best: tuple[float | None, str] = (None, "")
    for s in strategies:
        row = lab_claims.row_of(results, task, s, case)
        t = lab_claims.time_of(row) if row and row.get("passed") else None
        if t and (best[0] is None or t < best[0]):
            best = (t, s)
    return best


def launch_section(results: dict[str, Any]) -> list[str]:
    rows = [
        r for r in results["rows"] if r.get("timing_method") == "cuda_graph" and r.get("passed")
    ]
    lines = ["## Launch-bound cases: device time apart from host launch overhead", "",
             "Cases too short to time one call at a time are timed as CUDA-graph replays of "
             "back-to-back calls (device time); one eager call from Python, with the GPU idle, "
             "is timed apart (host us). Launch overhead = host - device.", ""]  # fmt: skip
    if not rows:
        return [*lines, "No launch-bound cases in this run.", ""]
    lines += ["| task | case | strategy | device us | host us per call | launch overhead us |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['task']} | {r['case']} | {r['strategy']} | {_f(r['median_us'], '{:.2f}')} | "
                     f"{_f(r.get('host_us'))} | {_f(r.get('launch_overhead_us'))} |")  # fmt: skip
    return [*lines, ""]


def tuning_section(results: dict[str, Any]) -> list[str]:
    tuning = [t for t in results.get("tuning") or [] if t.get("passed") and t.get("median_us")]
    if not tuning:
        return []
    lines = ["## Tuning (solutions' TUNE_SPACE variants)", "",
             "| task | strategy | case | config | median us | % copy | TFLOP/s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in sorted(tuning, key=lambda t: (t["task"], t["strategy"], t["case"], t["median_us"])):
        lines.append(f"| {t['task']} | {t['strategy']} | {t['case']} | `{t['config']}` | "
                     f"{_f(t['median_us'])} | {_f(t.get('pct_of_copy_bw'), '{:.0f}')} | "
                     f"{_f(t.get('tflops'), '{:.0f}')} |")  # fmt: skip
    return [*lines, ""]


def claims_section(claims: list[Claim]) -> list[str]:
    lines = ["## Claims ledger", "",
             f"A claim is **supported** only with correctness passed, >= {lab_claims.MIN_REPEATS} "
             f"measurements with spread < {100 * lab_claims.MAX_SPREAD:.0f}%, and a matching ncu "
             f"counter (kernel time within {100 * lab_claims.NCU_TIME_TOL:.0f}% of the runner's "
             f"median; for bandwidth claims DRAM busy >= {lab_claims.NCU_DRAM_MIN_PCT:.0f}%). "
             "Otherwise it is caveated, rejected or pending, with the reason.", "",
             "| # | status | claim | target | reason |", "|---|---|---|---|---|"]  # fmt: skip
    for i, c in enumerate(claims, 1):
        lines.append(f"| {i} | **{c.status}** | {c.statement} | {c.target} | {c.reason or '-'} |")
    return [*lines, ""]


def misses(claims: list[Claim]) -> list[str]:
    return [f"{c.task}: {c.strategy} on {c.case} ({c.target}): {c.status}, {c.reason}"
            for c in claims if c.status in ("rejected", "pending")]  # fmt: skip


def build_report(results: dict[str, Any], out: Path, *, command: str = "") -> ReportSummary:
    """Write report.md, results.csv, results.json and the plots into `out`; return what was
    written. results.json is always there, so every report can be rebuilt from its folder
    (`harnesslab lab --from-results OUT/results.json`)."""
    out.mkdir(parents=True, exist_ok=True)
    info = results.get("info", {})
    meaningful = bool(info.get("meaningful"))
    write_csv(results, out / "results.csv")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    files = ["report.md", "results.csv", "results.json"]
    plot_error = ""
    try:
        plots = write_plots(results, out)
    except ImportError as exc:  # matplotlib is the optional "plots" extra
        plots, plot_error = [], f"plots not drawn: {exc} (pip install 'harnesslab[plots]')"
    files += plots
    claims = claims_ledger(results)
    missed = misses(claims)
    lines = [f"# Kernel lab report, {info.get('date', '?')}", ""]
    if not meaningful:
        lines += ["> **NOT MEANINGFUL: this run used the Triton CPU interpreter (no GPU).** "
                  "Correctness counts; every timing, bandwidth, speedup and claim below says "
                  "nothing about GPU speed. Run `harnesslab lab` with a GPU (or --gpu-host).", ""]  # fmt: skip
    if info.get("incomplete"):
        lines += [f"> Incomplete run: {info['incomplete']}", ""]
    lines += [f"Device: {info.get('device')} (driver {info.get('driver')}), torch {info.get('torch')}, "
              f"triton {info.get('triton')}, CUDA {info.get('cuda')}, host {info.get('host')}. "
              f"Copy bandwidth (1 GiB device copy, same timing): {_f(info.get('copy_gbps'), '{:.0f}')} GB/s. "
              f"Lab wall time {_f(results.get('wall_s'), '{:.0f}')} s.", ""]  # fmt: skip
    if command:
        lines += [f"Command: `{command}`", ""]
    c = counts(claims)
    lines += ["## Summary", "", "| task | best strategy | claims (supported / caveated / rejected / pending) |",
              "|---|---|---|"]  # fmt: skip
    for name, task in results.get("tasks", {}).items():
        k = counts([x for x in claims if x.task == name])
        lines.append(f"| {name} | `{task.get('best_strategy')}` | {k['supported']} / {k['caveated']} / "
                     f"{k['rejected']} / {k['pending']} |")  # fmt: skip
    lines += ["", f"All claims: {c['supported']} supported, {c['caveated']} caveated, "
              f"{c['rejected']} rejected, {c['pending']} pending.", ""]  # fmt: skip
    lines += claims_section(claims)
    lines += (
        ["## Misses against the targets", ""] + ([f"- {m}" for m in missed] or ["None."]) + [""]
    )
    lines += peers_section(results) + languages_section(results)
    for name, task in results.get("tasks", {}).items():
        lines += task_section(results, name, task, plots)
    lines += launch_section(results) + tuning_section(results)
    if plot_error:
        lines += [plot_error, ""]
    lines += ["## Method", "",
              "Every row: fresh random inputs, correctness against the fp32 reference with the "
              "task's per-dtype tolerance (NaN/Inf fail), then the runner's one timing protocol: "
              "cases that take >= 15 us at copy speed are timed one call per sample from a clean "
              "L2 (30 samples); shorter ones as CUDA-graph replays of back-to-back calls over "
              "inputs rotated past 2.5x L2. Median over samples; claim rows are measured "
              f"{lab_claims.MIN_REPEATS}+ times (separate timings, new inputs). Nsight Compute "
              "profiles the best harnesslab strategy per task with --clock-control none. "
              "A step task's rows (case trace:bucket, trace:all the whole trace) come from its "
              "trace run instead: every step's logits and the KV cache checked against the "
              "reference, median = p50 per-step latency (CUDA events, the device idle at each "
              "step's start), p95 beside it; no ncu profile (a step is many kernels). "
              "Raw numbers: results.csv and results.json.", ""]  # fmt: skip
    (out / "report.md").write_text("\n".join(lines))
    return ReportSummary(out_dir=out, meaningful=meaningful, files=files, claims=c, misses=missed,
                         plot_error=plot_error)  # fmt: skip


__all__ = [
    "ReportSummary",
    "build_report",
    "languages_section",
    "peers_section",
    "perf_top",
    "speedup",
    "write_csv",
    "write_plots",
]
