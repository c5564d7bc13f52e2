"""run_objective for command tasks: the task's dev objective, a command printing JSON with a
score key (e.g. `{python} benchmark.py --json --mode dev`, key `best_us`).

The command runs through the launcher's executor under a GPU lock (it may time the GPU), inside
the sandbox, in the workspace itself on the local executor, or in a synced copy of it (without
`.harnesslab/`) on a remote one. run_objective's warmup/repeats/cases fill its {warmup}
{repeats} {cases} placeholders (an argument it has no placeholder for is an error, not ignored).
Its JSON is parsed, the score recorded in the ledger with the objective's direction, and the
candidate checkpointed, so rank_history and restore_best_checkpoint work on command tasks as on
kernel tasks. This is the agent's feedback (its own files, its own text in the reason); the
verdict is the final objective's (tools/integrity/command_verify.py).
"""

from __future__ import annotations

import shutil
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution import Launcher
from ..progress import Progress, report
from ..state import STATE, Candidate, Workspace
from ..task.kinds import CommandKind, kind_of
from ..task.spec import Objective
from .command_run import (
    capped_output,
    dev_reason,
    expand,
    meaningful_of,
    parse_output,
    run_sandboxed,
    says_failed,
    score_of,
)
from .recording import record_run

COMMAND_CASE_SET = CommandKind.full_case_set  # a command task's objective is one fixed case set


class CommandRun(BaseModel):
    """One run of a command task's dev objective."""

    status: Literal["passed", "failed"]
    score: float | None = Field(description="value of score_key in the command's JSON")
    score_key: str
    unit: str = ""
    higher_is_better: bool
    reason: str = ""
    exit_code: int | None
    timed_out: bool = False
    meaningful: bool | None = Field(
        default=None, description="the objective's own `meaningful`; None when it does not say"
    )
    output: dict[str, Any] = Field(
        default_factory=dict, description="the command's JSON object (first 40 keys)"
    )
    stderr_tail: str = ""
    candidate: str
    mode: str = "dev"
    record_id: str | None = None
    best_score: float | None = None
    delta_vs_best_pct: float | None = Field(
        default=None, description="(score - best)/best*100 against the best before this run"
    )
    is_new_best: bool = False
    host: str = "local"
    wall_s: float = 0.0
    sandbox: str = Field(
        default="none", description="the sandbox the objective ran in, as it reported itself"
    )


def dev_values(
    obj: Objective, python: str, warmup: int | None, repeats: int | None, cases: list[str] | None
) -> dict[str, str]:
    """Placeholder values of a dev run. An argument the command has no placeholder for is an
    error that says so (it would be ignored silently otherwise)."""
    given = {"warmup": warmup, "repeats": repeats, "cases": ",".join(cases) if cases else None}
    for name, value in given.items():
        if value is not None and f"{{{name}}}" not in obj.command:
            raise UsageError(
                f"this command task's dev objective takes no {name} (its command "
                f"`{obj.command}` has no {{{name}}} placeholder).",
                next_step=f"call run_objective without {name}, or add {{{name}}} (with a "
                f"default) to [objectives.dev] in task.toml",
            )
    values = {"python": python}
    defaults = {"warmup": obj.warmup, "repeats": obj.repeats, "cases": obj.cases}
    for name, value in given.items():
        chosen = value if value is not None else defaults[name]
        if chosen is not None:
            values[name] = str(chosen)
    return values


async def run_command_objective(
    ws: Workspace,
    launcher: Launcher,
    *,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    save: bool = True,
    warmup: int | None = None,
    repeats: int | None = None,
    cases: list[str] | None = None,
) -> CommandRun:
    """The dev objective on the workspace as it is: feedback for the agent (its own files, its
    own text in the reason); the verdict is tools/integrity/command_verify.py's."""
    task = ws.task
    kind_of(task).require_objective(task, "run_command_objective", "run_objective")
    obj = task.objective_for("dev")
    candidate = ws.snapshot()
    slot = launcher.pick()
    executor = slot.executor
    timeout_s = timeout_s or obj.timeout_s or launcher.settings.eval_timeout_s
    python = launcher.python(slot)
    command = expand(obj.command, dev_values(obj, python, warmup, repeats, cases))
    await report(progress, 0, 1, f"running `{command}` on {executor.host}")
    started = time.perf_counter()
    async with launcher.hold(slot):
        if executor.on_this_machine:
            cwd = str(ws.root)
        else:
            local = launcher.settings.state_dir / "command_stage" / task.name
            if local.exists():
                shutil.rmtree(local)
            # symlinks=True: a link in the workspace travels as a link, never as the content of
            # the file it names on this machine.
            shutil.copytree(
                ws.root, local, ignore=shutil.ignore_patterns(STATE, "__pycache__"), symlinks=True
            )
            cwd = executor.path("command", task.name)
            await executor.sync_tree(local, cwd)
        await launcher.staging.publish(task, [executor])
        res, sandbox, _ = await run_sandboxed(
            launcher,
            slot,
            command,
            cwd=cwd,
            read=[],
            write=[cwd],
            timeout_s=timeout_s,
        )
    wall_s = time.perf_counter() - started
    parsed, why = parse_output(res.stdout, obj.score_key or "score")
    score = None
    if parsed is not None and not why:
        score, why = score_of(parsed, obj.score_key or "score")
    passed = (
        score is not None
        and res.exit_code == 0
        and not res.timed_out
        and not (parsed is not None and says_failed(parsed))
    )
    run = CommandRun(
        status="passed" if passed else "failed",
        score=score if passed else None,
        score_key=obj.score_key or "score",
        unit=obj.unit or "",
        higher_is_better=bool(obj.higher_is_better),
        reason="" if passed else dev_reason(res, parsed, why, timeout_s, python),
        exit_code=res.exit_code,
        timed_out=res.timed_out,
        meaningful=meaningful_of(parsed),
        output=capped_output(parsed),
        stderr_tail=res.stderr_tail(10)[-2000:],
        candidate=candidate.digest,
        host=executor.host,
        wall_s=wall_s,
        sandbox=sandbox,
    )
    await report(progress, 1, 1, f"{run.status}: {run.score_key}={run.score}")
    if save:
        record_command_run(ws, run, candidate)
    return run


def record_command_run(ws: Workspace, run: CommandRun, candidate: Candidate) -> CommandRun:
    """A command run's record (recording.record_run), with the task's direction of better."""
    entry = {
        "config": {},
        "score_key": run.score_key,
        "meaningful": run.meaningful,
        "reason": run.reason,
        "device": run.host,
        "output": run.output,
    }
    done = record_run(
        ws,
        candidate,
        entry,
        mode=run.mode,
        case_set=COMMAND_CASE_SET,
        status=run.status,
        score=run.score,
    )
    run.record_id, run.best_score = done.record_id, done.best_score
    run.delta_vs_best_pct, run.is_new_best = done.delta_vs_best_pct, done.is_new_best
    return run


__all__ = [
    "CommandRun",
    "dev_values",
    "parse_output",
    "record_command_run",
    "run_command_objective",
]
