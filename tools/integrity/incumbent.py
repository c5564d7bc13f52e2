"""The incumbent comparison of a guarded verify (ABBA), host side: one mechanism for the kernel
verify (verify.py) and the step verify (step_verify.py).

The incumbent is the best final checkpoint (on this case set, else the latest best on any),
staged from the trusted store beside the candidate and timed by the runner in the same verify,
interleaved A B B A with it (the kernel verify per timed sample: gpu/verify/guard_gpu.py; the
step verify per half segment: gpu/verify/step_timed.py). Its outputs are checked like the
candidate's; where it fails a check or its process dies, it loses its rows (no incumbent time),
never the candidate's verdict. A new best must beat it by MIN_SPEEDUP on the same-verify rows:
on a GPU that comparison, not the ledger's comparison with a score from another verify, decides
the best pointer (settle_best). The rows and the error are the operator's; an agent reads only
PUBLIC_INCUMBENT's fields of a passed verdict (verdict_view.py).

Side of the trust boundary: trusted.
"""

from __future__ import annotations

from typing import Any

from ..evaluation import EvalResult
from ..execution import Launcher
from ..gpu.scores import geomean, score_of
from ..state import Checkpoints, Workspace

# A new best must beat the incumbent by 1% (geomean over cases, A B B A in one verify): the
# same kernel under a new hash measured 0.998x of itself on an H100 (2026-11-23), so a smaller
# edge is noise and would hand the best pointer back and forth between equal kernels.
MIN_SPEEDUP = 1.01


def comparison(
    rows: list[dict[str, Any]], meaningful: bool, digest: str, error: str | None
) -> dict[str, Any]:
    """The verdict's `incumbent` from per-case rows {candidate_us, incumbent_us,
    incumbent_passed} timed in the same verify (a kernel's cases, a step task's traces): the
    speedup is the geomean of incumbent/candidate over the rows that have both times, and the
    candidate is `faster` only with MIN_SPEEDUP over ALL rows: a row where the incumbent failed
    or was not timed has no ratio, so no win for the candidate either (settle_best then keeps
    the best pointer where it was)."""
    ratios = [r["incumbent_us"] / r["candidate_us"]
              for r in rows if r.get("candidate_us") and r.get("incumbent_us")]  # fmt: skip
    speedup = geomean(ratios)
    return {
        "hash": digest,
        "cases": rows,
        "speedup": speedup,
        "meaningful": meaningful,
        "faster": bool(speedup and speedup >= MIN_SPEEDUP and len(ratios) == len(rows)),
        "error": error,
    }


def incumbent_score(comparison: dict[str, Any]) -> float | None:
    """The incumbent's score on this case set from the ABBA rows (None unless every case has
    a time)."""
    rows = comparison.get("cases") or []
    return score_of([r.get("incumbent_us") for r in rows], passed=True)


def incumbent_of(
    ckpt: Checkpoints, case_set: str, digest: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]:
    """(the best final checkpoint on this case set, the best on any (the latest), the
    incumbent's hash: that one unless it is the candidate itself). A score compares only
    within its case set; the incumbent timed beside the candidate (ABBA) may come from an
    earlier case set: both are timed on this one."""
    best = ckpt.best("final", case_set=case_set)
    prior = best or ckpt.latest_best("final")
    incumbent = prior["hash"] if prior and prior.get("hash") not in (None, digest) else None
    return best, prior, incumbent


def stage_incumbent(
    launcher: Launcher,
    ws: Workspace,
    ckpt: Checkpoints,
    incumbent: str | None,
    request: dict[str, Any],
) -> None:
    """The incumbent's files staged from its checkpoint (the trusted store's copy, never the
    workspace) and named in the runner's request (`baseline_dir`), when it has one."""
    if incumbent and ckpt.exists(incumbent):
        staged = launcher.stage_candidate(
            ckpt.files(incumbent), incumbent, scope=ws.store.root.name
        )
        request["baseline_dir"] = f"@stage/{staged}"


def settle_best(
    ckpt: Checkpoints,
    result: EvalResult,
    comparison: dict[str, Any] | None,
    prior: dict[str, Any] | None,
    best: dict[str, Any] | None,
    case_set: str,
    *,
    contested: bool = False,
) -> None:
    """The best pointer after a recorded verify (`result`, its ledger row's is_new_best set):
    where the same verify timed the incumbent meaningfully beside a passed candidate, "better"
    means better on the same machine state: the ABBA comparison decides (MIN_SPEEDUP), and the
    ledger's comparison with a score from another verify is overruled. `contested`: the
    candidate's process was alive while the incumbent was timed (a step verify's children), so
    it could have slowed the incumbent down (a busy thread, GPU work queued before its block
    ended): the comparison alone promotes nobody there, and the ledger's comparison with the
    recorded best must agree."""
    if not (comparison and comparison["meaningful"] and prior and result.status == "passed"):
        return
    faster = comparison["faster"] and (result.is_new_best or not contested)
    result.is_new_best = faster
    if faster:
        winner = (result.candidate, result.score_us)
    else:  # the incumbent's score on this case set: its own, or what ABBA measured
        winner = (prior["hash"], best["score"] if best else incumbent_score(comparison))
    if winner[1] is not None:
        ckpt.set_best(
            "final", winner[0], float(winner[1]), result.record_id or "", case_set=case_set
        )


__all__ = [
    "MIN_SPEEDUP",
    "comparison",
    "incumbent_of",
    "incumbent_score",
    "settle_best",
    "stage_incumbent",
]
