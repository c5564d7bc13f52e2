"""Guarded final verification, host side: the verdict an agent cannot game.

Order of work: hidden cases from the per-workspace secret (never written into the workspace;
the ledger gets anonymised case names, the verdict's evidence the real ones after the fact) ->
static scan (hard rejects stop here) -> the runner's guarded "verify" mode in a fresh process
(guard.py: the candidate runs in a child process, the incumbent - the best final checkpoint - in
another, timed interleaved) -> the verdict computed HERE from raw measurements (per-call checks,
samples, wall clocks, bytes, copy bandwidth); nothing the candidate prints is read as a verdict.

Every reason is {code, detail}; the codes are listed in REASONS (reasons.py). The Verdict
holds the full figures for the operator; what an agent may read of it is
tools/integrity/verdict_view.py's (no number or choice of the candidate's run).
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

import anyio

from ..evaluation import CaseResult, EnvInfo, EvalResult, kernel_request, record
from ..execution import Launcher, RunnerCall, harness_digests
from ..gpu.scores import geomean, order_stats, score_of
from ..progress import Progress, report
from ..settings import Settings
from ..state import Checkpoints, Workspace, case_set_id, ensure_outside_workspace, workspace_secret
from ..task import Case, kind_of
from .incumbent import (
    MIN_SPEEDUP,
    comparison,
    incumbent_of,
    incumbent_score,
    settle_best,
    stage_incumbent,
)
from .reasons import CERTIFIES, CPU_UNVERIFIED, GPU_UNVERIFIED, REASONS, SANDBOX_REFUSED
from .scan import scan_workspace
from .verdict import Verdict
from .verdict_view import public_reasons, public_rows

PLAUSIBLE_PCT_OF_COPY = 125.0  # minimal bytes faster than this share of copy bandwidth: a lie
# The parent's wall clock around a sample, less the same request with an empty window, may
# exceed the device time the child reports by 25% + 250 us on at least one sample (an H200
# showed 440-580 us of request overhead per sample before that subtraction, windows of 1.0-1.1
# ms, and up to ~530 us more, most likely a process waking from sleep: both now spin).
WALL_SLACK = 1.25
WALL_SLACK_US = 250.0
HEARTBEAT_S = 10.0  # a verify's progress: one fixed message this often (never per case)


def _median(xs: list[float]) -> float | None:
    return order_stats(xs)["median_us"]


def _timing(case: dict[str, Any], role: str, meaningful: bool) -> dict[str, Any] | None:
    """Samples of one child for one case: GPU timing records, or the interpreter's checked
    calls (wall clock, meaningless but honest)."""
    if meaningful:
        rec = (case.get("timing") or {}).get(role)
        if not rec or not rec.get("samples_us"):
            return None
        return rec
    # The interpreter: the parent's wall clock around each checked call (its own measure).
    calls = [c for c in case.get("calls", []) if c.get("role") == role and c.get("kind") == "check"]
    walls = [c.get("wall_us") for c in calls]
    return {
        "samples_us": [w for w in walls if isinstance(w, int | float)],
        "method": "wall_clock_interpreter",
        "parent_wall_us": [],
        "calls_per_sample": 1,
    }


def judge_case(
    case: dict[str, Any],
    copy_gbps: float | None,
    meaningful: bool,
    index: int,
    timed: bool = True,
) -> tuple[CaseResult, list[dict[str, str]], dict[str, Any]]:
    """One case's CaseResult (anonymised name), reject reasons, and evidence numbers. `timed`:
    the verify reached its timed window (no case was rejected), so a case that passed its
    checks must have timing samples."""
    label = f"case {index} ({case.get('dtype')})"
    reasons: list[dict[str, str]] = []

    def add(code: str, detail: str) -> None:
        if not any(r["code"] == code for r in reasons):
            reasons.append({"code": code, "detail": f"{label}: {detail}"[:400]})

    if case.get("error"):
        add(case.get("error_code") or "candidate_crashed", str(case["error"]))
    calls = [c for c in case.get("calls", []) if c.get("role") == "candidate"]
    for c in calls:
        for code, detail in c.get("codes", []):
            add(str(code), str(detail))
    nc = case.get("null_control") or {}
    if nc and not all(nc.values()):
        add("null_control", f"the checker accepts a null output: {nc}")
    stats: dict[str, Any] = {
        "calls_checked": len(calls),
        "calls_passed": sum(1 for c in calls if c.get("passed")),
    }
    row: dict[str, Any] = {
        "name": f"final{index}_{case.get('dtype')}",
        "dtype": str(case.get("dtype")),
        "passed": False,
    }
    for key in ("max_abs_err", "max_rel_err"):  # the operator's figures (never public)
        errs = [c[key] for c in calls if isinstance(c.get(key), int | float)]
        row[key] = max(errs) if errs else None
    timing = _timing(case, "candidate", meaningful) if not reasons else None
    if timing is None and meaningful and timed and not reasons:
        add("runner_failed", "the case passed its checks but has no timing samples")
    if timing is not None:
        for code, detail in timing.get("codes", []):
            add(str(code), detail)
        if timing.get("inputs_modified"):
            add("inputs_modified", f"{timing['inputs_modified']} timed calls changed their inputs")
        if timing.get("bad_calls"):
            add(
                "wrong_output_timed",
                f"{timing['bad_calls']} of {timing['checked_calls']} timed calls were wrong",
            )
        stats.update(
            timed_calls_checked=timing.get("checked_calls", 0),
            timed_calls_bad=timing.get("bad_calls", 0),
            method=timing.get("method"),
        )
        order = order_stats(timing["samples_us"])
        med = order["median_us"]
        if med:
            nbytes = int(case.get("bytes") or 0)
            gbps = nbytes / (med * 1e3)
            row.update(order, gbps=gbps, timing_method=timing.get("method"))
            if copy_gbps:
                row["pct_of_copy_bw"] = 100.0 * gbps / copy_gbps
            if meaningful and row.get("pct_of_copy_bw", 0) > PLAUSIBLE_PCT_OF_COPY:
                add("implausible_speed", f"{row['pct_of_copy_bw']:.0f}% of copy bandwidth")
            mismatch = wall_mismatch(timing)
            if mismatch:
                add("timing_mismatch", mismatch)
    row["passed"] = not reasons
    row["status"] = "passed" if not reasons else "failed"
    row["reason"] = reasons[0]["detail"] if reasons else ""
    return CaseResult.model_validate(row), reasons, stats


def wall_mismatch(timing: dict[str, Any]) -> str:
    """The parent's wall clock around each sample bounds what the child may claim. A sample
    passes when its wall clock is within the slack of its claim; the case fails only when no
    sample does, so an occasional host hiccup is no false rejection while a child that
    under-reports (every sample) is caught."""
    calls = int(timing.get("calls_per_sample") or 1)
    walls = timing.get("parent_wall_us") or []
    claimed = [s * calls for s in timing.get("samples_us", [])]
    if not walls or len(walls) != len(claimed):
        return ""
    excess = [w - (WALL_SLACK * c + WALL_SLACK_US) for w, c in zip(walls, claimed, strict=True)]
    if min(excess) > 0:
        wall, dev = _median(walls), _median(claimed)
        return (
            f"parent wall clock {wall:.0f} us per sample, child claims {dev:.0f} us "
            f"(no sample within {WALL_SLACK:g}x + {WALL_SLACK_US:.0f} us)"
        )
    return ""


def compare_incumbent(raw: dict[str, Any], meaningful: bool, digest: str) -> dict[str, Any]:
    """ABBA: per case median of the candidate vs the incumbent, timed in the same layout."""
    rows = []
    for case in raw.get("cases", []):
        inc_calls = [c for c in case.get("calls", []) if c.get("role") == "incumbent"]
        ok = bool(inc_calls) and all(c.get("passed") for c in inc_calls)
        a = _timing(case, "candidate", meaningful)
        b = _timing(case, "incumbent", meaningful) if ok else None
        ma = _median(a["samples_us"]) if a else None
        mb = _median(b["samples_us"]) if b else None
        rows.append({"candidate_us": ma, "incumbent_us": mb, "incumbent_passed": ok})
    return comparison(rows, meaningful, digest, raw.get("incumbent_error"))


def judge(
    call: RunnerCall, cases: list[Case], nonce: str
) -> tuple[str, list[dict[str, str]], list[CaseResult], dict[str, Any]]:
    """(verdict, reasons, case rows, stats) from the runner's raw measurements."""
    raw = call.result
    reasons: list[dict[str, str]] = []
    if raw is None or raw.get("status") == "error":
        # Not the stderr tail: the candidate writes there, and could spell out hidden shapes.
        why = (
            f"runner exited with {call.exit_code}{' (timeout)' if call.timed_out else ''}"
            if raw is None
            else str(raw.get("reason", "runner error"))
        )
        return "error", [*reasons, {"code": "runner_failed", "detail": why}], [], {}
    if raw.get("error_code") == "sandbox_unavailable":
        return "error", [{"code": "sandbox_unavailable", "detail": SANDBOX_REFUSED}], [], {}
    if raw.get("error_code") == "sandbox_failed":  # before any of the candidate's code ran
        return "error", [{"code": "sandbox_failed", "detail": str(raw.get("error"))[:400]}], [], {}
    if raw.get("nonce") != nonce:
        return "error", [*reasons, {"code": "forged_result", "detail": "nonce mismatch"}], [], {}
    for code, detail in (raw.get("load", {}).get("candidate") or {}).get("codes", []):
        reasons.append({"code": str(code), "detail": f"at import: {detail}"})
    if raw.get("error"):
        reasons.append(
            {
                "code": raw.get("error_code") or "candidate_crashed",
                "detail": str(raw["error"])[:400],
            }
        )
    meaningful = bool((raw.get("env") or {}).get("meaningful"))
    rows: list[CaseResult] = []
    stats = {"calls_checked": 0, "calls_passed": 0, "timed_calls_checked": 0}
    # The runner times only when every case passed its checks (guard.Verify.time_cases).
    timed = not any(
        c.get("error")
        or not all(k.get("passed") for k in c.get("calls", []) if k.get("role") == "candidate")
        for c in raw.get("cases", [])
    )
    for i, case in enumerate(raw.get("cases", [])):
        row, case_reasons, st = judge_case(case, raw.get("copy_gbps"), meaningful, i, timed)
        rows.append(row)
        reasons += case_reasons
        for k in ("calls_checked", "calls_passed", "timed_calls_checked"):
            stats[k] += int(st.get(k) or 0)
    if len(rows) < len(cases) and not reasons:
        reasons.append({"code": "runner_failed", "detail": f"{len(rows)} of {len(cases)} cases"})
    for i, c in enumerate(cases[len(rows) :], start=len(rows)):  # not run after a rejection
        rows.append(
            CaseResult(
                name=f"final{i}_{c.dtype}",
                dtype=c.dtype,
                passed=False,
                reason="not run: an earlier case was rejected",
            )
        )
    if any(r["code"] in ("null_control", "runner_failed") for r in reasons):
        return "error", reasons, rows, stats
    return ("rejected" if reasons else "passed"), reasons, rows, stats


