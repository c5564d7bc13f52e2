"""The loop's persistent state: run config, per-iteration records, the best pointer, and the
summary built from them. Everything here is written atomically after every step, so that
`harnesslab run --resume RUN_ID` continues where a crash or Ctrl-C left off."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution.procgroup import kill_group
from ..state import Workspace
from ..state import workspace_files as wf
from ..state.storage import atomic_write_json
from .runners import RunnerName, TurnOutcome

Step = Literal["attempt", "score", "build", "qualify", "done"]
# agent_failed: the loop finished, but no attempt ran to completion (every one failed to start or
# exited with an error), so its scores are the untouched workspace's.
RunStatus = Literal["running", "completed", "stopped", "interrupted", "failed", "agent_failed"]
# Attempt statuses where the agent never got to work. Cut off by the time limit or by a loop
# that died (timeout, interrupted) it did work, and that work was scored.
NEVER_RAN = ("failed", "not_started")


class RunConfig(BaseModel):
    """How a run goes. Stored in the run folder; a resumed run uses the stored one."""

    task: str = Field(description="task name or task folder the workspace was made from")
    workspace: Path
    iterations: int = Field(default=3, ge=1, le=1000)
    runner: RunnerName = "autopilot"
    agent_cmd: str = Field(default="", description="exec runner command template")
    agent_args: list[str] = Field(default_factory=list, description="extra runner arguments")
    attempt_timeout_s: float = Field(default=300.0, gt=0)
    attempt_timeouts_s: list[float] = Field(
        default_factory=list,
        description="per-iteration attempt limits (HarnessGym's --attempt-timeouts 5m,8m); the "
        "last one holds for later iterations; empty: attempt_timeout_s",
    )
    build_timeout_s: float = Field(default=300.0, gt=0)
    repair_attempts: int = Field(
        default=1, ge=0, le=5, description="repair turns after a failed qualification"
    )
    task_text: str = Field(
        default="", max_length=200_000, description="the brief, given inline instead of task.md"
    )
    score_baseline: bool = Field(
        default=True, description="score the untouched workspace first (compare's trials skip it)"
    )
    final_verify: bool = Field(
        default=True, description="restore the best and verify it again at the end"
    )
    stop_score: float | None = Field(default=None, description="stop once verified this good")
    budget_s: float | None = Field(
        default=None,
        gt=0,
        description="wall-clock seconds from the run's start after which no new iteration "
        "starts (the one running finishes, then the final restore and verify)",
    )
    higher_is_better: bool = False
    score_key: str = Field(default="score_us", description="what a score is (from the task)")
    unit: str = Field(default="us", description="unit of the scores (from the task)")
    optimization_mode: bool = Field(
        default=True, description="checkpoint the best verified workspace; restore it at the end"
    )
    restore_best: bool = True
    build: Literal["auto", "always", "never"] = Field(
        default="auto", description="auto: build after every attempt until solved"
    )
    output_cap_bytes: int = Field(default=4 << 20, ge=4096)
    gpu: dict[str, Any] = Field(
        default_factory=dict, description="executor settings that differ from the defaults"
    )

    def attempt_limit_s(self, iteration: int) -> float:
        """The attempt limit of iteration `iteration` (1-based)."""
        if not self.attempt_timeouts_s:
            return self.attempt_timeout_s
        return self.attempt_timeouts_s[min(iteration, len(self.attempt_timeouts_s)) - 1]


class Score(BaseModel):
    """One independent guarded verification of the workspace as it stood."""

    verdict: Literal["passed", "rejected", "error"]
    score_us: float | None = None
    candidate: str | None = None
    case_set: str = ""
    meaningful: bool = False
    certifies: str = Field(
        default="", description="what the verdict certifies (correctness_and_speed, outputs, ...)"
    )
    reasons: list[str] = Field(default_factory=list)
    error: str = ""
    wall_s: float = 0.0
    incumbent: str | None = Field(default=None, description="checkpoint timed alongside (ABBA)")
    speedup_vs_incumbent: float | None = Field(
        default=None, description="geomean incumbent/candidate time over the cases; >1 is faster"
    )
    faster_than_incumbent: bool | None = None
    slot: str = Field(default="", description="the GPU slot it was verified on (host:gpuN)")


class Best(BaseModel):
    score_us: float
    candidate: str = Field(description="checkpoint hash under .harnesslab/checkpoints/")
    iteration: int = Field(description="0 = the baseline")
    case_set: str


class ServerOutcome(BaseModel):
    name: str
    status: Literal["registered", "quarantined", "failed"]
    repaired: bool = False
    report: str = ""
    tools: list[str] = Field(default_factory=list)


class Iteration(BaseModel):
    index: int
    step: Step = "attempt"
    running: Step | None = Field(default=None, description="step in progress (crash marker)")
    started_at: float = Field(default_factory=time.time)
    finished_at: float | None = None
    attempt: TurnOutcome | None = None
    score: Score | None = None
    new_best: bool = False
    build: TurnOutcome | None = None
    build_skipped: str = ""
    candidates: list[str] = Field(
        default_factory=list, description="generated servers the build created or changed"
    )
    repair: TurnOutcome | None = None
    repairs: int = Field(default=0, description="repair turns run in this iteration")
    qualification: list[dict[str, Any]] = Field(default_factory=list)
    servers: list[ServerOutcome] = Field(default_factory=list)
    active_servers: list[str] = Field(default_factory=list)
    session_id: str | None = None
    reset_to_best: str | None = Field(
        default=None, description="checkpoint restored after a broken attempt (optimization mode)"
    )
    error: str = Field(
        default="", description="an unexpected error that ended this iteration (scored 'error')"
    )


class RunState(BaseModel):
    run_id: str
    config: RunConfig
    status: RunStatus = "running"
    stop_reason: str = ""
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    baseline: Score | None = None
    best: Best | None = None
    iterations: list[Iteration] = Field(default_factory=list)
    restored: dict[str, Any] | None = None
    final: Score | None = None
    finished: bool = False
    active: list[dict[str, Any]] = Field(
        default_factory=list, description="process groups started and not yet reaped: {pid, start}"
    )
    resumes: int = 0
    error: str = ""


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class RunStore:
    """A run's two folders. Its state (config, runner, executor settings, scores, best, the
    process groups it started) is trusted and lives in the workspace's trusted store
    (`<store>/runs/<run-id>/`): `--resume` believes only that. Its artifacts (prompts,
    transcripts, turn configs, summary.json) are for people and agents to read and live in the
    workspace (`.harnesslab/runs/<run-id>/`)."""

    def __init__(self, ws: Workspace, run_id: str) -> None:
        if not RUN_ID_RE.match(run_id or ""):
            raise UsageError(
                f"bad run id {run_id!r}.", next_step="use an id `harnesslab run` printed"
            )
        self.ws = ws
        self.dir = ws.runs_dir / run_id
        self.artifacts_rel = f"{wf.inside(ws.root, ws.artifacts_dir)}/{run_id}"
        self.run_id = run_id

    @property
    def artifacts(self) -> Path:
        return self.ws.root / self.artifacts_rel

    @property
    def state_path(self) -> Path:
        return self.dir / "state.json"

    def iteration_dir(self, index: int) -> Path:
        """An iteration's artifact folder in the workspace."""
        return self.artifacts / f"iter-{index:02d}"

    def fresh_turn_dir(self, index: int, phase: str) -> Path:
        """A turn's artifact folder, emptied first: files the agent planted there (a symlink
        named prompt.md or stdout.txt) must not be where the loop writes."""
        rel = f"{self.artifacts_rel}/iter-{index:02d}/{phase}"
        path = self.ws.root / rel
        if path.is_symlink():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        return wf.real_dir(self.ws.root, rel)

    def save(self, state: RunState) -> None:
        state.updated_at = time.time()
        atomic_write_json(self.state_path, json.loads(state.model_dump_json()))

    def load(self) -> RunState:
        if not self.state_path.is_file():
            raise UsageError(
                f"no run {self.run_id!r} in the trusted store of {self.ws.root}.",
                next_step="start a new run without --resume (runs from before the trusted store "
                "cannot be resumed)",
            )
        return RunState.model_validate_json(self.state_path.read_text())

    def write(self, rel: str, obj: Any) -> None:
        """A trusted record of the run (scores, best, config)."""
        atomic_write_json(self.dir / rel, obj)

    def write_artifact(self, rel: str, obj: Any) -> None:
        """A file of the run for people and agents to read, in the workspace."""
        if self.ws.root.is_dir():
            wf.write_json(self.ws.root, f"{self.artifacts_rel}/{rel}", obj)


