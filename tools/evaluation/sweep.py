"""sweep_kernel_config's library half: many launch configs in one GPU session.

Configs come from the task's declared space (or a sub-space), capped by max_configs. They
compile on the launcher's warm compile workers (execution/compile_pool.py; no GPU lock: Triton
writes its on-disk cache) and, as each one passes, are timed serially under the GPU lock by a
warm runner, hitting that cache, while the others still compile (evaluation/sweep_pipeline.py):
on one GPU, or, where the launcher has several slots (GPUs of several hosts, or of a Slurm
allocation), dealt over whichever are idle, one runner per GPU, each config's result naming the
host and GPU it was timed on. Every config gets a structured status; one bad config never fails
the sweep. apply=True writes the best correct config into kernel_config.json after
checkpointing the current files.

On a step task (decode_step) the knobs are those of any kernel in the step, and each config is
scored by the step objective (the sum over the dev traces named by `cases` of the p50 step
latency, every step checked: a config that breaks a step is wrong_result) in the runner's step
mode. Its configs skip the compile pool: compiles happen inside each trace's first steps.
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution import Launcher, RunnerCall
from ..progress import Progress
from ..state import Checkpoints, Workspace
from ..state import workspace_files as wf
from ..task import kind_of
from .request import kernel_request
from .sweep_pipeline import Pipeline, config_key

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
    compile_s: float = Field(
        default=0.0, description="from the start to the last compile's end (0: no compile pool)"
    )
    timing_s: float = Field(
        default=0.0,
        description="from the first timing request to the last result; it overlaps compile_s",
    )
    wall_s: float = Field(
        default=0.0,
        description="compiles and timing together (compile_s + timing_s - wall_s: the overlap)",
    )
    compile_workers: int = Field(default=0, description="warm compile workers used (0: none)")
    timing_requests: int = Field(
        default=0, description="requests to the timing runners (configs that passed, in batches)"
    )


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


def salvage(call: RunnerCall, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A timing runner that timed out or crashed: the configs it reported, the rest as
    timeouts (it was killed at its time limit) or crashes (it died under them)."""
    done = {config_key(ev["config"]): ev for ev in call.events if ev.get("event") == "config"}
    status = "timeout" if call.timed_out else "crash"
    return [
        done.get(config_key(c))
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
    interpreted = launcher.probably_interpreted()
    # Compiles (and checks) run on the launcher's warm compile workers, in parallel, without the
    # GPU lock (Triton's on-disk cache carries the binaries to the timing runner), overlapped
    # with the timing of the configs that passed: evaluation/sweep_pipeline.py.
    pipeline = Pipeline(
        launcher,
        request,
        ws.task,
        configs,
        compiling=not whole_runs and bool(not interpreted or compile_workers) and len(configs) > 1,
        workers=compile_workers,
        # A step task's config is a whole step objective (run_objective's timeout each).
        timeout_s=lambda batch: (
            launcher.settings.eval_timeout_s * max(4, len(batch) if whole_runs else 0)
        ),
        progress=progress,
    )
    await pipeline.run()
    compiled = pipeline.compiled  # config key -> the pool's entry for it
    meaningful = not interpreted
    by_key: dict[str, dict[str, Any]] = {}
    for batch, call in pipeline.timed:
        env = (call.result or {}).get("env") or {}
        meaningful = bool(env.get("meaningful"))
        timed = (call.result or {}).get("configs") or salvage(call, batch)
        got = {config_key(e["config"]) for e in timed}
        missing = [c for c in batch if config_key(c) not in got]
        for e in [*timed, *salvage(call, missing)]:
            by_key[config_key(e["config"])] = {
                **e,
                "host": env.get("host"),
                "gpu_index": env.get("gpu_index"),
            }
    entries = [by_key.get(config_key(c)) or compiled[config_key(c)] for c in configs]
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
        compile_s=pipeline.compile_s(),
        timing_s=pipeline.timing_s(),
        wall_s=pipeline.wall_s(),
        compile_workers=len(launcher.compile_pool.workers) if compiled else 0,
        timing_requests=len(pipeline.timed),
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
