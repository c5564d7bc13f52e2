"""The dashboard's data (tools/dashboard/gather.py, source.py): runs with their phases, scores
and plot points, the ledger with its best and sandbox, tool usage per tool and per iteration,
generated servers; and what it says instead of failing when a run state is missing or
half-written, a ledger line is torn, or the workspace is empty or not there."""

from __future__ import annotations

import json
from pathlib import Path

from harnesslab.servers.dashboard_page import page_html
from harnesslab.tools.dashboard.gather import gather
from harnesslab.tools.dashboard.source import Source
from harnesslab.tools.state.workspace import init_workspace

from .sample import HIDDEN_DIM, HIDDEN_ROWS, HIDDEN_US, RUN_ID, T0, sample_workspace, settings


def test_a_run_shows_each_iterations_phase_attempt_and_verified_score_and_its_plot_points(
    tmp_path: Path,
):
    ws = sample_workspace(tmp_path)
    page = gather(ws, now=T0 + 130)
    (run,) = page.runs
    assert (run.run_id, run.status, run.planned, run.unit) == (RUN_ID, "running", 3, "us")
    assert run.baseline is not None and run.baseline.score == 100.0
    assert (run.best_score, run.best_iteration) == (80.0, 1)
    first, second, third = run.iterations
    assert (first.phase, first.running, first.attempt, first.new_best) == (
        "done",
        False,
        "ok",
        True,
    )
    assert first.score is not None and first.score.score == 80.0
    assert first.score.certifies == "outputs" and first.elapsed_s == 50.0
    assert second.attempt == "timeout" and second.score is not None
    assert (second.score.verdict, second.score.score) == ("rejected", None)
    assert "wrong on a hidden case" in second.score.reason
    assert (third.phase, third.running, third.elapsed_s) == ("score", True, 30.0)
    # The plot: the baseline, iteration 1 (a new best) and iteration 2 (no passing score), each
    # at the time its verify ended: the attempt's end plus the verify's seconds.
    kinds = [(p.kind, p.iteration, p.score, p.new_best) for p in run.points]
    assert kinds == [("baseline", 0, 100.0, False), ("iteration", 1, 80.0, True),
                     ("iteration", 2, None, False)]  # fmt: skip
    assert [p.t_s for p in run.points] == [10.0, 42.0, 92.0]


