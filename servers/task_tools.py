"""The kernel task server's nine tools as BuiltinTool records: description (what the model
reads), models, annotations and a thin async handler that calls tools/ and shapes the result."""

from __future__ import annotations

import json
import time
from collections import Counter

from mcp.server.mcpserver import Context

from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation import (
    EvalResult,
    numerical_probe,
    run_objective,
    run_step_objective,
)
from harnesslab.tools.evaluation.command import run_command_objective
from harnesslab.tools.evaluation.history import HistoryPage, rank_history, restore_candidate
from harnesslab.tools.evaluation.overview import Overview, overview
from harnesslab.tools.evaluation.profiling import ProfileReport, profile_kernel
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution import HealthReport, health_check
from harnesslab.tools.integrity import guarded_step_verify, guarded_verify, public_verdict
from harnesslab.tools.integrity.command_verify import command_verify
from harnesslab.tools.state import STATE
from harnesslab.tools.state import workspace_files as wf
from harnesslab.tools.task import kind_of

from .runtime import BuiltinTool, ServerState, reporter
from .task_models import (
    MAX_CASES_SHOWN,
    HealthIn,
    HiddenCase,
    HistoryIn,
    InspectIn,
    ObjectiveIn,
    ObjectiveOut,
    ProbeIn,
    ProbeOut,
    ProfileIn,
    RestoreIn,
    RestoreOut,
    SweepIn,
    SweepOut,
    VerifyIn,
    VerifyOut,
)


async def _inspect(state: ServerState, args: InspectIn, ctx: Context | None) -> Overview:
    return overview(state.workspace, state.launcher, recent=args.recent)


def _objective_next(status: str, new_best: bool, kernel: bool) -> str:
    if status != "passed":
        extra = "; numerical_probe shows which edge case breaks" if kernel else ""
        return (
            f"read reason and the failing cases, fix the files{extra}, or restore_best_checkpoint"
        )
    if new_best and kernel:
        return "new best: guarded_final_verify it, or keep optimizing (sweep_kernel_config, profile_kernel)"
    if new_best:
        return "new best: keep improving; rank_history shows the ranking"
    return "not better than the best: try another change, or restore_best_checkpoint"


async def _run_objective(
    state: ServerState, args: ObjectiveIn, ctx: Context | None
) -> ObjectiveOut:
    """The task kind's own dev objective (OBJECTIVE_BY_KIND)."""
    return await OBJECTIVE_BY_KIND[kind_of(state.workspace.task).name](state, args, ctx)


async def _command_objective(
    state: ServerState, args: ObjectiveIn, ctx: Context | None
) -> ObjectiveOut:
    """A command task's dev objective (tools/evaluation/command.py), in its own units."""
    ws = state.workspace
    run = await run_command_objective(
        ws,
        state.launcher,
        progress=reporter(ctx),
        warmup=args.warmup,
        repeats=args.repeats,
        cases=args.cases,
    )
    return ObjectiveOut(
        status=run.status,
        score=run.score,
        score_unit=kind_of(ws.task).score_label(ws.task, "dev"),
        meaningful=run.meaningful,
        candidate=run.candidate,
        record_id=run.record_id,
        best_score=run.best_score,
        delta_vs_best_pct=run.delta_vs_best_pct,
        is_new_best=run.is_new_best,
        reason=run.reason,
        command={
            "exit_code": run.exit_code,
            "timed_out": run.timed_out,
            "output": run.output,
            "stderr_tail": run.stderr_tail,
        },
        device=run.host,
        host=run.host,
        wall_s=run.wall_s,
        next_step=_objective_next(run.status, run.is_new_best, kernel=False),
    )


async def _kernel_objective(
    state: ServerState, args: ObjectiveIn, ctx: Context | None
) -> ObjectiveOut:
    """A kernel task's dev cases on the runner (tools/evaluation/objective.py)."""
    ws = state.workspace
    res = await run_objective(
        ws,
        state.launcher,
        cases=args.cases,
        warmup=args.warmup,
        repeats=args.repeats,
        progress=reporter(ctx),
    )
    return _objective_out(res, "us (sum of per-case median device time), lower is better",
                          _objective_next(res.status, res.is_new_best, kernel=True))  # fmt: skip