def is_better(a: float, b: float, higher_is_better: bool) -> bool:
    return a > b if higher_is_better else a < b


def reached(score: float | None, stop: float | None, higher_is_better: bool) -> bool:
    if score is None or stop is None:
        return False
    return score >= stop if higher_is_better else score <= stop


def agent_never_ran(state: RunState) -> str:
    """'' when some attempt ran (finished, or was cut off); else the first attempt's error,
    which says why the agent never got to work."""
    attempts = [it.attempt for it in state.iterations if it.attempt is not None]
    if not attempts:  # every attempt step broke before it recorded a turn
        errors = [it.error for it in state.iterations if it.error.startswith("attempt:")]
        return errors[0] if errors and len(errors) == len(state.iterations) else ""
    if any(a.status not in NEVER_RAN for a in attempts):
        return ""
    return next((a.error for a in attempts if a.error), attempts[0].status)


def process_start(pid: int) -> str:
    """The kernel's start time of `pid` (Linux /proc), to tell our process from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def kill_leftovers(procs: list[dict[str, Any]]) -> list[int]:
    """Kill process groups a crashed loop left behind (recorded in state.json as {pid, start}).
    Only a group whose leader is still the same process (same start time) is touched."""
    killed = []
    for rec in procs:
        pid = int(rec.get("pid", 0))
        try:
            if pid <= 0 or os.getpgid(pid) != pid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        # No recorded start time: nothing tells our process from a reused pid; leave it.
        if not rec.get("start") or process_start(pid) != rec["start"]:
            continue
        kill_group(pid, signal.SIGKILL)
        killed.append(pid)
    return killed


def tool_calls(telemetry: list[dict[str, Any]], start: float, end: float | None) -> dict[str, int]:
    """MCP tool calls recorded in telemetry between start and end, per server.tool."""
    return _window(telemetry, start, end)[0]


def _window(
    records: Iterable[dict[str, Any]], start: float, end: float | None
) -> tuple[dict[str, int], float]:
    """(calls per server.tool, seconds spent in GPU tools) between start and end."""
    counts: Counter[str] = Counter()
    gpu_s = 0.0
    for rec in records:
        t = rec.get("time")
        if not isinstance(t, int | float) or t < start or (end is not None and t > end):
            continue
        counts[f"{rec.get('server', '?')}.{rec.get('tool', '?')}"] += 1
        if rec.get("gpu") is True and isinstance(rec.get("duration_ms"), int | float):
            gpu_s += rec["duration_ms"] / 1e3
    return dict(sorted(counts.items())), gpu_s


def summarize(state: RunState, telemetry: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json: baseline vs best, per-iteration scores, servers built, tool calls
    (`telemetry`: the workspace's telemetry records, Workspace.telemetry_records())."""
    cfg = state.config
    base = state.baseline.score_us if state.baseline else None
    best = state.best.score_us if state.best else None
    # The direction and unit are the task's (start_run copies them into the config).
    improvement = None
    if base and best is not None:
        improvement = 100.0 * (best - base) / base * (1 if cfg.higher_is_better else -1)
    records = telemetry  # read once: every window below is a slice of it
    iterations = []
    for it in state.iterations:
        iterations.append(
            {
                "iteration": it.index,
                "attempt": _turn(it.attempt),
                "score": it.score.model_dump() if it.score else None,
                "new_best": it.new_best,
                "build": _turn(it.build) if it.build else {"skipped": it.build_skipped},
                "repair": _turn(it.repair) if it.repair else None,
                "servers": [s.model_dump() for s in it.servers],
                "active_servers": it.active_servers,
                "error": it.error,
                "tool_calls": _window(records, it.started_at, it.finished_at)[0],
                "wall_s": round((it.finished_at or time.time()) - it.started_at, 1),
                # when it ended, in seconds from the run's start: the x axis of a score curve
                "at_s": round((it.finished_at or time.time()) - state.created_at, 1),
            }
        )
    start = state.iterations[0].started_at if state.iterations else state.created_at
    calls, tool_gpu_s = _window(records, start, None)
    scores = [state.baseline, state.final, *(it.score for it in state.iterations)]
    scoring_s = sum(s.wall_s for s in scores if s is not None)
    meaningful = any(s.meaningful for s in (state.baseline, state.final) if s is not None)
    return {
        "run_id": state.run_id,
        "task": cfg.task,
        "workspace": str(cfg.workspace),
        "runner": cfg.runner,
        "status": state.status,
        "stop_reason": state.stop_reason,
        "meaningful": meaningful,
        "higher_is_better": cfg.higher_is_better,
        "score_key": cfg.score_key,
        "unit": cfg.unit,
        "iterations_planned": cfg.iterations,
        "iterations_done": sum(1 for it in state.iterations if it.step == "done"),
        "baseline": state.baseline.model_dump() if state.baseline else None,
        "best": state.best.model_dump() if state.best else None,
        "improvement_pct": improvement,
        "restored": state.restored,
        "final": state.final.model_dump() if state.final else None,
        "iterations": iterations,
        "servers_built": [s.model_dump() for it in state.iterations for s in it.servers],
        "tool_calls": calls,
        # Wall seconds of GPU-backed work: calls of tools that take the GPU lock plus every
        # scoring verify (process start included, so an upper bound on GPU-held time).
        "gpu_work_s": {
            "tools": round(tool_gpu_s, 1),
            "scoring": round(scoring_s, 1),
            "total": round(tool_gpu_s + scoring_s, 1),
        },
        "wall_s": round(state.updated_at - state.created_at, 1),
        "error": state.error,
    }


def _turn(t: TurnOutcome | None) -> dict[str, Any] | None:
    if t is None:
        return None
    claim = t.result or {}
    return {
        "status": t.status,
        "exit_code": t.exit_code,
        "timed_out": t.timed_out,
        "duration_s": round(t.duration_s, 1),
        "error": t.error,
        "claimed": {k: claim[k] for k in ("status", "summary", "score_us") if k in claim},
        "result_error": t.result_error,
    }


__all__ = [
    "Best",
    "Iteration",
    "RunConfig",
    "RunState",
    "RunStatus",
    "RunStore",
    "Score",
    "ServerOutcome",
    "agent_never_ran",
    "is_better",
    "kill_leftovers",
    "new_run_id",
    "process_start",
    "reached",
    "summarize",
    "tool_calls",
]
