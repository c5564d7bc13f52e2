"""sweep_kernel_config's library half: many launch configs in one GPU session.

Configs come from the task's declared space (or a sub-space), capped by max_configs. Compiles
run first on the launcher's warm compile workers (execution/compile_pool.py; no GPU lock:
Triton writes its on-disk cache), then every config that compiled is timed serially under the
GPU lock by a warm runner, hitting that cache: on one GPU, or, where the launcher has several
slots (GPUs of several hosts, or of a Slurm allocation), dealt over all of them, one runner per
GPU, each config's result naming the host and GPU it was timed on. Every config gets a
structured status; one bad config never fails the sweep. apply=True writes the best correct
config into kernel_config.json after checkpointing the current files.

On a step task (decode_step) the knobs are those of any kernel in the step, and each config is
scored by the step objective (the sum over the dev traces named by `cases` of the p50 step
latency, every step checked: a config that breaks a step is wrong_result) in the runner's step
mode. Its configs skip phase 1: compiles happen inside each trace's first steps.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
from collections.abc import Awaitable
from typing import Any, Literal

import anyio
from pydantic import BaseModel, Field

from ..errors import UsageError, first_fault
from ..execution import Launcher, RunnerCall
from ..execution.disk import stage_full
from ..progress import Progress
from ..state import Checkpoints, Workspace
from ..state import workspace_files as wf
from ..task import kind_of
from .progress import case_events_progress
from .request import kernel_request

ConfigStatus = Literal["ok", "compile_error", "wrong_result", "timeout", "error"]


class ConfigResult(BaseModel):
    config: dict[str, Any]
    status: ConfigStatus
    score_us: float | None = None
    reason: str = ""
    per_case_us: dict[str, float] = Field(default_factory=dict)
    host: str | None = Field(default=None, description="where it was timed (the node)")
    gpu_index: str | None = Field(default=None, description="which GPU of that host")


class SweepResult(BaseModel):
    status: Literal["passed", "failed"]
    meaningful: bool
    tried: int
    ok: int
    best: ConfigResult | None
    current_config: dict[str, Any]
    current_score_us: float | None = Field(
        default=None, description="the workspace's own config, when it was in the sweep"
    )
    results: list[ConfigResult] = Field(description="sorted: best first, failures last")
    applied: bool = False
    applied_checkpoint: str | None = Field(
        default=None, description="checkpoint of the files before apply"
    )
    cases: list[str]
    compile_s: float = 0.0
    timing_s: float = 0.0
    compile_workers: int = Field(default=0, description="warm compile workers used (0: none)")


def expand_space(
    ws: Workspace, space: dict[str, list[Any]] | None, max_configs: int, base: dict[str, Any]
) -> list[dict[str, Any]]:
    declared = ws.task.space
    space = space or declared
    for key, values in space.items():
        if key not in declared:
            raise UsageError(
                f"space: unknown knob {key!r}.", next_step=f"knobs are: {', '.join(declared)}"
            )
        if not isinstance(values, list) or not values:
            raise UsageError(
                f"space: {key} needs a non-empty list of values.",
                next_step=f"{key} takes {','.join(map(str, declared[key]))}",
            )
        # bool is an int in Python (True == 1): a JSON `true` must not pass as num_warps=1.
        bad = [v for v in values if isinstance(v, bool) or v not in declared[key]]
        if bad:
            raise UsageError(
                f"space: {key}={bad[0]!r} is not allowed.",
                next_step=f"{key} takes {','.join(map(str, declared[key]))}",
            )
    keys = list(space)
    combos = [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*space.values())]
    configs = [{**base, **c} for c in combos]
    if len(configs) > max_configs:
        # Deterministic sample that keeps the current config in play.
        rng = random.Random(json.dumps(space, sort_keys=True))
        keep = [c for c in configs if c == base]
        rest = [c for c in configs if c != base]
        configs = keep + rng.sample(rest, max_configs - len(keep))
    return configs


def classify(entry: dict[str, Any]) -> ConfigStatus:
    if entry["status"] == "passed":
        return "ok"
    cases = entry.get("cases") or []
    reasons = " ".join(c.get("reason", "") for c in cases) + entry.get("reason", "")
    if any(c.get("status") == "crash" for c in cases):
        return "error"  # the process died under it (salvage): neither a timeout nor a compile
    if any(c.get("status") == "timeout" for c in cases) or "timeout" in reasons:
        return "timeout"
    if (
        "import failed" in reasons
        or "CompilationError" in reasons
        or any(c.get("status") == "error" for c in cases)
    ):
        return "compile_error"
    return "wrong_result"


def phase(progress: Progress | None, offset: int, scale: int) -> Progress | None:
    """`progress` for one phase of a sweep: done shifted by `offset`; the total is
    `scale` x the phase's own (phase 1 announces both phases' configs)."""
    if progress is None:
        return None

    def report(done: float, total: float, message: str) -> Awaitable[None] | None:
        assert progress is not None
        return progress(offset + done, offset + scale * total, message)

    return report


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def salvage(call: RunnerCall, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A timing runner that timed out or crashed: the configs it reported, the rest as
    timeouts (it was killed at its time limit) or crashes (it died under them)."""
    done = {_key(ev["config"]): ev for ev in call.events if ev.get("event") == "config"}
    status = "timeout" if call.timed_out else "crash"
    return [
        done.get(_key(c))
        or {
            "config": c,
            "status": "failed",
            "score_us": None,
            "reason": f"{status}: {call.failure()}",
            "cases": [{"status": status}],
        }
        for c in configs
    ]


