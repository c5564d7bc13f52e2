"""run_objective's library half: evaluate the workspace as it is on the dev cases.

snapshot editable files (content hash) -> stage -> runner on an executor slot -> ledger append
+ checkpoint -> EvalResult with the delta against the best so far.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NamedTuple

from ..errors import UsageError
from ..execution.launcher import Launcher, RunnerCall
from ..gpu.scores import score_of
from ..state.checkpoints import Checkpoints
from ..state.storage import append_jsonl, require_space
from ..state.workspace import Workspace
from ..task.kinds import kind_of
from ..task.spec import Case
from .results import CaseResult, EnvInfo, EvalResult

Progress = Callable[[float, float, str], Awaitable[None] | None]

MAX_WARMUP, MAX_REPEATS = 100, 200


def require_kernel_task(ws: Workspace, tool: str) -> None:
    if not kind_of(ws.task).runs_kernel:
        raise UsageError(
            f"{tool} works on kernel tasks; {ws.task.name!r} is a {ws.task.kind} task.",
            next_step="use run_objective, rank_history and restore_best_checkpoint",
        )


def select_cases(ws: Workspace, names: list[str] | None) -> list[Case]:
    if not names:
        return list(ws.task.dev_cases)
    return [ws.task.dev_case(n) for n in names]


def check_bounds(warmup: int | None, repeats: int | None) -> None:
    if warmup is not None and not 0 <= warmup <= MAX_WARMUP:
        raise UsageError(f"warmup={warmup} is out of range.", next_step=f"use 0..{MAX_WARMUP}")
    if repeats is not None and not 1 <= repeats <= MAX_REPEATS:
        raise UsageError(f"repeats={repeats} is out of range.", next_step=f"use 1..{MAX_REPEATS}")


async def report(progress: Progress | None, done: float, total: float, message: str) -> None:
    """One progress step to `progress` (a sync or async callable), if there is one."""
    if progress is not None:
        maybe = progress(done, total, message)
        if maybe is not None:
            await maybe


def case_events_progress(total: int, progress: Progress | None, unit: str = "case"):
    """The runner's streamed events as `progress(done, total, message)`: one step per event of
    `unit` ("case"; "config" for a sweep, whose runner also streams each config's cases;
    "probe"), never past `total`; "waiting" (for the GPU, for a Slurm allocation) says why
    nothing moves."""
    done = [0]

    async def on_event(ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if progress is None or kind not in ("waiting", unit):
            return
        if kind == "waiting":
            await report(progress, done[0], total, str(ev.get("message")))
            return
        done[0] = min(done[0] + 1, total)
        if kind == "case" and "name" not in ev:  # a hidden case: index only
            label = f"case {done[0]} of {total}"
        elif kind == "config":
            label = f"config {done[0]} of {total}"
        else:
            label = ev.get("name") or ev.get("probe") or kind
        await report(progress, done[0], total, f"{label}: {ev.get('status', '')}")

    return on_event


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
    files: dict[str, bytes],
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
    files, append the ledger record (`entry` plus mode, candidate, status, score, case set), and
    move the best pointer when a passing score beats the best on the same `case_set` in the
    task's direction (all in the trusted store). `hidden`: per-case results with their hidden
    shapes (final runs), kept in the store only, with `store_only`'s fields (a command task's
    full objective output)."""
    ws.ensure_exists()  # a workspace deleted mid-run is not recreated by the writes below
    # A record is written whole or not begun: DiskFull (naming the store) before any write.
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
    files: dict[str, bytes],
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
        files,
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


def kernel_request(
    ws: Workspace,
    launcher: Launcher,
    files: dict[str, bytes],
    digest: str,
    mode: str,
    *,
    cases: list[Case] | None = None,
    seed: int | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The runner request for the candidate `files` (staged under their hash): one shape for
    every mode, so what the runner sees never depends on which tool asked."""
    staged = launcher.stage_candidate(files, digest, scope=ws.store.root.name)
    request: dict[str, Any] = {
        "mode": mode,
        "candidate_dir": f"@stage/{staged}",
        "entry": ws.task.entry,
        "config_file": ws.task.config_file,
        "tolerances": {k: v.model_dump() for k, v in ws.task.tolerances.items()},
        "triton_cache": f"@stage/{launcher.dev_cache_of(staged)}/{digest}",
        "numerics": ws.task.numerics_request(),
        **extra,
    }
    if cases is not None:
        request["cases"] = [c.model_dump() for c in cases]
    if seed is not None:
        request["seed"] = seed
    if warmup is not None:
        request["warmup"] = warmup
    if repeats is not None:
        request["repeats"] = repeats
    return request


async def run_objective(
    ws: Workspace,
    launcher: Launcher,
    *,
    cases: list[str] | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    save: bool = True,
) -> EvalResult:
    """Evaluate the workspace on dev cases (all, or `cases` by name)."""
    require_kernel_task(ws, "run_objective on the runner")
    check_bounds(warmup, repeats)
    t_begin = time.perf_counter()
    files = ws.editable_files()
    config = ws.read_config()
    selected = select_cases(ws, cases)
    digest = ws.candidate_hash(files)
    seed = secrets.randbelow(2**31) if seed is None else seed
    request = kernel_request(
        ws,
        launcher,
        files,
        digest,
        "evaluate",
        cases=selected,
        seed=seed,
        warmup=warmup,
        repeats=repeats,
    )
    call = await launcher.call(
        request, task=ws.task, on_event=case_events_progress(len(selected), progress)
    )
    t_call = time.perf_counter()
    if (fault := call.fault()) is not None:  # the host's, not the candidate's: no record
        raise fault
    result = to_eval_result(call, selected, candidate=digest, config=config, mode="dev", seed=seed)
    if save:
        case_set = "all" if not cases else ",".join(sorted(cases))
        record(ws, result, files, case_set=case_set)
    result.phases_s = breakdown(call, snapshot_s=t_call - t_begin - sum(call.phases_s.values()),
                                result_s=time.perf_counter() - t_call)  # fmt: skip
    return result


def breakdown(call: RunnerCall, *, snapshot_s: float, result_s: float) -> dict[str, float]:
    """Where one evaluation's seconds went, host and runner side by side (exclusive phases):
    snapshot (editable files, hash), stage, gpu_lock, sync, transport (the round trip to the
    runner minus the runner's own time), the runner's phases (load, inputs, correctness,
    timing_inputs, timing, copy_bandwidth, other) and result (assembly, ledger, checkpoint)."""
    host = dict(call.phases_s)
    runner = {k: float(v) for k, v in ((call.result or {}).get("phases_s") or {}).items()}
    runner_wall = float((call.result or {}).get("runner_wall_s") or 0.0)
    out = {"snapshot": snapshot_s, **{k: v for k, v in host.items() if k != "runner_round_trip"}}
    out["transport"] = max(0.0, host.get("runner_round_trip", 0.0) - runner_wall)
    out.update({f"runner_{k}": v for k, v in runner.items()})
    out["runner_other"] = max(0.0, runner_wall - sum(runner.values()))
    out["result"] = result_s
    return out


__all__ = [
    "Recorded",
    "breakdown",
    "check_bounds",
    "kernel_request",
    "record",
    "record_run",
    "require_kernel_task",
    "run_objective",
    "select_cases",
    "to_eval_result",
]