async def guarded_verify(
    ws: Workspace,
    launcher: Launcher,
    settings: Settings,
    *,
    rotate: bool = False,
    checks: int = 3,
    progress: Progress | None = None,
    save: bool = True,
    enforce_scan: bool = True,
) -> Verdict:
    """Verify the workspace on its hidden cases. `enforce_scan=False` (tests) lets a candidate
    that the static scan rejects run anyway, to prove the runtime defenses catch it too."""
    kind_of(ws.task).require_runner(ws.task, "a kernel task's guarded verify")
    assert ws.task.final is not None
    ensure_outside_workspace(settings, ws.root)
    secret = workspace_secret(settings, ws.root, rotate=rotate)
    cases = ws.task.final.draw(secret["seed"])
    cs = case_set_id(secret["seed"])
    candidate = ws.snapshot()
    config = ws.read_config(candidate)
    digest = candidate.digest
    seed, nonce = secrets.randbelow(2**31), secrets.token_hex(12)
    scan = scan_workspace(ws, candidate.files)
    evidence: dict[str, Any] = {
        "candidate": digest,
        "seed": seed,
        "case_set_generation": secret["generation"],
        "cases": [c.model_dump() for c in cases],
        "checks_per_case": checks,
        "harness_sha256": {n: d[:16] for n, d in harness_digests().items()},
        "scan": {"files": scan.files, "rejects": len(scan.rejects), "warnings": len(scan.warnings)},
    }
    warnings = [{"code": f.code, "detail": f"{f.where()}: {f.detail}"} for f in scan.warnings]
    if not enforce_scan:
        warnings += [
            {"code": f.code, "detail": f"not enforced: {f.where()}: {f.detail}"}
            for f in scan.rejects
        ]
    ckpt = Checkpoints(ws)
    best, prior, incumbent = incumbent_of(ckpt, cs, digest)
    raw: dict[str, Any] = {}
    wall_s = 0.0
    ran = False
    if scan.rejects and enforce_scan:  # hard rejects stop here: the candidate never runs
        verdict, rows = "rejected", list[CaseResult]()
        reasons = [{"code": f.code, "detail": f"{f.where()}: {f.detail}"} for f in scan.rejects]
        stats: dict[str, Any] = {"not_run": "static scan rejected the candidate"}
    else:
        request = kernel_request(
            ws,
            launcher,
            candidate,
            "verify",
            cases=cases,
            seed=seed,
            checks=checks,
            nonce=nonce,
        )
        stage_incumbent(launcher, ws, ckpt, incumbent, request)
        call = await _call_quietly(launcher, request, ws, progress)
        verdict, reasons, rows, stats = judge(call, cases, nonce)
        raw, wall_s = call.result or {}, call.wall_s
        ran = [r["code"] for r in reasons] != ["sandbox_unavailable"]
    cand_level = ((raw.get("sandbox") or {}).get("candidate") or {}).get("level")
    env = EnvInfo.model_validate({**(raw.get("env") or {}), "sandbox": cand_level or "none"})
    passed = verdict == "passed" and bool(rows)
    score = score_of([r.median_us for r in rows], passed)
    geo = geomean([r.pct_of_copy_bw for r in rows]) if passed else None
    result = EvalResult(
        status="passed" if passed else ("error" if verdict == "error" else "failed"),
        score_us=score,
        meaningful=env.meaningful and passed,
        reason=reasons[0]["detail"] if reasons else "",
        cases=rows,
        candidate=digest,
        config=config,
        mode="final",
        geomean_pct_of_copy_bw=geo,
        copy_gbps=raw.get("copy_gbps"),
        env=env,
        seed=seed,
        wall_s=wall_s,
    )
    comparison = None
    if "cases" in raw and incumbent:
        comparison = compare_incumbent(raw, env.meaningful, incumbent)
    certifies = _certifies(raw, env.meaningful) if passed else "nothing"
    if save:
        # The ledger gets what an agent may see of this verdict (inspect_context shows its
        # reason); per-case figures with the hidden shapes, and the full reasons, stay in the
        # store's hidden results for the operator.
        hidden = [
            {**c.model_dump(), **row.model_dump(exclude_none=True, exclude={"name"})}
            for c, row in zip(cases, rows, strict=False)
        ]
        shown = public_reasons(reasons, ran)
        ledger_row = result.model_copy(
            update={
                "reason": shown[0]["detail"] if shown else "",
                "cases": public_rows(rows, verdict),
            }
        )
        record(
            ws,
            ledger_row,
            candidate,
            case_set=cs,
            hidden=hidden,
            store_only={"reasons": reasons, "checks": stats},
            extra={"certifies": certifies},
        )
        result.record_id, result.best_score_us = ledger_row.record_id, ledger_row.best_score_us
        result.delta_vs_best_pct = ledger_row.delta_vs_best_pct
        result.is_new_best = ledger_row.is_new_best
        settle_best(ckpt, result, comparison, prior, best, cs)
    evidence.update(
        input_seed=raw.get("input_seed"),
        device=env.device,
        driver=env.driver,
        clocks=raw.get("clocks"),
        copy_gbps=raw.get("copy_gbps"),
        versions={"torch": env.torch, "triton": env.triton, "cuda": env.cuda},
        checks=stats,
        runner_wall_s=raw.get("wall_s"),
        sandbox=raw.get("sandbox"),
    )
    cand_sandbox = (raw.get("sandbox") or {}).get("candidate") or {}
    return Verdict(
        verdict=verdict,  # type: ignore[arg-type]
        reasons=reasons,
        warnings=warnings,
        score_us=score,
        geomean_pct_of_copy_bw=geo,
        case_set=cs,
        best_final_score_us=result.best_score_us,
        is_new_best=result.is_new_best,
        meaningful=result.meaningful,
        incumbent=comparison,
        result=result,
        evidence=evidence,
        certifies=certifies,
        unverified=(GPU_UNVERIFIED if certifies == "correctness_and_speed" else CPU_UNVERIFIED)
        if passed
        else [],
        ran_on_hidden_cases=ran,
        sandbox=str(cand_sandbox.get("level") or "none"),
    )


