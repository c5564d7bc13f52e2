"""The guarded final verification's verdict as the operator sees it: every figure (per-case
times, errors, the incumbent's comparison, the evidence). verify.py decides it; what an agent may
read of it is verdict_view.py's.

Side of the trust boundary: trusted; it holds what hidden cases decided, so it leaves the
trusted side only through verdict_view (or the operator's `--reveal-cases`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from ..evaluation import EvalResult
from .reasons import CERTIFIES


class Verdict(BaseModel):
    verdict: Literal["passed", "rejected", "error"]
    reasons: list[dict[str, str]] = Field(
        default_factory=list, description="[{code, detail}] why the verdict is what it is"
    )
    warnings: list[dict[str, str]] = Field(
        default_factory=list, description="[{code, detail}] soft findings; they do not reject"
    )
    score_us: float | None = None
    geomean_pct_of_copy_bw: float | None = Field(
        default=None, description="shape-independent figure, comparable across case sets"
    )
    case_set: str = Field(description="public id of the hidden case set (changes on rotate)")
    best_final_score_us: float | None = None
    is_new_best: bool = False
    meaningful: bool = False
    incumbent: dict[str, Any] | None = Field(
        default=None, description="ABBA comparison with the best final checkpoint"
    )
    certifies: Literal[
        "outputs", "correctness_and_speed", "step_outputs", "step_replayed", "nothing"
    ] = Field(
        default="nothing",
        description="what a passed verdict certifies: "
        + "; ".join(f"{k}: {v}" for k, v in CERTIFIES.items()),
    )
    unverified: list[str] = Field(
        default_factory=list,
        description="claims this verdict could not verify (reasons.UNVERIFIED): their only "
        "evidence is the candidate's own process",
    )
    ran_on_hidden_cases: bool = Field(
        default=False,
        description="the candidate ran on hidden inputs (false: the static scan or the host "
        "refused it first, and its reasons come from the source alone)",
    )
    sandbox: str = Field(
        default="none",
        description="sandbox the candidate ran in (full: Landlock + PID/network namespaces + "
        "seccomp; partial; none), as reported by the sandbox itself",
    )
    result: EvalResult
    evidence: dict[str, Any] = Field(default_factory=dict)


__all__ = ["Verdict"]
