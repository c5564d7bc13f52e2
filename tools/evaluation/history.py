"""rank_history and restore_best_checkpoint's library half: the ledger read as a ranking of
candidates, an optional chart of score over time, and restoring a ranked candidate's files.

Candidates are de-duplicated by content hash (the best record of each counts); the incumbent is
the best passing candidate of the mode on one case set: scores compare only within a case set
(a one-case dev run sums fewer medians than a full one; two hidden case sets are different
problems). The default case set is the full dev set (`all`; a subset until the full set has a
passing record), a command task's objective, or the most recent hidden case set. Lower is better unless the task says otherwise (command tasks may
declare higher_is_better). Records imported from a pre-store workspace are listed as untrusted
and never ranked until their candidate is scored again.
"""

from __future__ import annotations

import io
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import EnvironmentProblem, UsageError
from ..state import Ledger
from ..state import workspace_files as wf
from ..state.checkpoints import HASH_RE, Checkpoints
from ..state.ledger import counts as counts_as_score
from ..state.workspace import STATE, Workspace
from ..task.kinds import KernelKind, kind_of

Mode = Literal["dev", "final", "sweep"]
FULL_DEV_SET = KernelKind.full_case_set  # run_objective with every dev case


class RankedCandidate(BaseModel):
    rank: int | None = Field(description="1 = best; None for candidates that never passed")
    candidate: str
    score: float | None
    spread: float | None = Field(
        default=None, description="median over cases of (p90-p10)/median: timing noise"
    )
    status: str
    config: dict[str, Any] = Field(default_factory=dict)
    when: str = Field(description="UTC time of the record, ISO 8601")
    record_id: str
    evaluations: int = Field(description="records of this candidate in this mode")
    meaningful: bool | None = None
    is_best: bool = False
    restorable: bool = Field(description="its files are checkpointed")
    case_set: str = Field(default="", description="the cases its score is a sum over")
    untrusted: bool = Field(
        default=False, description="imported from the workspace, never scored here: not ranked"
    )


class HistoryPage(BaseModel):
    mode: str
    case_set: str | None = Field(description="the case set ranked: scores compare only within one")
    case_sets: list[str] = Field(description="case sets with passing records in this mode")
    lower_is_better: bool
    total: int = Field(description="distinct candidates in this mode (with the filter)")
    offset: int
    next_offset: int | None = Field(description="pass as offset for the next page; None at end")
    best: RankedCandidate | None
    candidates: list[RankedCandidate]
    records: int = Field(description="ledger records in this mode")
    chart_path: str | None = None


def _spread(rec: dict[str, Any]) -> float | None:
    if rec.get("mode") == "final":  # hidden cases' timing noise: the candidate can steer it
        return None
    spreads = [c["spread"] for c in rec.get("cases") or [] if c.get("spread") is not None]
    return statistics.median(spreads) if spreads else None


def _when(rec: dict[str, Any]) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(rec.get("time", 0.0))))


def primary_case_set(ws: Workspace, ledger: Ledger, mode: str) -> str | None:
    """The case set a mode is ranked on by default: the most recently scored hidden case set
    (final); else the full set (all dev cases, a command task's objective) once it has a
    passing record, and until then the most recently scored subset."""
    sets = ledger.case_sets(mode)
    if mode == "final":
        return sets[-1] if sets else None
    full = kind_of(ws.task).full_case_set
    return full if full in sets or not sets else sets[-1]


def rank_history(
    ws: Workspace,
    *,
    mode: Mode = "dev",
    offset: int = 0,
    limit: int = 20,
    include_failed: bool = False,
    chart: bool = False,
    case_set: str | None = None,
) -> HistoryPage:
    ws.ensure_exists()
    ledger = ws.ledger()
    records = ledger.records(mode)
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec.get("candidate", "")] = counts.get(rec.get("candidate", ""), 0) + 1
    cs = case_set if case_set is not None else primary_case_set(ws, ledger, mode)
    ranked = ledger.ranked(mode, case_set=cs) if cs is not None else []
    ckpt = Checkpoints(ws)
    rows: list[RankedCandidate] = []
    for i, rec in enumerate(ranked):
        rows.append(_row(rec, i + 1, counts, ckpt))
    if include_failed:
        passed = {r.candidate for r in rows}
        latest: dict[str, dict[str, Any]] = {}
        for rec in records:
            if rec.get("candidate", "") not in passed:
                latest[rec.get("candidate", "")] = rec
        for rec in sorted(latest.values(), key=lambda r: -float(r.get("time", 0.0))):
            rows.append(_row(rec, None, counts, ckpt))
    best = rows[0] if rows and rows[0].rank == 1 else None
    if best is not None:
        best.is_best = True
    page = rows[offset : offset + limit]
    charted = [r for r in records if r.get("case_set") == cs and counts_as_score(r)]
    chart_path = str(score_chart(ws, mode, charted, ledger)) if chart else None
    return HistoryPage(
        mode=mode,
        case_set=cs,
        case_sets=ledger.case_sets(mode),
        lower_is_better=not kind_of(ws.task).higher_is_better(ws.task, mode),
        total=len(rows),
        offset=offset,
        next_offset=offset + limit if offset + limit < len(rows) else None,
        best=best,
        candidates=page,
        records=len(records),
        chart_path=chart_path,
    )


