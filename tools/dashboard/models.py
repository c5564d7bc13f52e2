"""What the operator's dashboard shows, as typed data: runs, the ledger, tool usage, generated
servers, the lab and compare reports. tools/dashboard/gather.py fills these from the readers of
the trusted store and the workspace; servers/dashboard_page.py renders them.

Side of the trust boundary: trusted, read-only, and the operator's. Nothing here holds a hidden
case's shape or a per-case hidden timing: final records carry their public fields only (the
ledger's final records are the public verdict, tools/integrity/verdict_view.py), and the store's
hidden results are never read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..lab.claims import Claim


class ScoreView(BaseModel):
    """One verified score of a run (baseline, an iteration, the final re-verify)."""

    verdict: str
    score: float | None = None
    candidate: str | None = None
    case_set: str = ""
    certifies: str = ""
    meaningful: bool = False
    reason: str = Field(default="", description="the public reason, or the scoring error")


class Point(BaseModel):
    """A point of a run's score plot."""

    kind: Literal["baseline", "iteration", "final"]
    iteration: int = Field(description="0: the baseline; the final gets planned + 1")
    label: str
    t_s: float = Field(description="seconds since the run started")
    score: float | None = Field(description="None: no passing score (rejected or error)")
    verdict: str
    new_best: bool = False


class IterationView(BaseModel):
    index: int
    phase: str = Field(description="the step in progress, or the last one done")
    running: bool
    started_at: float
    finished_at: float | None = None
    elapsed_s: float
    attempt: str = Field(default="", description="the attempt's status ('' before it ends)")
    attempt_detail: str = ""
    build: str = Field(default="", description="the build turn's status, or why it was skipped")
    score: ScoreView | None = None
    new_best: bool = False
    servers: list[str] = Field(default_factory=list, description="'name: status' per server")
    tool_calls: int = 0
    error: str = ""


class RunView(BaseModel):
    run_id: str
    problem: str = Field(default="", description="why the run state could not be read (all of it)")
    task: str = ""
    runner: str = ""
    status: str = "unknown"
    stop_reason: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    planned: int = 0
    unit: str = ""
    higher_is_better: bool = False
    meaningful: bool = False
    baseline: ScoreView | None = None
    best_score: float | None = None
    best_candidate: str | None = None
    best_iteration: int | None = None
    final: ScoreView | None = None
    iterations: list[IterationView] = Field(default_factory=list)
    points: list[Point] = Field(default_factory=list)
    error: str = ""


class CandidateRow(BaseModel):
    """One ledger record: aggregate figures only (a final record is the public verdict)."""

    record_id: str
    time: float | None = None
    mode: str
    case_set: str = ""
    candidate: str = ""
    status: str = ""
    score: float | None = None
    geomean_pct_of_copy_bw: float | None = None
    certifies: str = ""
    sandbox: str = ""
    meaningful: bool = False
    reason: str = ""
    is_best: bool = Field(default=False, description="the best pointer of its mode")


class LedgerView(BaseModel):
    rows: list[CandidateRow] = Field(default_factory=list, description="newest first")
    total: int = 0
    unit: str = ""
    lower_is_better: dict[str, bool] = Field(default_factory=dict, description="per mode")
    best: dict[str, str] = Field(default_factory=dict, description="mode -> best candidate")
    problem: str = ""


class ToolRow(BaseModel):
    server: str
    tool: str
    calls: int
    failures: int = Field(description="calls whose status is not ok")
    statuses: dict[str, int]
    median_ms: float | None = None
    p90_ms: float | None = None
    max_ms: float | None = None


class IterationCalls(BaseModel):
    run_id: str
    iteration: int
    calls: dict[str, int] = Field(description="server.tool -> calls in the iteration's window")


class ToolsView(BaseModel):
    rows: list[ToolRow] = Field(default_factory=list)
    per_iteration: list[IterationCalls] = Field(default_factory=list)
    total_calls: int = 0
    failures: int = 0
    problem: str = ""


