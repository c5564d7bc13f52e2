"""inspect_context's library half: everything an agent needs to orient itself, read from files
only (no runner, no GPU lock, no torch import), so it answers in milliseconds even while a
sweep holds the GPU.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution import Launcher
from ..state import Workspace
from ..task import TaskSpec, kind_of
from .history import primary_case_set
from .probe import probe_names


class HistoryEntry(BaseModel):
    mode: str
    candidate: str
    status: str
    score: float | None
    when: str
    reason: str = ""
    case_set: str = Field(default="", description="scores compare only within a case set")
    untrusted: bool = Field(default=False, description="imported, never scored here")


class ExecutorStatus(BaseModel):
    slots: list[dict[str, Any]] = Field(description="[{slot, busy, calls}] one per GPU")
    interpreted: bool = Field(description="runs land on the Triton CPU interpreter (guess)")
    last_device: str | None = Field(description="device of the last runner result, if any")


class Protections(BaseModel):
    """Which of the trust model's protections are in force here (README "Threat model")."""

    sandbox: str = Field(
        description="how agent-written code is contained on the GPU host: full (Landlock + "
        "namespaces + seccomp), partial, none, or unknown (a remote host before its first run)"
    )
    guarded_verify: str = Field(description="'sandboxed', or why the guarded verify refuses")
    state_outside_workspace: bool = Field(
        description="the trusted store and the secret live outside the workspace"
    )
    same_user: bool = Field(
        description="the server runs as the user whose files the agent can reach: an agent "
        "with a shell could read the trusted store (run the server as another user to close it)"
    )


@functools.cache
def _local_sandbox() -> str:
    from ..gpu.isolation.sandbox import probe  # noqa: PLC0415 - forks once; inspect_context caches it

    return str(probe().get("level", "none"))


def protections(ws: Workspace, launcher: Launcher) -> Protections:
    level = (launcher.last_env or {}).get("sandbox")
    if not isinstance(level, str) or level not in ("full", "partial", "none"):
        local = all(ex.on_this_machine for ex in launcher.executors)
        level = _local_sandbox() if local else "unknown"
    state = launcher.settings.state_dir.expanduser().resolve()
    outside = not (state == ws.root or ws.root in state.parents)
    if level == "none" and not launcher.settings.allow_unsandboxed:
        verify = "refused: no sandbox on the GPU host (HARNESSLAB_ALLOW_UNSANDBOXED=1 to allow)"
    else:
        verify = "sandboxed" if level in ("full", "partial", "unknown") else "unsandboxed (allowed)"
    try:
        same_user = state.stat().st_uid == os.getuid()
    except OSError:
        same_user = True
    return Protections(
        sandbox=level, guarded_verify=verify, state_outside_workspace=outside, same_user=same_user
    )


class Overview(BaseModel):
    task: dict[str, Any]
    workspace: str
    candidate: str | None = Field(description="hash of the editable files now; None if missing")
    candidate_evaluated: bool = Field(description="the current files have a dev record")
    config: dict[str, Any] | None
    problems: list[str] = Field(default_factory=list, description="what is wrong right now")
    best_dev: HistoryEntry | None
    best_final: HistoryEntry | None
    recent: list[HistoryEntry] = Field(description="the last few ledger records, newest first")
    records: int
    executor: ExecutorStatus
    protections: Protections
    next_step: str


def _entry(rec: dict[str, Any]) -> HistoryEntry:
    return HistoryEntry(
        mode=str(rec.get("mode", "")),
        candidate=str(rec.get("candidate", "")),
        status=str(rec.get("status", "")),
        score=rec.get("score"),
        when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(rec.get("time", 0.0)))),
        reason=str(rec.get("reason") or "")[:300],
        case_set=str(rec.get("case_set") or ""),
        untrusted=bool(rec.get("untrusted")),
    )


