"""The new-best decision and the scored result (evaluation/recording.py `record_run`,
`to_eval_result`): a slower, equal, failed or unscored run never moves the best pointer;
scores compare within a case set, in the task's direction; a runner that died still yields every
case, and a failed candidate has no score. In process, with a real workspace and trusted store;
no runner."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation.recording import record_run, to_eval_result
from harnesslab.tools.execution.launcher import RunnerCall
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.checkpoints import Checkpoints
from harnesslab.tools.state.storage import read_jsonl
from harnesslab.tools.state.workspace import Candidate, Workspace, init_workspace
from harnesslab.tools.task.spec import Case


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace("rmsnorm_gate", tmp_path / "ws", settings(tmp_path))


def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", interpret="always")


def files(n: int) -> dict[str, bytes]:
    return {"kernel.py": f"# candidate {n}\n".encode(), "kernel_config.json": b"{}\n"}


def run(ws: Workspace, n: int, score: float | None, status: str = "passed", **kw: Any):
    kw.setdefault("mode", "dev")
    kw.setdefault("case_set", "all")
    return record_run(ws, Candidate.of(files(n)), {"note": n}, status=status, score=score, **kw)


def pointer(ws: Workspace, mode: str = "dev", case_set: str = "all") -> dict[str, Any] | None:
    return Checkpoints(ws).best(mode, case_set=case_set)


# -- record_run: the best pointer --------------------------------------------------------------
def test_the_first_passing_run_is_the_best(ws: Workspace) -> None:
    done = run(ws, 1, 10.0)
    assert done.is_new_best is True
    assert (done.best_score, done.delta_vs_best_pct) == (None, None)
    best = pointer(ws)
    assert best is not None
    assert (best["hash"], best["score"], best["record"]) == (
        ws.candidate_hash(files(1)),
        10.0,
        done.record_id,
    )


def test_a_slower_run_is_never_the_new_best(ws: Workspace) -> None:
    run(ws, 1, 10.0)
    before = pointer(ws)
    done = run(ws, 2, 20.0)
    assert done.is_new_best is False
    assert (done.best_score, done.delta_vs_best_pct) == (10.0, 100.0)
    assert pointer(ws) == before


def test_an_equal_score_does_not_move_the_best(ws: Workspace) -> None:
    run(ws, 1, 10.0)
    done = run(ws, 2, 10.0)
    assert done.is_new_best is False and done.delta_vs_best_pct == 0.0
    assert pointer(ws)["hash"] == ws.candidate_hash(files(1))


def test_a_faster_run_moves_the_best_and_reports_its_delta(ws: Workspace) -> None:
    run(ws, 1, 10.0)
    done = run(ws, 2, 5.0)
    assert done.is_new_best is True
    assert (done.best_score, done.delta_vs_best_pct) == (10.0, -50.0)
    assert pointer(ws)["hash"] == ws.candidate_hash(files(2))
    assert pointer(ws)["record"] == done.record_id
    assert ws.ledger().best("dev", case_set="all")["id"] == done.record_id


@pytest.mark.parametrize(("status", "score"), [("failed", 1.0), ("error", 1.0), ("passed", None)])
def test_a_failed_or_unscored_run_never_moves_the_best(
    ws: Workspace, status: str, score: float | None
) -> None:
    run(ws, 1, 10.0)
    done = run(ws, 2, score, status=status)
    assert done.is_new_best is False and done.delta_vs_best_pct is None
    assert done.best_score == 10.0
    assert pointer(ws)["hash"] == ws.candidate_hash(files(1))


def test_a_failed_first_run_sets_no_best(ws: Workspace) -> None:
    done = run(ws, 1, 1.0, status="failed")
    assert done.is_new_best is False and pointer(ws) is None


def test_scores_compare_only_within_a_case_set_and_a_mode(ws: Workspace) -> None:
    run(ws, 1, 10.0)
    one_case = run(ws, 2, 50.0, case_set="1024x1024_fp16")
    assert one_case.is_new_best is True and one_case.best_score is None
    final = run(ws, 3, 80.0, mode="final")
    assert final.is_new_best is True and final.best_score is None
    assert pointer(ws)["hash"] == ws.candidate_hash(files(1))
    assert pointer(ws, case_set="1024x1024_fp16")["hash"] == ws.candidate_hash(files(2))
    assert pointer(ws, mode="final")["hash"] == ws.candidate_hash(files(3))


def test_a_best_of_zero_gives_no_delta_rather_than_a_division_by_zero(ws: Workspace) -> None:
    run(ws, 1, 0.0)
    done = run(ws, 2, 5.0)
    assert done.is_new_best is False and done.best_score == 0.0
    assert done.delta_vs_best_pct is None


def test_when_higher_is_better_a_higher_score_is_the_new_best(tmp_path: Path) -> None:
    task = tmp_path / "speedtask"
    task.mkdir()
    (task / "task.toml").write_text(
        textwrap.dedent(
            """
            name = "speedtask"
            summary = "Make the speedup large."
            kind = "command"
            editable = ["solution.txt"]
            objective = "python3 score.py"
            score_key = "speedup"
            higher_is_better = true
            """
        )
    )
    (task / "task.md").write_text("Higher is better.\n")
    (task / "solution.txt").write_text("1\n")
    ws = init_workspace(task, tmp_path / "ws", settings(tmp_path))
    one = Candidate.of({"solution.txt": b"1\n"})
    two = Candidate.of({"solution.txt": b"2\n"})
    record_run(ws, one, {}, mode="dev", case_set="all", status="passed", score=2.0)
    worse = record_run(ws, two, {}, mode="dev", case_set="all", status="passed", score=1.0)
    assert worse.is_new_best is False and worse.delta_vs_best_pct == -50.0
    better = record_run(ws, two, {}, mode="dev", case_set="all", status="passed", score=3.0)
    assert better.is_new_best is True
    assert pointer(ws)["score"] == 3.0


# -- record_run: what is recorded --------------------------------------------------------------
def test_the_ledger_record_carries_the_decided_fields_over_the_entrys(ws: Workspace) -> None:
    entry = {"note": "kept", "mode": "forged", "status": "passed", "score": 0.001,
             "case_set": "forged", "candidate": "forged"}  # fmt: skip
    one = Candidate.of(files(1))
    done = record_run(ws, one, entry, mode="dev", case_set="all", status="failed", score=None)
    (stored,) = ws.ledger().records()
    assert stored["id"] == done.record_id and stored["note"] == "kept"
    assert (stored["mode"], stored["case_set"], stored["status"], stored["score"]) == (
        "dev",
        "all",
        "failed",
        None,
    )
    assert stored["candidate"] == ws.candidate_hash(files(1))
    assert Checkpoints(ws).files(stored["candidate"]) == files(1)


def test_hidden_cases_go_to_the_trusted_store_only_and_only_when_given(ws: Workspace) -> None:
    run(ws, 1, 10.0)
    assert not ws.store.hidden_results_path.exists()
    hidden = [{"name": "final0", "shape": {"rows": 4096, "dim": 2048}}]
    done = run(ws, 2, 12.0, mode="final", case_set="final-x", hidden=hidden,
               store_only={"objective_output": {"best_us": 12.0}})  # fmt: skip
    (line,) = read_jsonl(ws.store.hidden_results_path)
    assert line == {
        "record": done.record_id,
        "case_set": "final-x",
        "candidate": ws.candidate_hash(files(2)),
        "cases": hidden,
        "objective_output": {"best_us": 12.0},
    }
    assert "4096" not in str(ws.ledger().records())
    run(ws, 3, 12.0, mode="final", case_set="final-x", store_only={"x": 1})
    assert list(read_jsonl(ws.store.hidden_results_path))[-1]["cases"] == []


def test_hidden_cases_alone_are_kept_with_nothing_else(ws: Workspace) -> None:
    hidden = [{"name": "final0", "shape": {"rows": 4096}}]
    done = run(ws, 1, 12.0, mode="final", case_set="final-x", hidden=hidden)
    (line,) = read_jsonl(ws.store.hidden_results_path)
    assert line == {"record": done.record_id, "case_set": "final-x",
                    "candidate": ws.candidate_hash(files(1)), "cases": hidden}  # fmt: skip


def test_a_workspace_deleted_mid_run_is_not_recreated(ws: Workspace) -> None:
    import shutil

    shutil.rmtree(ws.root)
    with pytest.raises(UsageError, match="does not exist"):
        run(ws, 1, 10.0)
    assert not ws.root.exists() and ws.ledger().records() == []


def test_a_record_that_may_not_fit_is_refused_before_anything_is_written(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harnesslab.tools.errors import DiskFull
    from harnesslab.tools.state import storage

    # the files, the entry's text and the store's 64 KiB margin for its own records
    need = sum(len(b) for b in files(1).values()) + len(str({"note": 1})) + (64 << 10)
    monkeypatch.setattr(storage, "free_bytes", lambda folder: need - 1)
    with pytest.raises(DiskFull):
        run(ws, 1, 10.0)
    assert ws.ledger().records() == [] and pointer(ws) is None
    monkeypatch.setattr(storage, "free_bytes", lambda folder: need)
    assert run(ws, 1, 10.0).is_new_best


# -- to_eval_result ----------------------------------------------------------------------------
CASES = [
    Case(name="a", dtype="float16", shape={"rows": 4, "dim": 8}),
    Case(name="b", dtype="bfloat16", shape={"rows": 2, "dim": 8}),
]


def row(name: str, passed: bool = True, median: float | None = 10.0) -> dict[str, Any]:
    return {"name": name, "dtype": "float16", "passed": passed,
            "status": "passed" if passed else "failed", "median_us": median}  # fmt: skip


def call(result: dict[str, Any] | None, events=(), *, timed_out: bool = False) -> RunnerCall:
    return RunnerCall(result=result, events=list(events), exit_code=None if timed_out else 1,
                      timed_out=timed_out, stderr_tail="Traceback\nBoom: it broke\n",
                      host="h", gpu_index=0, wall_s=3.0)  # fmt: skip


def evaluate(c: RunnerCall):
    return to_eval_result(c, CASES, candidate="abc", config={"w": 1}, mode="final", seed=7)


def test_a_passing_run_is_scored_by_the_sum_of_its_medians() -> None:
    res = {"status": "passed", "cases": [row("a", median=10.0), row("b", median=5.0)],
           "env": {"meaningful": True, "device": "H100"}, "geomean_pct_of_copy_bw": 42.0,
           "copy_gbps": 3000.0}  # fmt: skip
    ev = evaluate(call(res))
    assert (ev.status, ev.score_us, ev.meaningful) == ("passed", 15.0, True)
    assert (ev.candidate, ev.config, ev.mode, ev.seed, ev.wall_s) == (
        "abc",
        {"w": 1},
        "final",
        7,
        3.0,
    )
    assert (ev.geomean_pct_of_copy_bw, ev.copy_gbps, ev.env.device) == (42.0, 3000.0, "H100")


def test_one_failed_case_fails_the_run_and_leaves_it_without_a_score() -> None:
    res = {"status": "passed", "cases": [row("a"), row("b", passed=False)], "reason": "b wrong"}
    ev = evaluate(call(res))
    assert (ev.status, ev.score_us, ev.reason) == ("failed", None, "b wrong")


def test_a_run_with_no_cases_is_failed_not_passed() -> None:
    ev = evaluate(call({"status": "passed", "cases": []}))
    assert (ev.status, ev.score_us, ev.cases) == ("failed", None, [])


def test_a_runner_error_without_cases_is_an_error_with_its_reason() -> None:
    ev = evaluate(call({"status": "error", "reason": "kernel.py: SyntaxError"}))
    assert (ev.status, ev.reason, ev.score_us) == ("error", "kernel.py: SyntaxError", None)
    assert [(c.name, c.status, c.passed) for c in ev.cases] == [
        ("a", "error", False),
        ("b", "error", False),
    ]


def test_a_result_without_cases_that_is_not_an_error_is_judged_by_its_cases() -> None:
    ev = evaluate(call({"status": "passed", "reason": "odd"}, [{"event": "case", **row("a")}]))
    assert (ev.status, ev.reason) == ("failed", "odd")  # case b never finished
    assert [c.passed for c in ev.cases] == [True, False]


def test_per_case_rows_decide_even_when_the_runner_says_error() -> None:
    res = {"status": "error", "reason": "late", "cases": [row("a"), row("b", passed=False)]}
    ev = evaluate(call(res))
    assert (ev.status, ev.reason, ev.score_us) == ("failed", "late", None)


def test_a_killed_runner_keeps_its_finished_cases_and_times_out_the_rest() -> None:
    finished = {"event": "case", **row("a")}
    ev = evaluate(call(None, [finished, {"event": "waiting"}], timed_out=True))
    assert ev.status == "failed" and ev.score_us is None
    assert "timed out" in ev.reason
    a, b = ev.cases
    assert (a.name, a.passed, a.median_us) == ("a", True, 10.0)
    assert (b.name, b.status, b.passed) == ("b", "timeout", False)
    assert b.reason == "timeout: the runner was killed"
    assert b.shape == {"rows": 2, "dim": 8} and b.dtype == "bfloat16"


def test_a_crashed_runner_reports_each_case_as_an_error_with_the_last_stderr_line() -> None:
    ev = evaluate(call(None))
    assert ev.status == "failed" and ev.reason == "runner exited with 1: Boom: it broke"
    assert [(c.status, c.reason) for c in ev.cases] == [
        ("error", "runner exited with 1: Boom: it broke"),
        ("error", "runner exited with 1: Boom: it broke"),
    ]
