"""Typed results crossing the library boundary (the MCP servers return these as structured
output). Units live in the names."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class StepBucket(BaseModel):
    """One row of a step task's per-bucket table: the steps of one trace whose longest context
    fits `bucket` ("all": the whole trace). Latencies are per decode step, from the timed pass;
    correctness from the checked pass (stale KV slots poisoned)."""

    bucket: int | str
    checked_steps: int = Field(description="steps of the checked pass in this bucket")
    failed_steps: int = Field(description="of those, steps whose logits were wrong or raised")
    steps: int = Field(description="timed steps (0: the checked pass failed, nothing timed)")
    p50_us: float | None = None
    p95_us: float | None = None
    p99_us: float | None = None
    host_p50_us: float | None = Field(default=None, description="the host's time in step()")
    device_p50_us: float | None = Field(
        default=None, description="the stream primed so launches queue up: device time alone"
    )
    device_p95_us: float | None = None
    launch_overhead_us: float | None = Field(default=None, description="p50 minus device p50")
    tokens_per_s: float | None = None


class CaseResult(BaseModel):
    name: str
    dtype: str
    shape: dict[str, int] = Field(default_factory=dict)
    rows: int | None = None
    dim: int | None = None
    passed: bool
    status: Literal["passed", "failed", "error", "timeout"] = "failed"
    reason: str = ""
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    spread: float | None = Field(default=None, description="(p90-p10)/median")
    launch_overhead_us: float | None = Field(
        default=None, description="single eager call minus device time: host launch latency"
    )
    host_us: float | None = Field(
        default=None, description="one eager call from Python with the GPU idle (includes launch)"
    )
    sync_tail_us: float | None = Field(
        default=None,
        description="end event -> event after a whole-device sync; large values mean work left "
        "on other streams",
    )
    gbps: float | None = None
    pct_of_copy_bw: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    timing_method: str | None = None
    samples: int | None = Field(
        default=None, description="timing samples taken (adaptive: fewer when the median is stable)"
    )
    median_ci_rel: float | None = Field(
        default=None, description="95% confidence half-width of the median, relative to it"
    )
    buckets: list[StepBucket] | None = Field(
        default=None,
        description="a step task's trace: its per-bucket table, the whole trace last; "
        "median_us is the trace's p50 step latency",
    )


class EnvInfo(BaseModel):
    device: str = "unknown"
    torch: str | None = None
    triton: str | None = None
    cuda: str | None = None
    driver: str | None = None
    host: str | None = None
    gpu_index: str | None = None
    meaningful: bool = False
    sandbox: str = Field(
        default="none",
        description="how the process that ran the candidate was contained (full: Landlock, "
        "namespaces, seccomp; partial; none), as the sandbox itself reported it",
    )


class EvalResult(BaseModel):
    """One evaluation of the workspace as it stood."""

    status: Literal["passed", "failed", "error"]
    score_us: float | None = Field(
        description="sum of per-case median device time; lower is better"
    )
    meaningful: bool = Field(description="false on the Triton CPU interpreter: timings say nothing")
    reason: str = ""
    cases: list[CaseResult]
    candidate: str = Field(description="sha256 prefix over the editable files")
    config: dict[str, Any] = Field(default_factory=dict)
    mode: str = "dev"
    record_id: str | None = None
    best_score_us: float | None = None
    delta_vs_best_pct: float | None = Field(
        default=None, description="(score - best)/best*100; negative is faster"
    )
    is_new_best: bool = False
    geomean_pct_of_copy_bw: float | None = None
    copy_gbps: float | None = None
    env: EnvInfo = Field(default_factory=EnvInfo)
    seed: int | None = None
    wall_s: float = 0.0
    phases_s: dict[str, float] = Field(
        default_factory=dict,
        description="where the call's seconds went: host (snapshot, stage, gpu_lock, sync, "
        "transport, result) and runner (runner_load, runner_inputs, runner_correctness, "
        "runner_timing_inputs, runner_timing, ...)",
    )

    def table(self) -> list[dict[str, Any]]:
        return [c.model_dump(exclude_none=True) for c in self.cases]


__all__ = ["CaseResult", "EnvInfo", "EvalResult", "StepBucket"]