def _objective_out(res: EvalResult, score_unit: str, next_step: str) -> ObjectiveOut:
    """A dev run on the runner (a kernel's cases, a step task's traces) as the tool answers."""
    return ObjectiveOut(
        status=res.status,
        score=res.score_us,
        score_unit=score_unit,
        meaningful=res.meaningful,
        candidate=res.candidate,
        record_id=res.record_id,
        best_score=res.best_score_us,
        delta_vs_best_pct=res.delta_vs_best_pct,
        is_new_best=res.is_new_best,
        reason=res.reason,
        cases=res.cases[:MAX_CASES_SHOWN],
        device=res.env.device,
        host=res.env.host or "",
        gpu_index=res.env.gpu_index,
        wall_s=res.wall_s,
        phases_s={k: round(v, 4) for k, v in res.phases_s.items()},
        next_step=next_step,
    )


async def _step_objective(
    state: ServerState, args: ObjectiveIn, ctx: Context | None
) -> ObjectiveOut:
    """A step task's dev traces on the runner (evaluation/objective.py run_step_objective):
    a row per trace, its per-bucket table in `buckets`."""
    ws = state.workspace
    res = await run_step_objective(ws, state.launcher, traces=args.cases, progress=reporter(ctx))
    if res.status != "passed":
        nxt = "read reason (which step, which pass), fix kernel.py, or restore_best_checkpoint"
    else:
        nxt = "keep optimizing kernel.py; rank_history ranks the dev runs (this score is dev " \
              "feedback); guarded_final_verify checks the outputs on hidden traces and scores " \
              "a timed pass there"  # fmt: skip
    return _objective_out(res, kind_of(ws.task).score_label(ws.task, "dev"), nxt)


async def _sweep(state: ServerState, args: SweepIn, ctx: Context | None) -> SweepOut:
    ws = state.workspace
    kind_of(ws.task).check_cases(ws.task, args.cases, "cases")  # before the space's checks
    for knob, wanted in (args.space or {}).items():
        allowed = ws.task.space.get(knob, [])
        bad = [v for v in wanted if isinstance(v, bool) and not any(a is v for a in allowed)]
        if bad:  # True == 1 in Python: without this, num_warps=true would pass as 1
            raise UsageError(
                f"space: {knob}={bad[0]!r} is not allowed.",
                next_step=f"{knob} takes {','.join(map(str, allowed)) or 'no values'}",
            )
    res = await sweep(
        ws,
        state.launcher,
        space=args.space,
        cases=args.cases,
        max_configs=args.max_configs,
        apply=args.apply,
        progress=reporter(ctx),
    )
    rel = f"{STATE}/sweeps/{time.strftime('%Y%m%dT%H%M%S')}-{len(res.results)}.json"
    wf.write_json(ws.root, rel, res.model_dump(mode="json"))
    path = ws.root / rel
    improvement = None
    if res.best and res.best.score_us and res.current_score_us:
        improvement = 100.0 * (res.current_score_us - res.best.score_us) / res.current_score_us
    if res.best is None:
        nxt = "no config passed: read the reasons; fix kernel.py with run_objective first"
    elif res.applied:
        nxt = "best config applied: run_objective to record it, then guarded_final_verify"
    elif res.best.config == res.current_config:
        nxt = "the current config is already the best tried; look at profile_kernel next"
    else:
        nxt = "call again with apply=true (or edit kernel_config.json) to use the best config"
    return SweepOut(
        status=res.status,
        meaningful=res.meaningful,
        tried=res.tried,
        ok=res.ok,
        by_status=dict(Counter(r.status for r in res.results)),
        best=res.best,
        current_config=res.current_config,
        current_score_us=res.current_score_us,
        improvement_pct=improvement,
        applied=res.applied,
        applied_checkpoint=res.applied_checkpoint,
        results=res.results[: args.show],
        results_total=len(res.results),
        full_results_path=str(path),
        cases=res.cases,
        compile_s=res.compile_s,
        timing_s=res.timing_s,
        wall_s=res.wall_s,
        compile_workers=res.compile_workers,
        timing_requests=res.timing_requests,
        next_step=nxt + ("" if res.meaningful else " (CPU interpreter: timings not meaningful)"),
    )


async def _probe(state: ServerState, args: ProbeIn, ctx: Context | None) -> ProbeOut:
    rep = await numerical_probe(
        state.workspace,
        state.launcher,
        probes=args.probes,
        dtypes=args.dtypes,
        progress=reporter(ctx),
    )
    shown = [r for r in rep.results if args.show_passed or not r.passed]
    if rep.failing:
        first = next(r for r in rep.results if not r.passed)
        nxt = f"fix {first.probe} first: {first.why_it_matters or first.reason}"
    elif rep.status == "error":
        nxt = f"the probes did not run: {rep.reason}; run_objective shows import errors"
    else:
        nxt = "numerics are robust: optimize speed (sweep_kernel_config, profile_kernel)"
    return ProbeOut(
        status=rep.status,
        passed=rep.passed,
        failed=rep.failed,
        failing=rep.failing,
        results=[r.model_dump(exclude_none=True) for r in shown],
        candidate=rep.candidate,
        reason=rep.reason,
        next_step=nxt,
    )


