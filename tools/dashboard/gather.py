"""The dashboard's data from one workspace: its runs (loop run state), the scored ledger, tool
usage (telemetry) and generated servers (registry + trusted qualification reports), read through
the readers that own those files (loop/state.py, state/ledger.py, state/checkpoints.py,
Workspace.telemetry_records, meta/registry.py); lab and compare reports are tools/dashboard/
reports.py's.

Every section is read on its own: a missing or damaged file makes that section say what is
missing (`problem`, `Dashboard.missing`) and the others still show.

Side of the trust boundary: trusted, read-only, the operator's. It never reads the store's
hidden results; a final record shows its aggregate figures only. Telemetry is the workspace's
(agent-writable): its values are shown as text, counted, never believed beyond that.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import HarnesslabError, UsageError
from ..loop.state import RUN_ID_RE, Iteration, RunState, RunStore, Score, tool_calls
from ..meta.registry import list_servers, trusted_report
from ..state import Checkpoints, Workspace
from ..task import kind_of
from .models import (
    CandidateRow,
    CheckView,
    Dashboard,
    IterationCalls,
    IterationView,
    LedgerView,
    Point,
    RunView,
    ScoreView,
    ServersView,
    ServerView,
    ToolRow,
    ToolsView,
)

RUNS_SHOWN = 6  # newest runs on the page (the others: --run ID)
RUNS_SCANNED = 200  # newest run folders looked at
LEDGER_ROWS = 200  # newest ledger records on the page
# What reading a section may raise: our errors, a file gone or unreadable, a model that does not
# validate (a half-written or older file).
READ_ERRORS = (HarnesslabError, OSError, ValueError, ValidationError)


def why(exc: BaseException) -> str:
    """One line saying what went wrong (the first line of the error; never a traceback)."""
    text = exc.message if isinstance(exc, HarnesslabError) else str(exc)
    first = (text.strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {first}"[:300]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any, limit: int = 300) -> str:
    return "" if value is None else str(value)[:limit]


# -- runs ------------------------------------------------------------------------------------


def score_view(score: Score | None) -> ScoreView | None:
    if score is None:
        return None
    return ScoreView(
        verdict=score.verdict,
        score=score.score_us if score.verdict == "passed" else None,
        candidate=score.candidate,
        case_set=score.case_set,
        certifies=score.certifies,
        meaningful=score.meaningful,
        reason=(score.reasons[0] if score.reasons else score.error)[:300],
    )


def _iteration(
    it: Iteration, live: bool, now: float, records: list[dict[str, Any]]
) -> IterationView:
    running = live and it.step != "done"
    attempt = it.attempt
    return IterationView(
        index=it.index,
        phase=it.running or it.step,
        running=running,
        started_at=it.started_at,
        finished_at=it.finished_at,
        elapsed_s=round((it.finished_at or (now if running else it.started_at)) - it.started_at, 1),
        attempt=attempt.status if attempt else "",
        attempt_detail=(attempt.error or attempt.result_error)[:300] if attempt else "",
        build=it.build.status if it.build else it.build_skipped,
        score=score_view(it.score),
        new_best=it.new_best,
        servers=[f"{s.name}: {s.status}" for s in it.servers],
        tool_calls=sum(tool_calls(records, it.started_at, it.finished_at).values()),
        error=it.error[:300],
    )


def _points(state: RunState) -> list[Point]:
    """The run's verified scores against wall time (seconds since the run began)."""
    t0 = state.created_at
    out: list[Point] = []

    def add(kind: Any, index: int, label: str, at: float, score: Score, best: bool) -> None:
        shown = score_view(score)
        assert shown is not None
        out.append(
            Point(
                kind=kind,
                iteration=index,
                label=label,
                t_s=round(max(0.0, at - t0), 1),
                score=shown.score,
                verdict=score.verdict,
                new_best=best,
            )
        )

    if state.baseline is not None:
        first = state.iterations[0].started_at if state.iterations else t0 + state.baseline.wall_s
        add("baseline", 0, "baseline", first, state.baseline, False)
    for it in state.iterations:
        if it.score is None:
            continue
        # Scoring follows the attempt; its end is the attempt's end plus the verify's seconds.
        ended = it.attempt.finished_at if it.attempt and it.attempt.finished_at else it.started_at
        at = ended + it.score.wall_s
        if it.finished_at is not None:
            at = min(at, it.finished_at)
        add("iteration", it.index, str(it.index), at, it.score, it.new_best)
    if state.final is not None:
        add("final", state.config.iterations + 1, "final", state.updated_at, state.final, False)
    return out


