"""The guarded verify of a step task, host side: hidden traces from the workspace's secret, the
runner's "step_verify" mode in a fresh process (gpu/verify/step_guard.py: the candidate's step in a
sandboxed process of its own over a state the trusted parent owns, every step's logits and the
KV cache compared there with the reference the parent computed; then a timed pass,
gpu/verify/step_timed.py, whose step latencies the parent's own clock took), and the verdict
judged HERE from the parent's raw records; nothing the candidate's process says is read as a
verdict or a number. The incumbent (the best final checkpoint: incumbent.py, the kernel
verify's one mechanism) is staged from the trusted store beside the candidate; the parent runs
it in a sandboxed process and arena of its own and times it in the same timed pass, interleaved
A B B A per half segment, its outputs checked too (an incumbent that fails loses the
comparison, never the candidate's verdict); compare_steps puts the per-trace p50s side by side
(verdict.incumbent: candidate_us / incumbent_us rows, the operator's), and on a GPU a new best
must beat the incumbent by 1% there (incumbent.settle_best), not the score of another verify:
the same eager step scored 27204.9 and 22030.2 us in two verifies on an H100. Both: the
candidate's process lives while the incumbent is timed and could slow it down, so the ledger's
comparison with the recorded best must agree (settle_best's `contested`): the comparison can
keep a candidate from becoming the best on a lucky verify, never make it the best alone.

What it certifies (reasons.CERTIFIES["step_outputs"]): outputs correct on hidden traces, the
timed pass's included, and the score: the sum over traces of the p50 step latency of the timed
pass (scores.score_of, the one score definition), as the trusted parent observes a step
through the sandbox's boundary (a fixed IPC round trip included; `meaningful` only on a GPU).
A passed verdict's score is recorded in the ledger like a kernel verify's, so the loop and the
best checkpoint work on step tasks. With task.toml's step.replay (on a GPU by default) the
timed pass is the replay of the steps the candidate's process recorded in its last checked pass
(gpu/verify/step_record.py, step_schema.py, step_replay.py), so the timed work is its kernels
and ATen calls run without its Python (reasons.CERTIFIES["step_replayed"]); without it, which
kernels computed the outputs is not certified (reasons.UNVERIFIED["step_work"]). Either way not
that the incumbent's time is free of the candidate's work: without the replay its process is
alive while the incumbent's blocks are timed (gpu/verify/step_timed.py); with it that process is
stopped, but device work it queued before could still run (reasons.UNVERIFIED["step_idle"]). No static scan either: a step may capture CUDA
graphs and create the buffers it likes, which the kernel scan rejects, and the scan is never
evidence. What an agent may read of the verdict is verdict_view.py's, as for a kernel task.

Side of the trust boundary: trusted; the hidden traces never leave it.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

from ..evaluation import CaseResult, EnvInfo, EvalResult, StepBucket, kernel_request, record
from ..execution import Launcher, RunnerCall, harness_digests
from ..gpu.scores import score_of
from ..progress import Progress
from ..settings import Settings
from ..state import Checkpoints, Workspace, case_set_id, ensure_outside_workspace, workspace_secret
from ..task import kind_of
from .incumbent import comparison, incumbent_of, settle_best, stage_incumbent
from .reasons import REASONS, SANDBOX_REFUSED, step_unverified
from .verdict import Verdict
from .verdict_view import public_reasons, public_rows
from .verify import _call_quietly

# Codes the parent's records may carry; anything else is the harness's bug, never the verdict.
STEP_CODES = frozenset(
    {"candidate_error", "wrong_shape", "wrong_output", "lengths_modified", "wrong_kv_cache",
     "import_failed", "candidate_crashed", "timeout", "resource_limit", "harness_tampered",
     "sandbox_failed", "sandbox_unavailable", "unreplayable", "forged_recording"}
)  # fmt: skip


def judge_steps(
    call: RunnerCall, traces: list[dict[str, Any]], nonce: str
) -> tuple[str, list[dict[str, str]], list[CaseResult]]:
    """(verdict, reasons, one row per hidden trace) from the step parent's raw records."""
    raw = call.result

    def unknown(code: str) -> str:
        return code if code in STEP_CODES and code in REASONS else "runner_failed"

    if raw is None or raw.get("status") == "error":
        why = (
            f"runner exited with {call.exit_code}{' (timeout)' if call.timed_out else ''}"
            if raw is None
            else str(raw.get("reason", "runner error"))
        )
        return "error", [{"code": "runner_failed", "detail": why}], []
    if raw.get("error_code") == "sandbox_unavailable":
        return "error", [{"code": "sandbox_unavailable", "detail": SANDBOX_REFUSED}], []
    if raw.get("error_code") == "sandbox_failed":  # before any of the candidate's code ran
        return "error", [{"code": "sandbox_failed", "detail": str(raw.get("error"))[:400]}], []
    if raw.get("nonce") != nonce:
        return "error", [{"code": "forged_result", "detail": "nonce mismatch"}], []
    reasons: list[dict[str, str]] = []
    if raw.get("error"):
        reasons.append({"code": unknown(str(raw.get("error_code") or "candidate_crashed")),
                        "detail": str(raw["error"])[:400]})  # fmt: skip
    rows: list[CaseResult] = []
    for _i, (trace, rec) in enumerate(zip(traces, raw.get("cases") or [], strict=False)):
        mine: list[dict[str, str]] = []
        if rec.get("error"):
            code = unknown(str(rec.get("error_code") or "candidate_crashed"))
            mine.append({"code": code, "detail": f"{trace['name']}: {rec['error']}"[:400]})
        for code, detail in rec.get("codes") or []:
            mine.append({"code": unknown(str(code)), "detail": str(detail)[:400]})
        timed = _timing(rec) if not mine else None
        if not mine and timed is None:  # a passed trace the parent did not time: its bug
            mine.append({"code": "runner_failed", "detail": f"{trace['name']}: no timed pass"})
        reasons += mine
        rows.append(
            CaseResult(
                name=trace["name"],
                dtype=trace["dtype"],
                passed=not mine,
                status="passed" if not mine else "failed",
                reason=mine[0]["detail"] if mine else "",
                max_abs_err=rec.get("max_abs_err"),
                median_us=timed["p50_us"] if timed else None,
                buckets=[StepBucket(bucket="all", checked_steps=int(rec.get("steps_checked") or 0),
                                    failed_steps=0, **timed)] if timed else None,
            )
        )  # fmt: skip
        if mine:
            break
    if len(rows) < len(traces) and not reasons:
        reasons.append({"code": "runner_failed", "detail": f"{len(rows)} of {len(traces)} traces"})
    for trace in traces[len(rows) :]:  # not run after a rejection
        rows.append(CaseResult(name=trace["name"], dtype=trace["dtype"], passed=False,
                               reason="not run: an earlier trace was rejected"))  # fmt: skip
    if any(r["code"] == "runner_failed" for r in reasons):
        return "error", reasons, rows
    return ("rejected" if reasons else "passed"), reasons, rows