async def _verify(state: ServerState, args: VerifyIn, ctx: Context | None) -> VerifyOut:
    """The task kind's own final verification (VERIFY_BY_KIND)."""
    return await VERIFY_BY_KIND[kind_of(state.workspace.task).name](state, args, ctx)


async def _verify_kernel(
    state: ServerState, args: VerifyIn, ctx: Context | None, verify=guarded_verify
) -> VerifyOut:
    """A kernel task's guarded verify on hidden cases (tools/integrity/verify.py); a step
    task's on hidden traces with `verify=guarded_step_verify` (the same Verdict; its score the
    timed pass's)."""
    v = await verify(
        state.workspace, state.launcher, state.settings, rotate=args.rotate, progress=reporter(ctx)
    )
    # Only the public view leaves the server: no hidden shape, and nothing the candidate's run
    # chose (tools/integrity/verdict_view.py).
    shown = public_verdict(v)
    cases = [
        HiddenCase(
            index=i, dtype=c["dtype"], status=c["status"], passed=c["passed"], reason=c["reason"]
        )
        for i, c in enumerate(shown["result"]["cases"][:MAX_CASES_SHOWN])
    ]
    if v.verdict == "passed" and v.score_us is None:
        nxt = "verified (outputs only: see certifies and unverified); keep optimizing with run_objective"
    elif v.verdict == "passed":
        nxt = "verified; keep optimizing, rank_history(mode='final') shows the final ranking"
    else:
        nxt = "rejected: read reasons; numerical_probe and run_objective reproduce most failures"
    return VerifyOut(
        verdict=v.verdict,
        reasons=shown["reasons"][:MAX_CASES_SHOWN],
        score_us=v.score_us,
        score=v.score_us,
        score_unit=kind_of(state.workspace.task).score_label(state.workspace.task, "final"),
        geomean_pct_of_copy_bw=v.geomean_pct_of_copy_bw,
        case_set=v.case_set,
        best_final_score_us=v.best_final_score_us,
        is_new_best=v.is_new_best,
        meaningful=v.meaningful,
        certifies=v.certifies,
        unverified=v.unverified,
        cases=cases,
        evidence=json.loads(json.dumps(shown["evidence"], default=str)),
        next_step=nxt,
    )


async def _verify_command(state: ServerState, args: VerifyIn, ctx: Context | None) -> VerifyOut:
    """A command task's final objective (tools/integrity/command_verify.py): score, verdict and reasons
    written by the harness; the hidden cases and the objective's output stay in the store."""
    v = await command_verify(
        state.workspace, state.launcher, state.settings, rotate=args.rotate, progress=reporter(ctx)
    )
    if v.verdict == "passed":
        nxt = "verified; keep improving, rank_history(mode='final') shows the final ranking"
    else:
        nxt = "not verified: read reasons; run_objective shows the dev objective's own messages"
    return VerifyOut(
        verdict=v.verdict,
        reasons=v.reasons[:MAX_CASES_SHOWN],
        score_us=v.score if v.unit == "us" else None,
        score=v.score,
        score_unit=v.score_label(),
        geomean_pct_of_copy_bw=None,
        case_set=v.case_set,
        best_final_score_us=v.best_final_score if v.unit == "us" else None,
        is_new_best=v.is_new_best,
        meaningful=v.meaningful,
        certifies=v.certifies,
        cases=[],
        evidence={
            "candidate": v.candidate,
            "hidden_cases": v.hidden_cases,
            "certifies": v.certifies,
            "sandbox": v.sandbox,
            "best_final_score": v.best_final_score,
            "warnings": v.warnings,
        },
        next_step=nxt,
    )


# What run_objective and guarded_final_verify do, per task kind (tools/task/kinds.py KINDS; a new
# kind adds its entries here: tests/servers/test_task_tools_kinds.py checks every kind has one).
# A step task's guarded verify checks its outputs on hidden traces (tools/integrity/step_verify.py).
OBJECTIVE_BY_KIND = {
    "kernel": _kernel_objective,
    "command": _command_objective,
    "step": _step_objective,
}


async def _verify_step(state: ServerState, args: VerifyIn, ctx: Context | None) -> VerifyOut:
    """A step task's guarded verify on hidden traces (tools/integrity/step_verify.py)."""
    return await _verify_kernel(state, args, ctx, verify=guarded_step_verify)


