"""The ledger's best-so-far rules (state/ledger.py): which records can be a best, which of two
scores is better, de-duplication by candidate, case sets, and what the workspace view shows.
The property each rule exists for: a slower candidate is never the best, a failed or untrusted
record never counts, de-duplication keeps a candidate's best record, not its latest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tools.state.ledger import VIEW_ROWS, Ledger, counts, new_record_id


def rec(candidate: str, score: Any, **kw: Any) -> dict[str, Any]:
    return {
        "mode": "dev",
        "case_set": "all",
        "candidate": candidate,
        "status": "passed",
        "score": score,
        **kw,
    }


def ledger_of(tmp_path: Path, *records: dict[str, Any], **kw: Any) -> Ledger:
    ledger = Ledger(tmp_path / "history.jsonl", **kw)
    for r in records:
        ledger.append(r)
    return ledger


# -- counts ------------------------------------------------------------------------------------
def test_a_passing_scored_trusted_record_counts() -> None:
    assert counts(rec("a", 10.0)) is True
    assert counts(rec("a", 10)) is True  # an int score too


@pytest.mark.parametrize(
    "record",
    [
        rec("a", 10.0, status="failed"),
        rec("a", 10.0, status="error"),
        rec("a", None),
        rec("a", "10"),
        rec("a", True),
        rec("a", 10.0, untrusted=True),
        {"candidate": "a", "score": 10.0},
    ],
    ids=["failed", "error", "no-score", "text-score", "bool-score", "untrusted", "no-status"],
)
def test_a_failed_unscored_or_untrusted_record_never_counts(record: dict[str, Any]) -> None:
    assert counts(record) is False


# -- better ------------------------------------------------------------------------------------
def test_lower_is_better_by_default_and_equal_is_not_better(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "h.jsonl")
    assert ledger.better(1.0, 2.0) is True
    assert ledger.better(2.0, 1.0) is False
    assert ledger.better(1.0, 1.0) is False


def test_higher_is_better_reverses_it_and_a_mode_may_override(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "h.jsonl", higher_is_better=True, mode_higher={"dev": False})
    assert ledger.better(2.0, 1.0, "final") is True
    assert ledger.better(1.0, 2.0, "final") is False
    assert ledger.better(1.0, 1.0, "final") is False
    assert ledger.better(1.0, 2.0, "dev") is True  # the mode's own direction wins
    assert ledger.higher(None) is True and ledger.higher("dev") is False


# -- best and ranked ---------------------------------------------------------------------------
def test_a_slower_candidate_is_never_the_best(tmp_path: Path) -> None:
    ledger = ledger_of(tmp_path, rec("fast", 10.0), rec("slow", 20.0), rec("mid", 15.0))
    assert ledger.best("dev", case_set="all")["candidate"] == "fast"
    assert [r["candidate"] for r in ledger.ranked("dev", case_set="all")] == [
        "fast",
        "mid",
        "slow",
    ]


def test_when_higher_is_better_the_highest_score_is_the_best(tmp_path: Path) -> None:
    ledger = ledger_of(
        tmp_path, rec("low", 1.5), rec("high", 3.0), rec("mid", 2.0), higher_is_better=True
    )
    assert ledger.best("dev", case_set="all")["candidate"] == "high"
    assert [r["candidate"] for r in ledger.ranked("dev", case_set="all")] == [
        "high",
        "mid",
        "low",
    ]


def test_failed_untrusted_other_mode_and_other_case_set_records_are_never_the_best(
    tmp_path: Path,
) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("honest", 50.0),
        rec("failed", 1.0, status="failed"),
        rec("imported", 1.0, untrusted=True),
        rec("final-run", 1.0, mode="final"),
        rec("one-case", 1.0, case_set="1024x1024_fp16"),
    )
    assert [r["candidate"] for r in ledger.ranked("dev", case_set="all")] == ["honest"]
    assert ledger.best("dev", case_set="1024x1024_fp16")["candidate"] == "one-case"
    assert ledger.best("final", case_set="all")["candidate"] == "final-run"
    assert ledger.best("final", case_set="nothing") is None


def test_no_passing_record_means_no_best(tmp_path: Path) -> None:
    ledger = ledger_of(tmp_path, rec("a", 1.0, status="failed"))
    assert ledger.best("dev", case_set="all") is None
    assert ledger.ranked("dev", case_set="all") == []


def test_deduplication_keeps_a_candidates_best_record_not_its_latest(tmp_path: Path) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("a", 10.0, note="a-best"),
        rec("b", 12.0),
        rec("a", 14.0, note="a-later"),
        rec("c", 9.0, note="c-first"),
        rec("c", 8.0, note="c-better-later"),
    )
    ranked = ledger.ranked("dev", case_set="all")
    assert [(r["candidate"], r["note"] if "note" in r else None) for r in ranked] == [
        ("c", "c-better-later"),
        ("a", "a-best"),
        ("b", None),
    ]


def test_of_equal_scores_the_first_record_is_kept_and_ranked_first(tmp_path: Path) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("a", 10.0, note="first"),
        rec("a", 10.0, note="second"),
        rec("b", 10.0),
    )
    ranked = ledger.ranked("dev", case_set="all")
    assert [r["candidate"] for r in ranked] == ["a", "b"]
    assert ranked[0]["note"] == "first"


def test_deduplication_follows_the_modes_direction(tmp_path: Path) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("a", 2.0, mode="final", note="worse"),
        rec("a", 3.0, mode="final", note="better"),
        mode_higher={"final": True},
    )
    assert ledger.best("final", case_set="all")["note"] == "better"


def test_ranked_takes_given_records_instead_of_reading_the_file(tmp_path: Path) -> None:
    ledger = ledger_of(tmp_path, rec("on-disk", 1.0))
    given = [rec("given", 5.0)]
    assert [r["candidate"] for r in ledger.ranked("dev", case_set="all", records=given)] == [
        "given"
    ]


def test_given_records_of_another_mode_are_left_out(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "h.jsonl")
    given = [rec("final", 1.0, mode="final"), rec("dev", 5.0)]
    assert [r["candidate"] for r in ledger.ranked("dev", case_set="all", records=given)] == ["dev"]


# -- case sets ---------------------------------------------------------------------------------
def test_case_sets_are_those_with_a_counting_record_most_recently_scored_last(
    tmp_path: Path,
) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("a", 1.0, case_set="old", time=100.0),
        rec("a", 1.0, case_set="new", time=300.0),
        rec("a", 1.0, case_set="middle", time=200.0),
        rec("a", 1.0, case_set="failed-only", status="failed", time=400.0),
        rec("a", 1.0, case_set="other-mode", mode="final", time=500.0),
    )
    assert ledger.case_sets("dev") == ["old", "middle", "new"]
    assert ledger.case_sets("final") == ["other-mode"]


def test_a_case_set_rescored_moves_last(tmp_path: Path) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("a", 1.0, case_set="x", time=100.0),
        rec("a", 1.0, case_set="y", time=200.0),
        rec("b", 1.0, case_set="x", time=300.0),
    )
    assert ledger.case_sets("dev") == ["y", "x"]
    records = [rec("a", 1.0, case_set="z", time=1.0)]
    assert ledger.case_sets("dev", records) == ["z"]
    # A record without a time (not written by append) counts as the oldest.
    records = [rec("a", 1.0, case_set="late", time=0.5), rec("a", 1.0, case_set="untimed")]
    assert ledger.case_sets("dev", records) == ["untimed", "late"]


# -- append and records ------------------------------------------------------------------------
def test_append_stamps_id_time_and_pid_and_calls_on_append(tmp_path: Path) -> None:
    seen: list[int] = []
    ledger = Ledger(tmp_path / "h.jsonl", on_append=lambda led: seen.append(len(led.records())))
    stored = ledger.append(rec("a", 1.0))
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", stored["id"])
    assert isinstance(stored["time"], float) and isinstance(stored["pid"], int)
    assert ledger.records() == [stored]
    assert seen == [1]  # called after the record is on disk


def test_records_filter_by_mode(tmp_path: Path) -> None:
    ledger = ledger_of(tmp_path, rec("a", 1.0), rec("b", 1.0, mode="final"))
    assert [r["candidate"] for r in ledger.records("final")] == ["b"]
    assert [r["candidate"] for r in ledger.records()] == ["a", "b"]


def test_record_ids_are_unique_and_sortable_by_time() -> None:
    ids = {new_record_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", i) for i in ids)


# -- the workspace view ------------------------------------------------------------------------
def test_the_view_ranks_by_aggregate_score_only_and_never_shows_per_case_numbers(
    tmp_path: Path,
) -> None:
    cases = [{"name": "final0", "shape": {"rows": 4096}, "median_us": 3.0}]
    ledger = ledger_of(
        tmp_path,
        rec("slow", 20.0, config={"num_warps": 4}, cases=cases, geomean_pct_of_copy_bw=40.0),
        rec("fast", 10.0, cases=cases),
        rec("final", 7.0, mode="final", case_set="final-x", cases=cases),
        rec("broken", 1.0, status="failed", cases=cases),
    )
    view = ledger.view()
    assert "4096" not in str(view) and "shape" not in str(view)
    rows = view["modes"]["dev"]["all"]
    assert [(r["rank"], r["candidate"], r["score"]) for r in rows] == [
        (1, "fast", 10.0),
        (2, "slow", 20.0),
    ]
    stored = {r["candidate"]: r for r in ledger.records()}
    assert rows[1] == {
        "rank": 2,
        "candidate": "slow",
        "score": 20.0,
        "geomean_pct_of_copy_bw": 40.0,
        "config": {"num_warps": 4},
        "record_id": stored["slow"]["id"],
        "time": stored["slow"]["time"],
    }
    assert rows[0]["config"] == {}
    assert list(view["modes"]["final"]) == ["final-x"]
    assert view["lower_is_better"] is True
    assert view["lower_is_better_by_mode"] == {"dev": True, "final": True}
    assert "editing this file changes nothing" in view["about"]


def test_the_view_follows_each_modes_direction(tmp_path: Path) -> None:
    ledger = ledger_of(
        tmp_path,
        rec("a", 1.0, mode="final"),
        rec("b", 2.0, mode="final"),
        higher_is_better=False,
        mode_higher={"final": True},
    )
    view = ledger.view()
    assert [r["candidate"] for r in view["modes"]["final"]["all"]] == ["b", "a"]
    assert view["lower_is_better_by_mode"] == {"final": False}


def test_the_view_keeps_the_best_rows_per_case_set(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "h.jsonl")
    for i in range(VIEW_ROWS + 5):
        ledger.append(rec(f"c{i}", float(VIEW_ROWS + 5 - i)))
    rows = ledger.view()["modes"]["dev"]["all"]
    assert len(rows) == VIEW_ROWS == 50
    assert rows[0]["candidate"] == f"c{VIEW_ROWS + 4}" and rows[-1]["rank"] == VIEW_ROWS
