"""A candidate's kernel against the best (tools/dashboard/diff.py): the files of two
checkpoints, unchanged runs folded, a bad or unknown hash said as such."""

from __future__ import annotations

from pathlib import Path

from harnesslab.tools.dashboard.diff import best_candidate, candidate_diff, line_diff
from harnesslab.tools.state.checkpoints import Checkpoints
from harnesslab.tools.state.storage import hash_files

from .sample import kernel_files, sample_workspace


def test_unchanged_runs_are_folded_and_changes_keep_three_lines_of_context():
    old = [f"line {i}" for i in range(40)]
    new = [*old[:20], "changed", *old[21:]]
    lines = line_diff(old, new)
    tags = [(d.tag, d.old_no, d.new_no, d.count) for d in lines]
    assert tags == [
        ("skip", None, None, 17),
        ("same", 18, 18, 0), ("same", 19, 19, 0), ("same", 20, 20, 0),
        ("del", 21, None, 0), ("add", None, 21, 0),
        ("same", 22, 22, 0), ("same", 23, 23, 0), ("same", 24, 24, 0),
        ("skip", None, None, 16),
    ]  # fmt: skip
    assert [d.tag for d in line_diff(old, old)] == ["skip"]
    assert [d.tag for d in line_diff(["a", "b", "c"], ["a", "B", "c"])] == [
        "same", "del", "add", "same",
    ]  # fmt: skip


def test_a_candidate_is_diffed_against_the_best_final_checkpoint(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    best, label = best_candidate(ws)
    assert best == hash_files(kernel_files(ws, "better")) and "final" in label
    other = Checkpoints(ws).save(kernel_files(ws, "other"))
    diff = candidate_diff(ws, other)
    assert diff.best == best and not diff.problem
    files = {f.path: f for f in diff.files}
    assert set(files) == set(ws.task.editable)
    kernel = files["kernel.py"]
    assert kernel.changed and "# other" in kernel.new_text and "# better" in kernel.old_text
    old, new = kernel.old_text.splitlines(), kernel.new_text.splitlines()
    changed = [
        (d.tag, new[d.new_no - 1] if d.new_no else old[(d.old_no or 0) - 1])
        for d in kernel.lines
        if d.tag in ("add", "del")
    ]
    assert changed == [("del", "# better"), ("add", "# other")]
    assert not files["kernel_config.json"].changed


def test_a_bad_or_unknown_hash_is_said_not_raised(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    assert candidate_diff(ws, "../../etc/passwd").problem == "not a candidate hash"
    missing = candidate_diff(ws, "0123456789abcdef")
    assert "no checkpoint" in missing.problem and not missing.files