async def sweep(
    ws: Workspace,
    launcher: Launcher,
    *,
    space: dict[str, list[Any]] | None = None,
    cases: list[str] | None = None,
    max_configs: int = 32,
    apply: bool = False,
    progress: Progress | None = None,
    compile_workers: int | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
) -> SweepResult:
    kind = kind_of(ws.task)
    kind.require_runner(ws.task, "sweep_kernel_config")
    if not 1 <= max_configs <= 256:
        raise UsageError(f"max_configs={max_configs} is out of range.", next_step="use 1..256")
    candidate = ws.snapshot()
    base = ws.read_config(candidate)
    configs = expand_space(ws, space, max_configs, base)
    selected = kind.select(ws.task, cases)
    seed = secrets.randbelow(2**31)
    # A kernel's configs run on its dev cases; a step's on its dev traces (the step objective).
    at = kind.runner_cases(ws.task, cases)
    request = kernel_request(
        ws, launcher, candidate, "sweep", seed=seed, warmup=warmup, repeats=repeats, **at
    )
    whole_runs = kind.sweep_runs_objective
    compile_s = 0.0
    compiled: dict[str, dict[str, Any]] = {}  # config key -> the pool's entry for it
    interpreted = launcher.probably_interpreted()
    if not whole_runs and (not interpreted or compile_workers) and len(configs) > 1:
        # Phase 1: compile (and check) on the launcher's warm compile workers, in parallel,
        # without the GPU lock; Triton's on-disk cache carries the binaries to phase 2.
        t0 = anyio.current_time()
        pooled = await launcher.compile_pool.compile(
            request, configs, task=ws.task, workers=compile_workers, progress=phase(progress, 0, 2)
        )
        compile_s = anyio.current_time() - t0
        compiled = {_key(e["config"]): e for e in pooled or []}
        # Configs that failed for want of disk space are the host's fault (measured there).
        said = [json.dumps(e) for e in compiled.values() if e.get("status") != "passed"]
        executor = launcher.slots[0].executor
        if (full := await stage_full(executor, executor.path("stage"), said)) is not None:
            raise full
    # Phase 2: time under the GPU lock (warm runners, warm caches) only the configs that
    # compiled and passed, dealt over every slot when there are several; a config that failed
    # in phase 1 keeps that entry.
    to_time = [c for c in configs if compiled.get(_key(c), {}).get("status", "passed") == "passed"]
    t1 = anyio.current_time()
    slots = launcher.slots[: max(1, len(to_time))]
    shares = [to_time[i :: len(slots)] for i in range(len(slots))]
    calls: list[RunnerCall | None] = [None] * len(slots)
    # Progress only grows and keeps its total (MCP): with phase 1, the total is 2 x configs and
    # phase 2 counts on from 2 x configs - the configs it times (a config that failed to compile
    # is done after phase 1).
    offset = 2 * len(configs) - len(to_time) if compiled else 0
    on_event = case_events_progress(len(to_time), phase(progress, offset, 1), unit="config")

    async def time_share(i: int) -> None:
        calls[i] = await launcher.call(
            {**request, "configs": shares[i]},
            task=ws.task,
            on_event=on_event,
            # A step task's config is a whole step objective (run_objective's timeout each).
            timeout_s=launcher.settings.eval_timeout_s
            * max(4, len(shares[i]) if whole_runs else 0),
            slot=slots[i] if len(slots) > 1 else None,
        )

    if to_time:
        try:
            async with anyio.create_task_group() as tg:
                for i in range(len(slots)):
                    if shares[i]:
                        tg.start_soon(time_share, i)
        except BaseExceptionGroup as group:  # a lost connection: the fault, not a group
            fault = first_fault(group)
            if fault is group:
                raise
            raise fault from None
    for call in calls:  # a runner killed from outside: the host's fault, no config's
        if call is not None and (killed := call.fault()) is not None:
            raise killed
    timing_s = anyio.current_time() - t1
    meaningful = not interpreted
    by_key: dict[str, dict[str, Any]] = {}
    for share, call in zip(shares, calls, strict=True):
        if call is None:
            continue
        env = (call.result or {}).get("env") or {}
        meaningful = bool(env.get("meaningful"))
        timed = (call.result or {}).get("configs") or salvage(call, share)
        missing = [c for c in share if _key(c) not in {_key(e["config"]) for e in timed}]
        for e in [*timed, *salvage(call, missing)]:
            by_key[_key(e["config"])] = {
                **e,
                "host": env.get("host"),
                "gpu_index": env.get("gpu_index"),
            }
    entries = [by_key.get(_key(c)) or compiled[_key(c)] for c in configs]
    results = []
    for e in entries:
        status = classify(e)
        per_case = {
            c["name"]: c["median_us"] for c in e.get("cases", []) if c.get("median_us") is not None
        }
        results.append(
            ConfigResult(
                config=e["config"],
                status=status,
                score_us=e.get("score_us") if status == "ok" else None,
                reason=e.get("reason", ""),
                per_case_us=per_case,
                host=e.get("host"),
                gpu_index=None if e.get("gpu_index") is None else str(e["gpu_index"]),
            )
        )
    ok = [r for r in results if r.status == "ok" and r.score_us is not None]
    ok.sort(key=lambda r: r.score_us or 0.0)
    failed = [r for r in results if r not in ok]
    best = ok[0] if ok else None
    current = next((r.score_us for r in ok if r.config == base), None)
    out = SweepResult(
        status="passed" if ok else "failed",
        meaningful=meaningful,
        tried=len(results),
        ok=len(ok),
        best=best,
        current_config=base,
        current_score_us=current,
        results=ok + failed,
        cases=[c.name for c in selected],
        compile_s=compile_s,
        timing_s=timing_s,
        compile_workers=len(launcher.compile_pool.workers) if compiled else 0,
    )
    ws.ensure_exists()  # a workspace deleted mid-sweep is not recreated by the writes below
    ws.ledger().append(
        {
            "mode": "sweep",
            "case_set": "all" if not cases else ",".join(sorted(cases)),
            "candidate": candidate.digest,
            "status": out.status,
            "score": best.score_us if best else None,
            "config": best.config if best else base,
            "meaningful": meaningful,
            "tried": out.tried,
            "ok": out.ok,
            "seed": seed,
        }
    )
    if apply and best is not None and best.config != base:
        out.applied_checkpoint = Checkpoints(ws).save(candidate.files)
        wf.write_text(ws.root, ws.task.config_file, json.dumps(best.config, indent=2) + "\n")
        out.applied = True
    return out


__all__ = ["ConfigResult", "SweepResult", "expand_space", "sweep"]