def run_view(ws: Workspace, run_id: str, records: list[dict[str, Any]], now: float) -> RunView:
    """One run from its trusted state; a run whose state is missing or damaged says so."""
    try:
        state = RunStore(ws, run_id).load()
    except UsageError:
        return RunView(
            run_id=run_id,
            problem="no state.json yet: the run has not saved its first step (or was made "
            "before the trusted store)",
        )
    except READ_ERRORS as exc:
        return RunView(
            run_id=run_id,
            problem=f"state.json cannot be read (half-written, or from another version): "
            f"{why(exc)}",
        )
    cfg = state.config
    live = state.status == "running"
    best = state.best
    return RunView(
        run_id=state.run_id,
        task=cfg.task,
        runner=cfg.runner,
        status=state.status,
        stop_reason=state.stop_reason,
        created_at=state.created_at,
        updated_at=state.updated_at,
        planned=cfg.iterations,
        unit=cfg.unit,
        higher_is_better=cfg.higher_is_better,
        meaningful=any(s.meaningful for s in (state.baseline, state.final) if s is not None),
        baseline=score_view(state.baseline),
        best_score=best.score_us if best else None,
        best_candidate=best.candidate if best else None,
        best_iteration=best.iteration if best else None,
        final=score_view(state.final),
        iterations=[_iteration(it, live, now, records) for it in state.iterations],
        points=_points(state),
        error=state.error[:300],
    )


def run_ids(ws: Workspace) -> list[str]:
    """Run folders in the trusted store, most recently changed first."""
    folder = ws.runs_dir
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        if RUN_ID_RE.match(path.name) and path.is_dir():
            state = path / "state.json"
            found.append((state.stat().st_mtime if state.is_file() else 0.0, path.name))
    return [name for _, name in sorted(found, reverse=True)[:RUNS_SCANNED]]


def runs_view(
    ws: Workspace, records: list[dict[str, Any]], now: float, only: list[str] | None = None
) -> list[RunView]:
    """The runs named in `only`, else the RUNS_SHOWN most recent, newest first."""
    ids = only or run_ids(ws)[:RUNS_SHOWN]
    runs = [run_view(ws, run_id, records, now) for run_id in ids]
    if only:
        return runs
    return sorted(runs, key=lambda r: r.created_at, reverse=True)


# -- ledger -----------------------------------------------------------------------------------


def candidate_row(rec: dict[str, Any], best: dict[str, str]) -> CandidateRow:
    mode = _text(rec.get("mode"), 40)
    candidate = _text(rec.get("candidate"), 64)
    return CandidateRow(
        record_id=_text(rec.get("id"), 80),
        time=_num(rec.get("time")),
        mode=mode,
        case_set=_text(rec.get("case_set"), 80),
        candidate=candidate,
        status=_text(rec.get("status"), 40),
        score=_num(rec.get("score")),
        geomean_pct_of_copy_bw=_num(rec.get("geomean_pct_of_copy_bw")),
        certifies=_text(rec.get("certifies"), 80),
        sandbox=_text(rec.get("sandbox"), 40),
        meaningful=rec.get("meaningful") is True,
        reason=_text(rec.get("reason")),
        is_best=bool(candidate) and best.get(mode) == candidate,
    )


def ledger_view(ws: Workspace, limit: int = LEDGER_ROWS) -> LedgerView:
    """The newest `limit` records, newest first, with the best pointer of each mode."""
    ledger = ws.ledger()
    records = ledger.records()
    ckpt = Checkpoints(ws)
    best = {}
    for mode in ("dev", "final"):
        pointer = ckpt.latest_best(mode)
        if pointer and isinstance(pointer.get("hash"), str):
            best[mode] = pointer["hash"]
    modes = sorted({_text(r.get("mode"), 40) for r in records} | {"dev", "final"})
    kind = kind_of(ws.task)
    return LedgerView(
        rows=[candidate_row(r, best) for r in reversed(records[-limit:])],
        total=len(records),
        unit=kind.unit(ws.task),
        lower_is_better={m: not ledger.higher(m) for m in modes},
        best=best,
    )


