"""The dashboard's reports from folders the operator names: the kernel lab's (the `--out` of
`harnesslab lab`: results.json read by lab/matrix.load_results, the claims judged by
lab/claims.claims_ledger, its PNG plots) and `harnesslab compare`'s (report.json as
loop/compare.CompareReport, each trial's run from its workspace's trusted run state).

Side of the trust boundary: trusted, read-only, the operator's. Lab results hold no hidden case;
a compare's trials show what their run state holds (public verdicts).
"""

from __future__ import annotations

import time
from pathlib import Path

from ..lab.claims import claims_ledger, counts, row_of
from ..lab.matrix import load_results
from ..lab.report import speedup
from ..loop.compare import CompareReport
from ..settings import Settings
from ..state import open_workspace
from .gather import READ_ERRORS, run_view, why
from .models import CompareArmView, CompareView, LabCell, LabTask, LabView, RunView

RESULTS = "results.json"
PLOT_SUFFIXES = ("_perf.png", "_speedup.png")


def latest_lab_folder(folder: Path) -> Path | None:
    """`folder` when it is a lab report (it holds results.json), else its most recently written
    sub-folder that is one (a folder of dated reports such as docs/lab/)."""
    if (folder / RESULTS).is_file():
        return folder
    if not folder.is_dir():
        return None
    reports = [p for p in folder.iterdir() if p.is_dir() and (p / RESULTS).is_file()]
    return max(reports, key=lambda p: (p / RESULTS).stat().st_mtime, default=None)


def lab_plots(folder: Path, tasks: list[str]) -> list[str]:
    """The report's plot files (`<task>_perf.png`, `<task>_speedup.png`) that exist."""
    return [f"{t}{s}" for t in tasks for s in PLOT_SUFFIXES if (folder / f"{t}{s}").is_file()]


def lab_view(folder: Path) -> LabView:
    """The latest lab report under `folder`: its matrix, plots and claims ledger."""
    found = latest_lab_folder(folder)
    if found is None:
        return LabView(
            folder=str(folder),
            problem=f"no {RESULTS} in {folder} or its sub-folders: pass the --out folder of "
            "`harnesslab lab`",
        )
    try:
        results = load_results(found / RESULTS)
        info = results.get("info") or {}
        tasks = []
        for name, task in (results.get("tasks") or {}).items():
            strategies = [str(s) for s in task.get("strategies") or []]
            cases = [str(c) for c in task.get("cases") or []]
            tflops = task.get("metric") == "tflops"
            cells: list[list[LabCell | None]] = []
            for case in cases:
                line: list[LabCell | None] = []
                for strategy in strategies:
                    row = row_of(results, name, strategy, case)
                    line.append(
                        None
                        if row is None
                        else LabCell(
                            strategy=strategy,
                            status=str(row.get("status") or ""),
                            passed=bool(row.get("passed")),
                            median_us=row.get("median_us"),
                            value=row.get("tflops" if tflops else "pct_of_copy_bw"),
                            speedup=speedup(results["rows"], row),
                        )
                    )
                cells.append(line)
            tasks.append(
                LabTask(
                    name=name,
                    metric="TFLOP/s" if tflops else "% copy",
                    best_strategy=task.get("best_strategy"),
                    strategies=strategies,
                    cases=cases,
                    cells=cells,
                )
            )
        claims = claims_ledger(results)
    except (*READ_ERRORS, KeyError, TypeError) as exc:
        return LabView(folder=str(found), problem=f"{RESULTS} cannot be read: {why(exc)}")
    return LabView(
        folder=str(found),
        date=str(info.get("date") or ""),
        device=str(info.get("device") or ""),
        meaningful=bool(info.get("meaningful")),
        incomplete=str(info.get("incomplete") or ""),
        tasks=tasks,
        plots=lab_plots(found, [t.name for t in tasks]),
        claims=claims,
        claim_counts=counts(claims),
    )


def compare_view(folder: Path, settings: Settings, now: float | None = None) -> CompareView:
    """A compare report as its two arms, each with its trials' runs."""
    now = time.time() if now is None else now
    path = folder / "report.json"
    if not path.is_file():
        return CompareView(
            folder=str(folder),
            problem="no report.json yet: the compare is still running, or this is not the "
            "--out folder of `harnesslab compare`",
        )
    try:
        report = CompareReport.model_validate_json(path.read_text())
    except READ_ERRORS as exc:
        return CompareView(folder=str(folder), problem=f"report.json cannot be read: {why(exc)}")
    arms = []
    for arm in report.arms:
        runs = []
        for trial in (t for t in report.trials if t.arm == arm.arm):
            try:
                ws = open_workspace(Path(trial.workspace), settings)
                runs.append(run_view(ws, trial.run_id, ws.telemetry_records(), now))
            except READ_ERRORS as exc:
                runs.append(
                    RunView(run_id=trial.run_id or f"{arm.arm}-{trial.index}", problem=why(exc))
                )
        arms.append(
            CompareArmView(
                arm=arm.arm,
                runner=arm.runner,
                harnessed=arm.harnessed,
                servers=arm.servers,
                trials=arm.trials,
                valid=arm.valid,
                median=arm.median,
                p10=arm.p10,
                p90=arm.p90,
                runs=runs,
            )
        )
    return CompareView(
        folder=str(folder),
        task=report.task,
        unit=report.unit,
        higher_is_better=report.higher_is_better,
        meaningful=report.meaningful,
        difference=report.difference,
        arms=arms,
        plot="scores.png" if (folder / "scores.png").is_file() else "",
    )


__all__ = ["PLOT_SUFFIXES", "compare_view", "lab_plots", "lab_view", "latest_lab_folder"]