VERIFY_BY_KIND = {"kernel": _verify_kernel, "command": _verify_command, "step": _verify_step}


async def _history(state: ServerState, args: HistoryIn, ctx: Context | None) -> HistoryPage:
    return rank_history(
        state.workspace,
        mode=args.mode,
        offset=args.offset,
        limit=args.limit,
        include_failed=args.include_failed,
        chart=args.chart,
        case_set=args.case_set,
    )


async def _restore(state: ServerState, args: RestoreIn, ctx: Context | None) -> RestoreOut:
    res = restore_candidate(state.workspace, candidate=args.candidate, mode=args.mode)
    nxt = "files restored: run_objective to confirm the score"
    if not res.changed:
        nxt = "already identical: nothing changed"
    return RestoreOut(**res.model_dump(), next_step=nxt)


async def _profile(state: ServerState, args: ProfileIn, ctx: Context | None) -> ProfileReport:
    return await profile_kernel(
        state.workspace,
        state.launcher,
        case=args.case,
        repeats=args.repeats,
        progress=reporter(ctx),
    )


async def _health(state: ServerState, args: HealthIn, ctx: Context | None) -> HealthReport:
    return await health_check(state.launcher, state.workspace.task, runner=args.runner)


TASK_TOOLS: tuple[BuiltinTool, ...] = (
    BuiltinTool(
        name="inspect_context",
        title="Inspect task and workspace",
        description=(
            "Summarize the task and this workspace: task brief, editable files, dev cases, the "
            "hidden final-case domain (ranges only), launch space, numerical probes, current "
            "config and candidate hash, best dev/final scores, the last history entries, GPU "
            "slot status, and a suggested next step. Reads files only: no GPU time, milliseconds. "
            "Call it first, and whenever unsure what to do next."
        ),
        input_model=InspectIn,
        output_model=Overview,
        handler=_inspect,
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    BuiltinTool(
        name="run_objective",
        title="Run the objective",
        description=(
            "Evaluate the workspace as it is on the dev cases (all, or a subset): correctness "
            "against the reference, then timing (median, p10/p90, GB/s). Appends to the ledger, "
            "checkpoints the candidate, returns the per-case table and the delta against the best "
            "so far. Costs one runner session: ~1 s per case on a GPU (a few s on the CPU "
            "interpreter, where timings are not meaningful). Progress per case. Command tasks run "
            "their dev objective command instead (warmup/repeats/cases only where the command "
            "takes them; a failure's reason quotes its JSON error fields). Step tasks run their "
            "decode step over the dev traces (cases names traces): every step checked, a row "
            "per trace with p50/p95/p99 and tokens/s per sequence-length bucket. Next: "
            "guarded_final_verify on a new best, "
            "numerical_probe on a failure."
        ),
        input_model=ObjectiveIn,
        output_model=ObjectiveOut,
        handler=_run_objective,
        read_only=False,
        destructive=False,
        idempotent=False,
        gpu=True,
    ),
    BuiltinTool(
        name="sweep_kernel_config",
        title="Sweep launch configs",
        description=(
            "Evaluate many kernel_config.json launch configs in one GPU session: the task's "
            "declared space (sampled to max_configs) or a given sub-space, on all or some dev "
            "cases. Compiles in parallel and times each config that passed serially under the GPU "
            "lock while the others still compile (10 samples a case: "
            "enough to rank; run_objective's score takes 30); every config gets "
            "ok / compile_error / wrong_result / timeout, and one bad config never fails the "
            "sweep. apply=true writes the best correct config (the old files are checkpointed). "
            "Costs ~1.2 s per config (H200, rmsnorm_gate's 9 dev cases: 32 configs in 38 s; "
            "minutes for the full space). Progress per config. On a step task (decode_step) "
            "the knobs are those of the step's kernels and each config is scored by the step "
            "objective over the dev traces `cases` names (sum of p50 step latency, every step "
            "checked; per_case_us per trace): each config costs about one run_objective on those "
            "traces, so name one or two and keep max_configs small. "
            "Next: run_objective after apply, then guarded_final_verify."
        ),
        input_model=SweepIn,
        output_model=SweepOut,
        handler=_sweep,
        read_only=False,
        destructive=False,
        idempotent=False,
        gpu=True,
    ),
    BuiltinTool(
        name="numerical_probe",
        title="Probe numerical edge cases",
        description=(
            "Run the kernel on numerical edge cases against the fp32 reference, each dtype: "
            "the task's own probes, and the generic suite the guarded verify also runs on "
            "every hidden case (odd dims, a single row, an empty batch, the longest rows; a "
            "large offset with a small spread, per-column and per-row scales, single-column "
            "outliers, near-overflow, subnormals, signed zeros, ties) at a dev case's shape. "
            "Per probe: tolerance_ratio (worst error in tolerances), max abs/rel error, worst "
            "element, NaN/Inf count, which inputs a family changed, and why a failure "
            "matters. On a step task (decode_step) the probes are decode-step traces instead: "
            "long_context (prompts filling the KV cache to max_seq), ragged_contexts (empty to "
            "full prompts in one batch), large_embeddings and large_values (states scaled "
            "toward fp16 overflow), every step's logits checked; context says the longest "
            "context a step attended. Writes nothing. Costs a few GPU seconds. Next: fix the "
            "first failing probe, then run_objective."
        ),
        input_model=ProbeIn,
        output_model=ProbeOut,
        handler=_probe,
        read_only=True,
        destructive=False,
        idempotent=True,
        gpu=True,
    ),
    BuiltinTool(
        name="guarded_final_verify",
        title="Guarded final verification",
        description=(
            "Score the candidate on hidden final cases drawn from a secret seed, in a fresh runner "
            "with a pristine harness, several fresh input sets per case; compare with the best "
            "final result. Returns the verdict, one reason code, what it certifies and evidence; "
            "never a hidden shape, a per-case time or error, or which case failed (reproduce "
            "failures with run_objective and numerical_probe). Appends to the ledger. Costs "
            "~10-30 GPU seconds. Command tasks run their "
            "final objective instead (the task's own verifier, never your copy of it). Next: keep "
            "optimizing, or restore_best_checkpoint(mode='final') at the end."
        ),
        input_model=VerifyIn,
        output_model=VerifyOut,
        handler=_verify,
        read_only=False,
        destructive=False,
        idempotent=False,
        gpu=True,
    ),
    BuiltinTool(
        name="rank_history",
        title="Rank evaluated candidates",
        description=(
            "Rank the candidates evaluated so far in a mode (dev, final, sweep), de-duplicated by "
            "content hash: score, timing spread, config, when, status; marks the incumbent best. "
            "Paginated (offset/limit, next_offset). chart=true also saves a PNG of score over "
            "time and returns its path. No GPU time. Next: restore_best_checkpoint with a hash."
        ),
        input_model=HistoryIn,
        output_model=HistoryPage,
        handler=_history,
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
    BuiltinTool(
        name="restore_best_checkpoint",
        title="Restore a checkpoint",
        description=(
            "Restore the editable files of the best candidate of a mode, or of a named candidate "
            "hash from rank_history. The current files are checkpointed first, so this can be "
            "undone the same way. Returns which files changed. No GPU time. Next: run_objective "
            "to confirm the score."
        ),
        input_model=RestoreIn,
        output_model=RestoreOut,
        handler=_restore,
        read_only=False,
        destructive=True,
        idempotent=True,
    ),
    BuiltinTool(
        name="profile_kernel",
        title="Profile with Nsight Compute",
        description=(
            "Profile the kernel with Nsight Compute (ncu) on one dev case on the GPU host: "
            "duration, DRAM throughput % and GB/s, SM throughput %, achieved occupancy, registers "
            "per thread, local-memory spills, and a one-line bottleneck classification "
            "(memory-, compute-, latency/occupancy- or launch-bound). Needs a CUDA GPU and ncu. "
            "Costs ~10-30 s. On a step task (decode_step) `case` names a dev trace and the "
            "result is a per-kernel breakdown of one decode step (torch.profiler over the "
            "trace's last `repeats` steps after the rest warmed up, the steps checked): each "
            "kernel's launches, total_us and share_pct per step, the dominant one first; on the "
            "CPU interpreter it runs but is not meaningful (torch operators by CPU time). "
            "Next: act on the bottleneck, then run_objective."
        ),
        input_model=ProfileIn,
        output_model=ProfileReport,
        handler=_profile,
        read_only=True,
        destructive=False,
        idempotent=True,
        gpu=True,
    ),
    BuiltinTool(
        name="remote_health_check",
        title="Check the GPU hosts",
        description=(
            "Check every GPU host: reachability and command latency, GPU name, driver, free "
            "memory and clocks (nvidia-smi), torch/triton versions and measured copy bandwidth "
            "(runner), free disk. A GPU busy with an evaluation is reported, not waited for. "
            "Costs ~3 s (runner=false: under 1 s). Next: fix what `problems` names."
        ),
        input_model=HealthIn,
        output_model=HealthReport,
        handler=_health,
        read_only=True,
        destructive=False,
        idempotent=True,
    ),
)

__all__ = ["TASK_TOOLS"]