def _timing(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The timed pass's figures of a trace's record (step_timed.timing): steps timed, p50 and
    p95 in microseconds, finite and positive; None when the record has no such figures."""
    steps, p50, p95 = rec.get("steps_timed"), rec.get("p50_us"), rec.get("p95_us")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        return None
    figures = [float(x) for x in (p50, p95) if isinstance(x, int | float) and x is not True]
    if len(figures) < 2 or not all(math.isfinite(x) and x > 0 for x in figures):
        return None
    return {"steps": steps, "p50_us": figures[0], "p95_us": figures[1]}


def compare_steps(raw: dict[str, Any], rows: list[CaseResult], meaningful: bool,
                  digest: str) -> dict[str, Any]:  # fmt: skip
    """The verdict's `incumbent`: per hidden trace the candidate's p50 step latency (its row's
    median_us) beside the incumbent's, both from the same timed pass (A B B A per half
    segment), by the kernel verify's rule (incumbent.comparison). An incumbent counts on a
    trace only where the parent's record says it passed every check there; the first reason
    it failed (or its process's failure) is the comparison's error (the operator's)."""
    recs = raw.get("cases") or []
    out, error = [], raw.get("incumbent_error")
    for i, row in enumerate(rows):
        inc = (recs[i].get("incumbent") if i < len(recs) else None) or {}
        ok = inc.get("passed") is True and not inc.get("codes")
        timed = _timing(inc) if ok else None
        out.append({"candidate_us": row.median_us, "incumbent_passed": timed is not None,
                    "incumbent_us": timed["p50_us"] if timed else None})  # fmt: skip
        if not error and inc.get("codes"):
            error = str(inc["codes"][0][1])[:400]
    return comparison(out, meaningful, digest, error)


async def guarded_step_verify(
    ws: Workspace,
    launcher: Launcher,
    settings: Settings,
    *,
    rotate: bool = False,
    progress: Progress | None = None,
    save: bool = True,
) -> Verdict:
    """Verify a step task's workspace on hidden traces drawn from its secret (`rotate`: a new
    secret, new traces). A passed verdict's score is the sum over traces of the timed pass's
    p50 step latency (us, lower is better), recorded in the ledger (mode "final")."""
    task = ws.task
    spec = kind_of(task).require_steps(task, "the guarded step verify")
    ensure_outside_workspace(settings, ws.root)
    secret = workspace_secret(settings, ws.root, rotate=rotate)
    traces = spec.hidden(secret["seed"])
    cs = case_set_id(secret["seed"])
    candidate = ws.snapshot()
    seed, nonce = secrets.randbelow(2**31), secrets.token_hex(12)
    step = {"model": spec.model.model_dump(), "interpreter": spec.interpreter.model_dump(),
            "traces": traces, "replay": spec.replay}  # fmt: skip
    request = kernel_request(ws, launcher, candidate, "step_verify", seed=seed, nonce=nonce,
                             step=step)  # fmt: skip
    ckpt = Checkpoints(ws)
    best, prior, incumbent = incumbent_of(ckpt, cs, candidate.digest)
    stage_incumbent(launcher, ws, ckpt, incumbent, request)
    call = await _call_quietly(launcher, request, ws, progress)
    verdict, reasons, rows = judge_steps(call, traces, nonce)
    raw = call.result or {}
    ran = [r["code"] for r in reasons] != ["sandbox_unavailable"]
    sandbox = ((raw.get("sandbox") or {}).get("candidate") or {}).get("level") or "none"
    env = EnvInfo.model_validate({**(raw.get("env") or {}), "sandbox": sandbox})
    passed = verdict == "passed" and bool(rows)
    score = score_of([r.median_us for r in rows], passed)
    meaningful = passed and env.meaningful  # the interpreter's wall clock says nothing
    result = EvalResult(
        status="passed" if passed else ("error" if verdict == "error" else "failed"),
        score_us=score,
        meaningful=meaningful,
        reason=reasons[0]["detail"] if reasons else "",
        cases=rows,
        candidate=candidate.digest,
        config={},
        mode="final",
        env=env,
        seed=seed,
        wall_s=call.wall_s,
    )
    replayed = raw.get("certifies") == "step_replayed"  # the parent says which path it took
    certifies = ("step_replayed" if replayed else "step_outputs") if passed else "nothing"
    compared = None
    if "cases" in raw and incumbent:
        compared = compare_steps(raw, rows, env.meaningful, incumbent)
    if save:  # the ledger gets what an agent may see (verify.py's rule); the rest stays stored
        shown = public_reasons(reasons, ran)
        ledger_row = result.model_copy(
            update={
                "reason": shown[0]["detail"] if shown else "",
                "cases": public_rows(rows, verdict),
            }
        )
        hidden = [{**t, **row.model_dump(exclude_none=True, exclude={"name"})}
                  for t, row in zip(traces, rows, strict=False)]  # fmt: skip
        record(ws, ledger_row, candidate, case_set=cs, hidden=hidden,
               store_only={"reasons": reasons},
               extra={"certifies": certifies})  # fmt: skip
        result.record_id, result.best_score_us = ledger_row.record_id, ledger_row.best_score_us
        result.delta_vs_best_pct = ledger_row.delta_vs_best_pct
        result.is_new_best = ledger_row.is_new_best
        settle_best(ckpt, result, compared, prior, best, cs, contested=True)
    evidence: dict[str, Any] = {
        "candidate": candidate.digest,
        "seed": seed,
        "case_set_generation": secret["generation"],
        "traces": traces,
        "harness_sha256": {n: d[:16] for n, d in harness_digests().items()},
        "input_seed": raw.get("input_seed"),
        "device": env.device,
        "driver": env.driver,
        "versions": {"torch": env.torch, "triton": env.triton, "cuda": env.cuda},
        "runner_wall_s": raw.get("wall_s"),
        "runner_phases_s": raw.get("phases_s"),  # where the parent's seconds went
        "replay": raw.get("replay"),  # per role and trace: steps recorded, distinct programs
        "sandbox": raw.get("sandbox"),
    }
    return Verdict(
        verdict=verdict,  # type: ignore[arg-type]
        reasons=reasons,
        score_us=score,
        case_set=cs,
        best_final_score_us=result.best_score_us,
        is_new_best=result.is_new_best,
        meaningful=meaningful,
        incumbent=compared,
        result=result,
        evidence=evidence,
        certifies=certifies,  # type: ignore[arg-type]
        unverified=step_unverified(replayed, meaningful) if passed else [],
        ran_on_hidden_cases=ran,
        sandbox=str(sandbox),
    )


__all__ = ["compare_steps", "guarded_step_verify", "judge_steps"]