def _certifies(
    raw: dict[str, Any], meaningful: bool
) -> Literal["outputs", "correctness_and_speed"]:
    """What a passed verdict certifies: the GPU replay's proof only where the runner says it
    replayed and its environment is a GPU's; on the Triton CPU interpreter the outputs alone
    (who computed them is the candidate process's own claim there)."""
    if raw.get("certifies") == "correctness_and_speed" and meaningful:
        return "correctness_and_speed"
    return "outputs"


async def _call_quietly(
    launcher: Launcher, request: dict[str, Any], ws: Workspace, progress: Progress | None
) -> RunnerCall:
    """The guarded runner, with progress that says nothing of the hidden cases: the launcher's
    own waits (the GPU lock, an allocation) and a fixed message every HEARTBEAT_S. The runner's
    per-case events are not forwarded: how many cases ran before a rejection, and when, would
    be the candidate's choice."""

    async def waits(ev: dict[str, Any]) -> None:
        if ev.get("event") == "waiting":
            await report(progress, 0, 1, str(ev.get("message")))

    async def heartbeat() -> None:
        waited = 0.0
        while True:
            await report(progress, 0, 1, f"guarded verify running ({waited:.0f} s)")
            await anyio.sleep(HEARTBEAT_S)
            waited += HEARTBEAT_S

    if progress is None:
        return await launcher.call(request, task=ws.task, on_event=waits, fresh=True, phased=True)
    done: list[RunnerCall | Exception] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(heartbeat)
        try:
            done.append(
                await launcher.call(request, task=ws.task, on_event=waits, fresh=True, phased=True)
            )
        except Exception as exc:  # raised below as itself, not inside an ExceptionGroup
            done.append(exc)
        tg.cancel_scope.cancel()
    if isinstance(done[0], Exception):
        raise done[0]
    return done[0]


__all__ = [
    "CERTIFIES",
    "MIN_SPEEDUP",
    "REASONS",
    "Verdict",
    "compare_incumbent",
    "guarded_verify",
    "incumbent_score",
    "judge",
    "judge_case",
    "wall_mismatch",
]