# -- tools -----------------------------------------------------------------------------------


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def tools_view(records: list[dict[str, Any]], runs: list[RunView]) -> ToolsView:
    """Calls per server.tool (statuses, latency) and per iteration of the runs shown."""
    by_tool: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        key = (_text(rec.get("server"), 80) or "?", _text(rec.get("tool"), 80) or "?")
        by_tool.setdefault(key, []).append(rec)
    rows = []
    for (server, tool), recs in sorted(by_tool.items()):
        durations = sorted(d for r in recs if (d := _num(r.get("duration_ms"))) is not None)
        statuses = Counter(_text(r.get("status"), 40) for r in recs)
        rows.append(
            ToolRow(
                server=server,
                tool=tool,
                calls=len(recs),
                failures=len(recs) - statuses.get("ok", 0),
                statuses=dict(statuses),
                median_ms=_quantile(durations, 0.5),
                p90_ms=_quantile(durations, 0.9),
                max_ms=durations[-1] if durations else None,
            )
        )
    per_iteration = [
        IterationCalls(
            run_id=run.run_id,
            iteration=it.index,
            calls=tool_calls(records, it.started_at, it.finished_at),
        )
        for run in runs
        for it in run.iterations
    ]
    return ToolsView(
        rows=rows,
        per_iteration=per_iteration,
        total_calls=sum(r.calls for r in rows),
        failures=sum(r.failures for r in rows),
    )


# -- generated servers ------------------------------------------------------------------------


def servers_view(ws: Workspace) -> ServersView:
    out = []
    for rec in list_servers(ws):
        report = trusted_report(ws, rec.name)
        out.append(
            ServerView(
                name=rec.name,
                status=rec.status,
                tools=rec.tools,
                reason=rec.reason[:300],
                updated=rec.updated,
                qualified=report.passed if report else None,
                qualified_at=report.qualified_at if report else None,
                duration_s=report.duration_s if report else None,
                bundle_hash=report.bundle_hash if report else rec.bundle_hash,
                checks=[
                    CheckView(
                        name=c.name,
                        passed=c.passed,
                        evidence=(c.evidence.strip().splitlines() or [""])[0][:240],
                    )
                    for c in (report.checks if report else [])
                ],
            )
        )
    return ServersView(servers=out)


# -- the whole page ---------------------------------------------------------------------------


def gather(ws: Workspace, *, runs: list[str] | None = None, now: float | None = None) -> Dashboard:
    """The workspace's part of the page; each section read on its own (see the module doc)."""
    now = time.time() if now is None else now
    page = Dashboard(generated_at=now, workspace=str(ws.root), task=ws.task.name)
    telemetry_problem = ""
    try:
        records = ws.telemetry_records() if ws.root.is_dir() else []
    except READ_ERRORS as exc:
        records, telemetry_problem = [], f"telemetry cannot be read: {why(exc)}"
    try:
        page.runs = runs_view(ws, records, now, runs)
    except READ_ERRORS as exc:
        page.missing.append(f"runs: {why(exc)}")
    try:
        page.ledger = ledger_view(ws)
    except READ_ERRORS as exc:
        page.ledger = LedgerView(problem=f"the ledger cannot be read: {why(exc)}")
    page.tools = tools_view(records, page.runs)
    page.tools.problem = telemetry_problem
    try:
        page.servers = servers_view(ws)
    except READ_ERRORS as exc:
        page.servers = ServersView(problem=f"the registry cannot be read: {why(exc)}")
    if not ws.root.is_dir():
        page.missing.append(f"the workspace {ws.root} is gone (deleted?)")
    if not page.runs:
        page.missing.append("no loop run yet: start one with `harnesslab run -w WS`")
    if not page.ledger.total and not page.ledger.problem:
        page.missing.append("the ledger is empty: nothing has been scored yet")
    if not records and not telemetry_problem:
        page.missing.append("no tool calls recorded yet (telemetry is empty)")
    return page


def workspace_missing(root: Path, error: BaseException) -> Dashboard:
    """The page of a workspace that cannot be opened: says why, shows nothing else."""
    return Dashboard(
        generated_at=time.time(),
        workspace=str(root),
        missing=[f"the workspace cannot be opened: {why(error)}"],
    )


__all__ = [
    "LEDGER_ROWS",
    "READ_ERRORS",
    "RUNS_SHOWN",
    "candidate_row",
    "gather",
    "ledger_view",
    "run_ids",
    "run_view",
    "runs_view",
    "score_view",
    "servers_view",
    "tools_view",
    "why",
    "workspace_missing",
]