def _row(
    rec: dict[str, Any], rank: int | None, counts: dict[str, int], ckpt: Checkpoints
) -> RankedCandidate:
    digest = str(rec.get("candidate", ""))
    return RankedCandidate(
        rank=rank,
        candidate=digest,
        score=rec.get("score"),
        spread=_spread(rec),
        status=str(rec.get("status", "")),
        config=rec.get("config") or {},
        when=_when(rec),
        record_id=str(rec.get("id", "")),
        evaluations=counts.get(digest, 0),
        meaningful=rec.get("meaningful"),
        restorable=bool(digest) and ckpt.exists(digest),
        case_set=str(rec.get("case_set") or ""),
        untrusted=bool(rec.get("untrusted")),
    )


def score_chart(ws: Workspace, mode: str, records: list[dict[str, Any]], ledger: Ledger) -> Path:
    """PNG of every passing record's score over time plus the best-so-far line."""
    points = [(float(r["time"]), float(r["score"])) for r in records if "time" in r]
    if not points:
        raise UsageError(
            f"no passing {mode} records to chart yet.",
            next_step="run run_objective first, or call rank_history with chart=false",
        )
    try:
        import matplotlib  # noqa: PLC0415 - optional extra, and slow to import

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise EnvironmentProblem(
            "matplotlib is not installed: no chart.",
            next_step="pip install 'harnesslab[plots]', or call rank_history with chart=false",
        ) from exc
    t0 = points[0][0]
    xs = [(t - t0) / 60.0 for t, _ in points]
    ys = [s for _, s in points]
    best: list[float] = []
    for s in ys:
        best.append(s if not best or ledger.better(s, best[-1], mode) else best[-1])
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        ax.plot(xs, ys, "o", alpha=0.6, label="evaluations")
        ax.step(xs, best, where="post", label="best so far")
        ax.set_xlabel("minutes since first record")
        ax.set_ylabel(f"score ({kind_of(ws.task).score_label(ws.task, mode)})")
        ax.set_title(f"{ws.task.name}: {mode} score over time")
        ax.legend()
        rel = f"{STATE}/charts/{mode}-{time.strftime('%Y%m%dT%H%M%S')}.png"
        png = io.BytesIO()
        fig.savefig(png, format="png")
        wf.write_bytes(ws.root, rel, png.getvalue())
    finally:
        plt.close(fig)
    return ws.root / rel


class RestoreResult(BaseModel):
    restored: str = Field(description="candidate hash now in the workspace")
    previous: str | None = Field(description="checkpoint of the files before the restore")
    changed: list[str] = Field(description="files rewritten (empty: already identical)")
    score: float | None = Field(description="the restored candidate's best score in this mode")
    mode: str
    case_set: str | None = Field(default=None, description="the case set `score` is on")


def restore_candidate(
    ws: Workspace, *, candidate: str | None = None, mode: Mode = "dev"
) -> RestoreResult:
    """Restore `candidate` (a hash from rank_history), or the best of `mode` on its default
    case set. The current files are checkpointed first, so the restore itself can be undone
    the same way. Only the task's editable files are written, from re-hashed checkpoints."""
    ws.ensure_exists()
    ckpt = Checkpoints(ws)
    ledger = ws.ledger()
    cs = primary_case_set(ws, ledger, mode)
    if candidate is not None:
        if not HASH_RE.match(candidate):
            raise UsageError(
                f"candidate {candidate!r} is not a candidate hash.",
                next_step="pass a 16-hex-digit hash from rank_history, or omit it for the best",
            )
        matches = [
            d.name for d in ckpt.root.glob(f"{candidate}*") if d.is_dir() and ckpt.exists(d.name)
        ]
        if len(matches) != 1:
            raise UsageError(
                f"candidate {candidate!r} matches {len(matches)} checkpoints.",
                next_step="pass a full hash from rank_history",
            )
        digest = matches[0]
    else:
        best = ledger.best(mode, case_set=cs) if cs is not None else None
        if best is None:
            raise UsageError(
                f"no passing {mode} candidate yet: nothing to restore.",
                next_step="run run_objective (or guarded_final_verify for mode=final) first",
            )
        digest = best["candidate"]
    outcome = ckpt.restore(digest)
    scores = [
        r["score"]
        for r in ledger.records(mode)
        if r.get("candidate") == digest and r.get("case_set") == cs and counts_as_score(r)
    ]
    score = None
    for s in scores:
        score = s if score is None or ledger.better(s, score, mode) else score
    return RestoreResult(
        restored=outcome["restored"],
        previous=outcome["previous"],
        changed=outcome["changed"],
        score=score,
        mode=mode,
        case_set=cs if score is not None else None,
    )


__all__ = [
    "FULL_DEV_SET",
    "HistoryPage",
    "RankedCandidate",
    "RestoreResult",
    "primary_case_set",
    "rank_history",
    "restore_candidate",
]
