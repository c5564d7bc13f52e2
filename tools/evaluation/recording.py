"""Result assembly and recording: a runner call turned into an EvalResult, where its seconds
went, and the one record path of every scored run (ledger record, checkpoint, best pointer).

Side of the trust boundary: trusted (host); writes only the trusted store. A dev result's
figures come from the candidate's sandboxed runner: feedback for the agent, never a verdict
(the guarded verify builds its own EvalResult from raw measurements: tools/integrity/verify.py).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from ..execution import RunnerCall
from ..gpu.scores import score_of
from ..state import Candidate, Checkpoints, Workspace
from ..state.storage import append_jsonl, require_space
from ..task import Case
from .results import CaseResult, EnvInfo, EvalResult


def to_eval_result(
    call: RunnerCall,
    cases: list[Case],
    *,
    candidate: str,
    config: dict[str, Any],
    mode: str,
    seed: int,
) -> EvalResult:
    """Turn a runner call into an EvalResult. A killed runner still yields every case: the ones
    it finished from its streamed events, the rest as timeouts."""
    res = call.result
    if res is not None and "cases" in res:
        case_rows = res["cases"]
    else:
        finished = {ev["name"]: ev for ev in call.events if ev.get("event") == "case"}
        why = "timeout: the runner was killed" if call.timed_out else call.failure()
        case_rows = [
            finished.get(c.name)
            or {
                "name": c.name,
                "dtype": c.dtype,
                "shape": c.shape,
                "passed": False,
                "status": "timeout" if call.timed_out else "error",
                "reason": why,
            }
            for c in cases
        ]
    rows = [
        CaseResult.model_validate({k: v for k, v in r.items() if k != "event"}) for r in case_rows
    ]
    passed = bool(rows) and all(r.passed for r in rows)
    env = EnvInfo.model_validate((res or {}).get("env") or {})
    status: Literal["passed", "failed", "error"]
    if res is None:
        reason = call.failure()
        status = "failed"
    elif res.get("status") == "error" and "cases" not in res:
        reason, status = res.get("reason", "runner error"), "error"
    else:
        reason = res.get("reason", "")
        status = "passed" if passed else "failed"
    score = score_of([r.median_us for r in rows], passed)
    return EvalResult(
        status=status,
        score_us=score,
        meaningful=env.meaningful,
        reason=reason,
        cases=rows,
        candidate=candidate,
        config=config,
        mode=mode,
        geomean_pct_of_copy_bw=(res or {}).get("geomean_pct_of_copy_bw"),
        copy_gbps=(res or {}).get("copy_gbps"),
        env=env,
        seed=seed,
        wall_s=call.wall_s,
    )


class Recorded(NamedTuple):
    """What recording one scored run decided (against the best on its case set before it)."""

    record_id: str
    best_score: float | None
    delta_vs_best_pct: float | None
    is_new_best: bool


def record_run(
    ws: Workspace,
    candidate: Candidate,
    entry: dict[str, Any],
    *,
    mode: str,
    case_set: str,
    status: str,
    score: float | None,
    hidden: list[dict[str, Any]] | None = None,
    store_only: dict[str, Any] | None = None,
) -> Recorded:
    """The one record path of every scored run (kernel and command tasks): checkpoint the
    candidate's files, append the ledger record (`entry` plus mode, candidate, status, score, case set), and
    move the best pointer when a passing score beats the best on the same `case_set` in the
    task's direction (all in the trusted store). `hidden`: per-case results with their hidden
    shapes (final runs), kept in the store only, with `store_only`'s fields (a command task's
    full objective output)."""
    ws.ensure_exists()  # a workspace deleted mid-run is not recreated by the writes below
    # A record is written whole or not begun: DiskFull (naming the store) before any write.
    files = candidate.files
    require_space(ws.store.root, sum(len(b) for b in files.values()) + len(str(entry)))
    ledger = ws.ledger()
    ckpt = Checkpoints(ws)
    best_before = ledger.best(mode, case_set=case_set)
    digest = ckpt.save(files)
    rec = ledger.append(
        {
            **entry,
            "mode": mode,
            "candidate": digest,
            "status": status,
            "score": score,
            "case_set": case_set,
        }
    )
    if hidden is not None or store_only is not None:
        append_jsonl(
            ws.store.hidden_results_path,
            {
                "record": rec["id"],
                "case_set": case_set,
                "candidate": digest,
                "cases": hidden or [],
                **(store_only or {}),
            },
        )
    best = best_before["score"] if best_before is not None else None
    new_best, delta = False, None
    if status == "passed" and score is not None:
        if best is None or ledger.better(score, best, mode):
            new_best = True
            ckpt.set_best(mode, digest, score, rec["id"], case_set=case_set)
        if best:
            delta = 100.0 * (score - best) / best
    return Recorded(rec["id"], best, delta, new_best)


def record(
    ws: Workspace,
    result: EvalResult,
    candidate: Candidate,
    *,
    case_set: str,
    hidden: list[dict[str, Any]] | None = None,
    store_only: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> EvalResult:
    """A kernel run's record (record_run); fills the best/delta fields of `result`. `extra`:
    more ledger fields; `hidden`, `store_only`: kept in the store only (record_run)."""
    entry = {
        "config": result.config,
        "meaningful": result.meaningful,
        "cases": [c.model_dump(exclude_none=True) for c in result.cases],
        "reason": result.reason,
        "device": result.env.device,
        "host": result.env.host,
        "gpu_index": result.env.gpu_index,
        "sandbox": result.env.sandbox,  # as the sandbox's outer process reported it
        "versions": {
            "torch": result.env.torch,
            "triton": result.env.triton,
            "cuda": result.env.cuda,
        },
        "seed": result.seed,
        "geomean_pct_of_copy_bw": result.geomean_pct_of_copy_bw,
        **(extra or {}),
    }
    done = record_run(
        ws,
        candidate,
        entry,
        mode=result.mode,
        case_set=case_set,
        status=result.status,
        score=result.score_us,
        hidden=hidden,
        store_only=store_only,
    )
    result.record_id, result.best_score_us = done.record_id, done.best_score
    result.delta_vs_best_pct, result.is_new_best = done.delta_vs_best_pct, done.is_new_best
    return result


def breakdown(call: RunnerCall, *, snapshot_s: float, result_s: float) -> dict[str, float]:
    """Where one evaluation's seconds went, host and runner side by side (exclusive phases):
    snapshot (editable files, hash), stage, gpu_lock, sync, transport (the round trip to the
    runner minus the runner's own time), the runner's phases (load, inputs, correctness,
    timing_inputs, timing, copy_bandwidth, release: the allocator's cache given back, other)
    and result (assembly, ledger, checkpoint)."""
    host = dict(call.phases_s)
    runner = {k: float(v) for k, v in ((call.result or {}).get("phases_s") or {}).items()}
    runner_wall = float((call.result or {}).get("runner_wall_s") or 0.0)
    out = {"snapshot": snapshot_s, **{k: v for k, v in host.items() if k != "runner_round_trip"}}
    out["transport"] = max(0.0, host.get("runner_round_trip", 0.0) - runner_wall)
    out.update({f"runner_{k}": v for k, v in runner.items()})
    out["runner_other"] = max(0.0, runner_wall - sum(runner.values()))
    out["result"] = result_s
    return out


__all__ = ["Recorded", "breakdown", "record", "record_run", "to_eval_result"]
