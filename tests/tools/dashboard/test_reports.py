"""Lab and compare reports on the dashboard (tools/dashboard/reports.py): the latest lab report's
matrix, plots and claims; a compare report as its two arms with each trial's run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harnesslab.tools.dashboard.reports import compare_view, lab_view, latest_lab_folder
from harnesslab.tools.loop.compare import ArmSummary, CompareReport, Trial

from .sample import RUN_ID, sample_workspace, settings

DOCS_LAB = Path(__file__).resolve().parents[3] / "docs" / "lab"
QUICK = DOCS_LAB / "2026-11-21-h100-quick"  # a committed lab report with its results.json


def test_the_latest_lab_report_shows_its_matrix_plots_and_claims(tmp_path: Path):
    older, newer = tmp_path / "a", tmp_path / "b"
    shutil.copytree(QUICK, older)
    shutil.copytree(QUICK, newer)
    (newer / "results.json").touch()
    assert latest_lab_folder(tmp_path) == newer
    lab = lab_view(tmp_path)
    assert lab.folder == str(newer) and not lab.problem and lab.meaningful
    results = json.loads((QUICK / "results.json").read_text())
    assert [t.name for t in lab.tasks] == list(results["tasks"])
    softmax = lab.tasks[0]
    cell = softmax.cells[0][softmax.strategies.index("baseline")]
    row = next(r for r in results["rows"] if (r["task"], r["case"], r["strategy"]) ==
               ("softmax", softmax.cases[0], "baseline"))  # fmt: skip
    assert cell is not None and cell.median_us == row["median_us"] and cell.passed
    assert "softmax_perf.png" in lab.plots and len(lab.claims) == sum(lab.claim_counts.values())


def test_a_folder_without_a_lab_report_or_with_a_broken_one_says_so(tmp_path: Path):
    assert "no results.json" in lab_view(tmp_path).problem
    (tmp_path / "results.json").write_text('{"schema": 1, "ro')
    assert "cannot be read" in lab_view(tmp_path).problem


def test_a_compare_report_shows_its_two_arms_and_each_trials_run(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    out = tmp_path / "cmp"
    out.mkdir()
    arms = [
        ArmSummary(
            arm=name,
            runner="autopilot",
            harnessed=name == "b",
            trials=1,
            valid=1,
            invalid=0,
            median=m,
        )
        for name, m in (("a", 100.0), ("b", 80.0))
    ]
    trials = [
        Trial(arm="a", index=0, workspace=str(ws.root), run_id=RUN_ID, valid=True, score=100.0),
        Trial(arm="b", index=0, workspace=str(tmp_path / "gone"), run_id="x", valid=False),
    ]
    report = CompareReport(
        task="rmsnorm_gate", case_set="final-abc", score_key="score_us", unit="us",
        higher_is_better=False, config={}, arms=arms, trials=trials,
        difference={"value": -20.0, "verdict": "b is better"},
    )  # fmt: skip
    (out / "report.json").write_text(report.model_dump_json())
    view = compare_view(out, settings(tmp_path))
    assert [a.arm for a in view.arms] == ["a", "b"] and view.difference["value"] == -20.0
    (run_a,) = view.arms[0].runs
    assert run_a.run_id == RUN_ID and run_a.best_score == 80.0
    (run_b,) = view.arms[1].runs
    assert run_b.run_id == "x" and "does not exist" in run_b.problem


def test_a_compare_still_running_has_no_report_yet(tmp_path: Path):
    assert "no report.json yet" in compare_view(tmp_path, settings(tmp_path)).problem
