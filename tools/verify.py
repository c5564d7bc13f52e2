"""Guarded final verification: the candidate on hidden cases drawn from the task's final domain
with a per-workspace secret, in a fresh runner process, correctness checked on several fresh
input sets per case. The verdict is computed here, in the trusted parent."""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, Field

from .launcher import Launcher
from .objective import Progress, case_events_progress, record, require_kernel_task, to_eval_result
from .results import EvalResult
from .secrets_store import case_set_id, workspace_secret
from .settings import Settings
from .workspace import Workspace


class Verdict(BaseModel):
    verdict: Literal["passed", "rejected", "error"]
    reasons: list[dict[str, str]] = Field(
        default_factory=list, description="[{code, detail}] why the verdict is what it is"
    )
    score_us: float | None = None
    geomean_pct_of_copy_bw: float | None = Field(
        default=None, description="shape-independent figure, comparable across case sets"
    )
    case_set: str = Field(description="public id of the hidden case set (changes on rotate)")
    best_final_score_us: float | None = None
    is_new_best: bool = False
    meaningful: bool = False
    result: EvalResult
    evidence: dict[str, Any] = Field(default_factory=dict)


async def guarded_verify(
    ws: Workspace,
    launcher: Launcher,
    settings: Settings,
    *,
    rotate: bool = False,
    checks: int = 3,
    progress: Progress | None = None,
    save: bool = True,
) -> Verdict:
    require_kernel_task(ws, "guarded_final_verify")
    assert ws.task.final is not None
    secret = workspace_secret(settings, ws.root, rotate=rotate)
    cases = ws.task.final.draw(secret["seed"])
    files = ws.editable_files()
    config = ws.read_config()
    digest = ws.candidate_hash(files)
    seed = secrets.randbelow(2**31)
    staged = launcher.stage_candidate(files, digest)
    request = {
        "mode": "evaluate",
        "candidate_dir": f"@stage/{staged}",
        "entry": ws.task.entry,
        "config_file": ws.task.config_file,
        "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
        "cases": [c.model_dump() for c in cases],
        "seed": seed,
        "checks": checks,
    }
    call = await launcher.call(
        request, task=ws.task, on_event=case_events_progress(len(cases), progress)
    )
    result = to_eval_result(call, cases, candidate=digest, config=config, mode="final", seed=seed)
    cs = case_set_id(secret["seed"])
    if save:
        record(ws, result, files, case_set=cs)
    reasons = [
        {"code": f"case_{c.status}", "detail": f"{c.name}: {c.reason}"}
        for c in result.cases
        if not c.passed
    ]
    verdict: Literal["passed", "rejected", "error"] = (
        "passed" if result.status == "passed" else "rejected"
    )
    if result.status == "error":
        verdict = "error"
    return Verdict(
        verdict=verdict,
        reasons=reasons,
        score_us=result.score_us,
        geomean_pct_of_copy_bw=result.geomean_pct_of_copy_bw,
        case_set=cs,
        best_final_score_us=result.best_score_us,
        is_new_best=result.is_new_best,
        meaningful=result.meaningful,
        result=result,
        evidence={
            "candidate": digest,
            "seed": seed,
            "case_set_generation": secret["generation"],
            "cases": [c.model_dump() for c in cases],
            "device": result.env.device,
            "driver": result.env.driver,
            "versions": {
                "torch": result.env.torch,
                "triton": result.env.triton,
                "cuda": result.env.cuda,
            },
            "checks_per_case": checks,
        },
    )


__all__ = ["Verdict", "guarded_verify"]