class CheckView(BaseModel):
    name: str
    passed: bool
    evidence: str = Field(default="", description="its first line")


class ServerView(BaseModel):
    name: str
    status: str
    tools: list[str] = Field(default_factory=list)
    reason: str = ""
    updated: float | None = None
    qualified: bool | None = Field(default=None, description="the last qualification passed")
    qualified_at: float | None = None
    duration_s: float | None = None
    bundle_hash: str = ""
    checks: list[CheckView] = Field(default_factory=list)


class ServersView(BaseModel):
    servers: list[ServerView] = Field(default_factory=list)
    problem: str = ""


class LabCell(BaseModel):
    strategy: str
    status: str
    passed: bool
    median_us: float | None = None
    value: float | None = Field(default=None, description="% of copy bandwidth, or TFLOP/s")
    speedup: float | None = Field(default=None, description="over torch eager (time ratio)")


class LabTask(BaseModel):
    name: str
    metric: str = Field(description="'% copy' or 'TFLOP/s'")
    best_strategy: str | None = None
    strategies: list[str]
    cases: list[str]
    cells: list[list[LabCell | None]] = Field(description="cases x strategies")


class LabView(BaseModel):
    folder: str
    date: str = ""
    device: str = ""
    meaningful: bool = False
    incomplete: str = ""
    tasks: list[LabTask] = Field(default_factory=list)
    plots: list[str] = Field(default_factory=list, description="PNG names in the folder")
    claims: list[Claim] = Field(default_factory=list)
    claim_counts: dict[str, int] = Field(default_factory=dict)
    problem: str = ""


class CompareArmView(BaseModel):
    arm: str
    runner: str
    harnessed: bool
    servers: list[str] = Field(default_factory=list)
    trials: int
    valid: int
    median: float | None = None
    p10: float | None = None
    p90: float | None = None
    runs: list[RunView] = Field(default_factory=list, description="each trial's run")


class CompareView(BaseModel):
    folder: str
    task: str = ""
    unit: str = ""
    higher_is_better: bool = False
    meaningful: bool | None = None
    difference: dict[str, Any] = Field(default_factory=dict)
    arms: list[CompareArmView] = Field(default_factory=list)
    plot: str = Field(default="", description="scores.png when the folder has it")
    problem: str = ""


class Dashboard(BaseModel):
    """Everything the page shows, at one moment."""

    generated_at: float
    workspace: str
    task: str = ""
    runs: list[RunView] = Field(default_factory=list, description="newest first")
    ledger: LedgerView = Field(default_factory=LedgerView)
    tools: ToolsView = Field(default_factory=ToolsView)
    servers: ServersView = Field(default_factory=ServersView)
    labs: list[LabView] = Field(default_factory=list)
    compares: list[CompareView] = Field(default_factory=list)
    missing: list[str] = Field(
        default_factory=list, description="what the page cannot show yet, and why"
    )


class DiffLine(BaseModel):
    tag: Literal["same", "add", "del", "skip"]
    old_no: int | None = None
    new_no: int | None = None
    count: int = Field(default=0, description="skip: unchanged lines left out")


class FileDiff(BaseModel):
    path: str
    old_text: str = Field(description="the file in the best checkpoint")
    new_text: str = Field(description="the file in the candidate's checkpoint")
    lines: list[DiffLine]
    changed: bool


class CandidateDiff(BaseModel):
    candidate: str
    best: str | None = None
    best_label: str = ""
    files: list[FileDiff] = Field(default_factory=list)
    problem: str = ""


__all__ = [
    "CandidateDiff",
    "CandidateRow",
    "CheckView",
    "CompareArmView",
    "CompareView",
    "Dashboard",
    "DiffLine",
    "FileDiff",
    "IterationCalls",
    "IterationView",
    "LabCell",
    "LabTask",
    "LabView",
    "LedgerView",
    "Point",
    "RunView",
    "ScoreView",
    "ServerView",
    "ServersView",
    "ToolRow",
    "ToolsView",
]
