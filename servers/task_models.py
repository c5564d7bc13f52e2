"""Input and output models of the kernel task server's tools: what crosses the MCP boundary.

Inputs are flat (one level, every field with a default and a description written for the model);
outputs are compact and capped: long lists come with a total and a way to get the rest.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from harnesslab.tools.evaluation import MAX_REPEATS, MAX_WARMUP, CaseResult
from harnesslab.tools.evaluation.sweep import ConfigResult

# Names that reach files, commands or the runner: no '..', no '/', no shell metacharacters.
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
CaseName = Annotated[str, Field(pattern=SAFE_NAME, description="a dev case name")]
KnobValue = int | float | str | bool
MAX_CASES_SHOWN = 32


# -- inputs -------------------------------------------------------------------------------------


class InspectIn(BaseModel):
    recent: int = Field(default=5, ge=0, le=50, description="how many recent ledger records")


class ObjectiveIn(BaseModel):
    cases: list[CaseName] | None = Field(
        default=None,
        max_length=16,
        description="dev case names to run (default: all; inspect_context lists them)",
    )
    warmup: int | None = Field(
        default=None, ge=0, le=MAX_WARMUP, description="untimed calls before timing (default 10)"
    )
    repeats: int | None = Field(
        default=None, ge=1, le=MAX_REPEATS, description="timed samples per case (default 30)"
    )


class SweepIn(BaseModel):
    space: dict[str, list[KnobValue]] | None = Field(
        default=None,
        description="knob -> values to try, a sub-space of the task's launch space "
        "(default: the whole declared space, sampled down to max_configs)",
    )
    cases: list[CaseName] | None = Field(
        default=None, max_length=16, description="dev case names (default: all)"
    )
    max_configs: int = Field(default=16, ge=1, le=256, description="configs to evaluate at most")
    apply: bool = Field(
        default=False,
        description="write the best correct config into kernel_config.json (checkpointed first)",
    )
    show: int = Field(default=10, ge=1, le=64, description="results to return (best first)")


class ProbeIn(BaseModel):
    probes: list[Annotated[str, Field(pattern=SAFE_NAME)]] | None = Field(
        default=None, max_length=32, description="probe names (default: all; see inspect_context)"
    )
    dtypes: list[Literal["float16", "bfloat16", "float32"]] | None = Field(
        default=None, max_length=3, description="dtypes to probe (default: the task's)"
    )
    show_passed: bool = Field(
        default=False, description="also return the passing probes' errors (default: failures)"
    )


class VerifyIn(BaseModel):
    rotate: bool = Field(
        default=False,
        description="draw a NEW hidden case set first (earlier final scores stop being comparable)",
    )


class HistoryIn(BaseModel):
    mode: Literal["dev", "final", "sweep"] = Field(
        default="dev", description="which evaluations: dev (run_objective), final (verify), sweep"
    )
    offset: int = Field(default=0, ge=0, le=1_000_000, description="skip this many candidates")
    limit: int = Field(default=10, ge=1, le=100, description="candidates to return")
    include_failed: bool = Field(
        default=False, description="also list candidates that never passed (after the ranked)"
    )
    chart: bool = Field(
        default=False, description="save a PNG of score over time under .harnesslab/charts/"
    )
    case_set: str | None = Field(
        default=None,
        max_length=2000,
        description="rank on this case set (scores compare only within one); default: all dev "
        "cases, or the latest hidden case set for mode=final",
    )


class RestoreIn(BaseModel):
    candidate: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{6,64}$",
        description="candidate hash (or a unique prefix) from rank_history; default: the best",
    )
    mode: Literal["dev", "final"] = Field(
        default="dev", description="whose best to restore when no candidate is given"
    )


class ProfileIn(BaseModel):
    case: CaseName | None = Field(
        default=None,
        description="dev case to profile (default: the largest dev case); a step task: a dev "
        "trace (default: its first)",
    )
    repeats: int = Field(
        default=3, ge=1, le=20, description="profiled launches (a step task: profiled steps)"
    )


class HealthIn(BaseModel):
    runner: bool = Field(
        default=True,
        description="also send the GPU-side runner a health request (imports torch: ~3 s)",
    )


# -- outputs ------------------------------------------------------------------------------------


class ObjectiveOut(BaseModel):
    status: Literal["passed", "failed", "error"]
    score: float | None = Field(description="kernel: sum of case medians in us; command: score")
    score_unit: str = Field(description="unit and direction of score")
    meaningful: bool | None = Field(
        description="false on the Triton CPU interpreter: timings say nothing; null when a "
        "command task's objective does not say"
    )
    candidate: str = Field(description="hash of the editable files evaluated")
    record_id: str | None
    best_score: float | None = Field(description="best passing score before this run")
    delta_vs_best_pct: float | None = Field(description="(score - best)/best*100")
    is_new_best: bool
    reason: str = ""
    cases: list[CaseResult] = Field(default_factory=list, description="per-case table (kernel)")
    command: dict[str, Any] | None = Field(
        default=None, description="command tasks: exit_code, output JSON, stderr_tail"
    )
    device: str = ""
    host: str = Field(default="", description="the machine it ran on (a cluster's node)")
    gpu_index: str | None = Field(default=None, description="the GPU of that machine")
    wall_s: float = Field(description="wall time of the runner (or command) process")
    phases_s: dict[str, float] = Field(
        default_factory=dict,
        description="kernel: where this call's seconds went (host: snapshot, stage, gpu_lock, "
        "sync, transport, result; runner_*: load, inputs, correctness, timing, ...)",
    )
    next_step: str


class SweepOut(BaseModel):
    status: Literal["passed", "failed"]
    meaningful: bool
    tried: int
    ok: int
    by_status: dict[str, int] = Field(description="configs per status: ok, compile_error, ...")
    best: ConfigResult | None
    current_config: dict[str, Any]
    current_score_us: float | None
    improvement_pct: float | None = Field(description="best vs the current config, % faster")
    applied: bool
    applied_checkpoint: str | None
    results: list[ConfigResult] = Field(description="best first, failures last; capped by show")
    results_total: int
    full_results_path: str = Field(description="JSON file with every config's result")
    cases: list[str]
    compile_s: float = Field(description="from the start to the last compile's end")
    timing_s: float = Field(description="from the first timing request to the last result")
    wall_s: float = Field(description="both together: they overlap (timing starts early)")
    compile_workers: int = Field(default=0, description="warm compile workers the sweep used")
    timing_requests: int = Field(default=0, description="timing runner requests (batches)")
    next_step: str


class ProbeOut(BaseModel):
    status: Literal["passed", "failed", "error"]
    passed: int
    failed: int
    failing: list[str]
    results: list[dict[str, Any]] = Field(description="failures (and passes if show_passed)")
    candidate: str
    reason: str = ""
    next_step: str


class HiddenCase(BaseModel):
    """A hidden case as the agent sees it: no shape, no per-case time (a time next to the
    kernel's known bandwidth estimates the shape), no error value (the candidate chooses it);
    every case shows the verdict (which one failed is not said); score_us is over all cases."""

    index: int
    dtype: str
    status: str
    passed: bool
    reason: str = ""


class VerifyOut(BaseModel):
    verdict: Literal["passed", "rejected", "error"]
    reasons: list[dict[str, str]]
    score_us: float | None
    score: float | None = Field(default=None, description="the verdict's score, in score_unit")
    score_unit: str = Field(default="", description="unit and direction of score")
    geomean_pct_of_copy_bw: float | None
    case_set: str = Field(description="public id of the hidden case set (changes on rotate)")
    best_final_score_us: float | None
    is_new_best: bool
    meaningful: bool | None
    certifies: str = Field(
        default="nothing",
        description="what a passed verdict certifies: correctness_and_speed (GPU: the recorded "
        "Triton launches replayed without agent Python), outputs (CPU interpreter: correct "
        "outputs only; who computed them is not verified), step_outputs (a step task: every "
        "step's logits and the KV cache correct on hidden traces, the score the step's p50 "
        "latency as the trusted parent times it; which kernels computed them is not verified), "
        "step_replayed (a step task on a GPU: the same checks, and the timed steps are the "
        "candidate's recorded kernels and torch operators replayed by the harness), "
        "task_verifier (a command task's own final "
        "objective), nothing",
    )
    unverified: list[str] = Field(
        default_factory=list,
        description="claims this verdict could not verify (the candidate process's own reports)",
    )
    cases: list[HiddenCase] = Field(description="per hidden case, shapes withheld")
    evidence: dict[str, Any]
    next_step: str


class RestoreOut(BaseModel):
    restored: str
    previous: str | None
    changed: list[str]
    score: float | None
    mode: str
    case_set: str | None = Field(default=None, description="the case set `score` is on")
    next_step: str