def task_summary(ws: Workspace) -> dict[str, Any]:
    """The task in few JSON nodes: lists of numbers and short strings, not nested objects
    (each node costs validation and serialization on both ends of every call; this halves
    inspect_context's round trip)."""
    t = ws.task
    kind = kind_of(t)
    out: dict[str, Any] = {
        "name": t.name,
        "kind": t.kind,
        "summary": t.summary,
        "editable": t.editable,
        "brief": "task.md" if (ws.root / "task.md").is_file() else None,
    }
    out.update(TASK_FIELDS_BY_KIND[kind.name](t))
    return out


def _kernel_fields(t: TaskSpec) -> dict[str, Any]:
    """What an agent needs of a kernel task: its entry, launch space, tolerances and cases."""
    return dict(
        entry=t.entry,
        config_file=t.config_file,
        launch_space=t.space,
        config_rules=t.config_rules,
        tolerances={k: f"atol={v.atol:g} rtol={v.rtol:g}" for k, v in t.tolerances.items()},
        dev_cases={c.name: _shape(c.shape, c.dtype) for c in t.dev_cases},
        hidden_final_domain=describe_domain(t.final.describe()) if t.final else None,
        probes=", ".join(probe_names(t)),
        score="sum of per-case median device time in us; lower is better",
    )


def _command_fields(t: TaskSpec) -> dict[str, Any]:
    """What an agent needs of a command task: its objectives and how their scores read."""
    kind = kind_of(t)
    dev, final = t.objective_for("dev"), t.objective_for("final")
    return dict(
        objective=dev.command,
        final_objective=final.command,
        score_key=dev.score_key,
        score=f"run_objective: {kind.score_label(t, 'dev')}; guarded_final_verify (the "
        f"task's own final objective, never your copy of its files): "
        f"{kind.score_label(t, 'final')}",
        config_file=t.config_file,
        launch_space=t.space,
        hidden_final_domain=describe_domain(t.final.describe()) if t.final else None,
    )


def _step_fields(t: TaskSpec) -> dict[str, Any]:
    """What an agent needs of a step task: its entry, tolerances, sizes, dev traces and the
    launch knobs sweep_kernel_config tunes."""
    step = kind_of(t).require_steps(t, "inspect_context's step fields")
    return dict(
        entry=t.entry,
        config_file=t.config_file,
        launch_space=t.space,
        tolerances={k: f"atol={v.atol:g} rtol={v.rtol:g}" for k, v in t.tolerances.items()},
        model=step.model.model_dump(),
        interpreter_model=step.interpreter.model_dump(),
        dev_traces={x.name: f"{x.kind} {x.dtype}" for x in step.traces},
        score=f"run_objective: {kind_of(t).score_label(t, 'dev')}; guarded_final_verify: "
        f"{kind_of(t).score_label(t, 'final')}",
    )


# inspect_context's task fields per task kind (tools/task/kinds.py KINDS).
TASK_FIELDS_BY_KIND = {"kernel": _kernel_fields, "command": _command_fields, "step": _step_fields}


def _shape(shape: dict[str, int], dtype: str) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items()) + f" {dtype}"


def describe_domain(d: dict[str, Any]) -> str:
    """FinalDomain.describe() in one sentence: the ranges, never a drawn value."""
    parts = [f"{d['count']} cases drawn per secret seed", f"dtypes {', '.join(d['dtypes'])}"]
    for k, r in d.get("ranges", {}).items():
        step = f" (multiple of {r['multiple_of']})" if r.get("multiple_of", 1) > 1 else ""
        parts.append(f"{k} in {r['min']}..{r['max']}{step}")
    for k, opts in d.get("choices", {}).items():
        parts.append(f"{k} one of {', '.join(map(str, opts))}")
    for req in d.get("always_includes", []):
        parts.append("always a case with " + " ".join(f"{k}={v}" for k, v in req.items()))
    return "; ".join(parts)