def test_a_stopped_run_is_not_shown_as_running_and_its_final_is_plotted_last(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    from harnesslab.tools.loop.state import RunStore  # noqa: PLC0415

    store = RunStore(ws, RUN_ID)
    state = store.load()
    state.status, state.stop_reason = "interrupted", "Ctrl-C"
    state.final = state.iterations[0].score
    store.save(state)
    (run,) = gather(ws).runs
    assert run.stop_reason == "Ctrl-C" and not any(it.running for it in run.iterations)
    assert run.points[-1].kind == "final" and run.points[-1].iteration == 4


def test_a_missing_or_half_written_run_state_is_reported_and_the_other_runs_still_show(
    tmp_path: Path,
):
    ws = sample_workspace(tmp_path)
    (ws.runs_dir / "run-empty").mkdir()
    torn = ws.runs_dir / "run-torn"
    torn.mkdir()
    text = (ws.runs_dir / RUN_ID / "state.json").read_text()
    (torn / "state.json").write_text(text[: len(text) // 2])
    runs = {r.run_id: r for r in gather(ws).runs}
    assert set(runs) == {RUN_ID, "run-empty", "run-torn"}
    assert runs[RUN_ID].problem == "" and runs[RUN_ID].iterations
    assert "no state.json yet" in runs["run-empty"].problem
    assert "cannot be read" in runs["run-torn"].problem
    assert "Traceback" not in runs["run-torn"].problem


def test_the_ledger_shows_newest_first_with_the_best_certifies_and_sandbox(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    led = gather(ws).ledger
    assert led.total == 3 and led.unit == "us" and led.lower_is_better["final"] is True
    assert [(r.mode, r.score) for r in led.rows] == [("final", 80.0), ("final", 100.0),
                                                    ("dev", 50.0)]  # fmt: skip
    newest = led.rows[0]
    assert newest.is_best and not led.rows[1].is_best and led.rows[2].is_best  # per mode
    assert (newest.certifies, newest.sandbox, newest.geomean_pct_of_copy_bw) == (
        "outputs", "full", 12.5,
    )  # fmt: skip


def test_a_torn_ledger_line_is_skipped_and_every_whole_record_still_shows(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    with ws.history_path.open("a") as fh:
        fh.write('{"id": "torn", "mode": "final", "sco')
    led = gather(ws).ledger
    assert led.total == 3 and not led.problem
    assert "torn" not in {r.record_id for r in led.rows}


def test_tool_usage_counts_calls_failures_and_latency_per_tool_and_per_iteration(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    tools = gather(ws).tools
    rows = {r.tool: r for r in tools.rows}
    run_obj = rows["run_objective"]
    assert (run_obj.server, run_obj.calls, run_obj.failures) == ("harnesslab-task", 3, 1)
    assert run_obj.statuses == {"ok": 2, "tool_error": 1}
    assert (run_obj.median_ms, run_obj.max_ms) == (200.0, 300.0)
    assert (tools.total_calls, tools.failures) == (4, 1)
    per = {it.iteration: it.calls for it in tools.per_iteration}
    assert per[1] == {} and per[3] == {
        "harnesslab-task.run_objective": 3,
        "harnesslab-task.sweep_kernel_config": 1,
    }


def test_generated_servers_show_status_tools_and_their_trusted_qualification(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    (server,) = gather(ws).servers.servers
    assert (server.name, server.status, server.qualified) == ("rmsnorm-tuned", "quarantined", False)
    assert server.tools == ["sweep_winning_region"] and server.bundle_hash == "feedbeef"
    assert [(c.name, c.passed) for c in server.checks] == [("self_test", True), ("cheats", False)]
    assert "cheats" in server.reason


def test_an_empty_workspace_says_what_is_missing(tmp_path: Path):
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings(tmp_path))
    page = gather(ws)
    assert page.runs == [] and page.ledger.rows == [] and page.servers.servers == []
    missing = " ".join(page.missing)
    assert "no loop run yet" in missing and "ledger is empty" in missing
    assert "telemetry is empty" in missing


def test_a_folder_that_is_not_a_workspace_yet_is_shown_as_such_and_picked_up_later(
    tmp_path: Path,
):
    source = Source(tmp_path / "ws", settings(tmp_path))
    before = source.fingerprint()
    page = source.snapshot()
    assert page.runs == [] and "not a harnesslab workspace yet" in page.missing[0]
    init_workspace("rmsnorm_gate", tmp_path / "ws", settings(tmp_path))
    assert source.fingerprint() != before
    assert source.snapshot().task == "rmsnorm_gate"


def test_the_fingerprint_changes_with_the_ledger_a_run_and_telemetry_and_only_then(
    tmp_path: Path,
):
    ws = sample_workspace(tmp_path)
    source = Source(ws.root, settings(tmp_path))
    seen = {source.fingerprint()}
    assert source.fingerprint() in seen  # nothing changed
    with ws.history_path.open("a") as fh:
        fh.write("\n")
    seen.add(source.fingerprint())
    from harnesslab.tools.loop.state import RunStore  # noqa: PLC0415

    store = RunStore(ws, RUN_ID)
    store.save(store.load())
    seen.add(source.fingerprint())
    with ws.telemetry_path.open("a") as fh:
        fh.write("\n")
    seen.add(source.fingerprint())
    assert len(seen) == 4


def test_nothing_the_page_shows_reveals_a_hidden_case_shape_or_per_case_timing(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    hidden = ws.store.hidden_results_path.read_text()
    assert str(HIDDEN_ROWS) in hidden and str(HIDDEN_US) in hidden  # the operator's store has them
    page = Source(ws.root, settings(tmp_path)).snapshot()
    shown = page.model_dump_json() + page_html(page, "v")
    for secret in (str(HIDDEN_ROWS), str(HIDDEN_DIM), str(HIDDEN_US), "4242.42"):
        assert secret not in shown
    assert json.loads(page.model_dump_json())["ledger"]["rows"][0]["mode"] == "final"
