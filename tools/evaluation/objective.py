"""run_objective's library half: evaluate the workspace as it is on the dev cases (a step task:
on its dev traces, `run_step_objective`).

snapshot the candidate (editable files, content hash: Workspace.snapshot) -> the runner request
(request.py) -> runner on an executor slot -> EvalResult, ledger append + checkpoint
(recording.py) with the delta against the best so far. This module only orders those steps.

Side of the trust boundary: trusted (host); dev numbers are feedback for the agent, not a
verdict (the guarded verify is tools/integrity/verify.py).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ..execution import Launcher
from ..progress import Progress
from ..state import Candidate, Workspace
from ..task import Case, kind_of
from .progress import case_events_progress
from .recording import breakdown, record, to_eval_result
from .request import check_bounds, kernel_request
from .results import EvalResult


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
    kind = kind_of(ws.task)
    kind.require_runner(ws.task, "run_objective on the runner")
    selected = kind.select(ws.task, cases)
    check_bounds(warmup, repeats)
    t_begin = time.perf_counter()
    candidate = ws.snapshot()
    config = ws.read_config(candidate)
    seed = secrets.randbelow(2**31) if seed is None else seed
    request = kernel_request(
        ws,
        launcher,
        candidate,
        "evaluate",
        seed=seed,
        warmup=warmup,
        repeats=repeats,
        **kind.runner_cases(ws.task, cases),
    )
    return await _call(ws, launcher, request, candidate, selected, cases, config=config,
                       seed=seed, save=save, progress=progress, t_begin=t_begin)  # fmt: skip


async def _call(
    ws: Workspace,
    launcher: Launcher,
    request: dict[str, Any],
    candidate: Candidate,
    selected: list[Case],
    names: list[str] | None,
    *,
    config: dict[str, Any],
    seed: int,
    save: bool,
    progress: Progress | None,
    t_begin: float,
) -> EvalResult:
    """The runner call of a dev run and its record (case set: `names`, or all of them)."""
    call = await launcher.call(
        request, task=ws.task, on_event=case_events_progress(len(selected), progress)
    )
    t_call = time.perf_counter()
    if (fault := call.fault()) is not None:  # the host's, not the candidate's: no record
        raise fault
    result = to_eval_result(
        call, selected, candidate=candidate.digest, config=config, mode="dev", seed=seed
    )
    if save:
        record(ws, result, candidate, case_set="all" if not names else ",".join(sorted(names)))
    result.phases_s = breakdown(call, snapshot_s=t_call - t_begin - sum(call.phases_s.values()),
                                result_s=time.perf_counter() - t_call)  # fmt: skip
    return result


async def run_step_objective(
    ws: Workspace,
    launcher: Launcher,
    *,
    traces: list[str] | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    save: bool = True,
) -> EvalResult:
    """run_objective on a step task: the candidate's step over the dev traces (all, or `traces`
    by name) in the runner's step mode (gpu/step_trace.py); one row per trace with its
    per-bucket table, recorded like every dev run (rank_history and restore_best_checkpoint
    read it). The score: the sum over the traces of the p50 step latency."""
    kind = kind_of(ws.task)
    kind.require_steps(ws.task, "run_objective's step traces")
    t_begin = time.perf_counter()
    candidate = ws.snapshot()
    selected = kind.select(ws.task, traces)
    seed = secrets.randbelow(2**31) if seed is None else seed
    request = kernel_request(ws, launcher, candidate, "step", seed=seed,
                             **kind.runner_cases(ws.task, traces))  # fmt: skip
    return await _call(ws, launcher, request, candidate, selected, traces, config={}, seed=seed,
                       save=save, progress=progress, t_begin=t_begin)  # fmt: skip


__all__ = ["run_objective", "run_step_objective"]