def overview(ws: Workspace, launcher: Launcher, *, recent: int = 5) -> Overview:
    ws.ensure_exists()
    problems: list[str] = []
    candidate = config = None
    try:
        candidate = ws.candidate_hash()
    except UsageError as exc:
        problems.append(str(exc))
    if kind_of(ws.task).reads_launch_config(ws.task):
        try:
            config = ws.read_config()
        except UsageError as exc:
            problems.append(str(exc))
    ledger = ws.ledger()
    records = ledger.records()
    best_dev, best_final = (
        ledger.best(mode, case_set=cs) if (cs := primary_case_set(ws, ledger, mode)) else None
        for mode in ("dev", "final")
    )
    evaluated = any(r.get("candidate") == candidate and r.get("mode") == "dev" for r in records)
    last_dev = next((r for r in reversed(records) if r.get("mode") == "dev"), None)
    slots = [{"slot": s.label, "busy": s.lock.locked(), "calls": s.calls} for s in launcher.slots]
    execs = ExecutorStatus(
        slots=slots,
        interpreted=launcher.probably_interpreted(),
        last_device=(launcher.last_env or {}).get("device"),
    )
    return Overview(
        task=task_summary(ws),
        workspace=str(ws.root),
        candidate=candidate,
        candidate_evaluated=evaluated,
        config=config,
        problems=problems,
        best_dev=_entry(best_dev) if best_dev else None,
        best_final=_entry(best_final) if best_final else None,
        recent=[_entry(r) for r in reversed(records[-recent:])],
        records=len(records),
        executor=execs,
        protections=protections(ws, launcher),
        next_step=suggest(ws, problems, evaluated, last_dev, best_dev, best_final),
    )


def suggest(
    ws: Workspace,
    problems: list[str],
    evaluated: bool,
    last_dev: dict[str, Any] | None,
    best_dev: dict[str, Any] | None,
    best_final: dict[str, Any] | None,
) -> str:
    kind = kind_of(ws.task)
    if problems:
        return f"fix this first: {problems[0]}"
    if last_dev is None:
        return "call run_objective to score the baseline"
    if not evaluated:
        return "your files changed since the last evaluation: call run_objective"
    if last_dev.get("status") != "passed":
        probe = kind.applies("numerical_probe")
        hint = " (numerical_probe tells which edge case breaks)" if probe else ""
        return (
            f"the last evaluation failed: {str(last_dev.get('reason'))[:160]}; fix it{hint}, "
            "or restore_best_checkpoint"
        )
    return NEXT_BY_KIND[kind.name](best_dev, best_final)


def _next_command(best_dev: dict[str, Any] | None, best_final: dict[str, Any] | None) -> str:
    if best_final is None or best_final.get("candidate") != (best_dev or {}).get("candidate"):
        return "improve the editable files and call run_objective; guarded_final_verify scores the best with the task's final objective"
    return "improve the editable files and call run_objective; rank_history shows the best"


def _next_kernel(best_dev: dict[str, Any] | None, best_final: dict[str, Any] | None) -> str:
    if best_final is None or (best_dev and best_final.get("candidate") != best_dev["candidate"]):
        return "call guarded_final_verify to score the best candidate on hidden cases"
    return (
        "tune launch parameters with sweep_kernel_config, read profile_kernel's bottleneck, "
        "then edit kernel.py"
    )


# After a passing evaluation, what to do next, per task kind (tools/task/kinds.py KINDS).
def _next_step(best_dev: dict[str, Any] | None, best_final: dict[str, Any] | None) -> str:
    return (
        "edit kernel.py (fuse, capture CUDA graphs per bucket) and call run_objective; "
        "profile_kernel names the kernel that dominates a step, sweep_kernel_config tunes "
        "its launch knobs"
    )


NEXT_BY_KIND = {"kernel": _next_kernel, "command": _next_command, "step": _next_step}


__all__ = ["HistoryEntry", "Overview", "overview", "task_summary"]
