"""run_objective for command tasks: any folder with a task.md and an objective command that
prints JSON with a score key (e.g. `python3 verifier.py --json --mode final`, key `best_us`).

The command runs through the launcher's executor under a GPU lock (it may time the GPU), in the
workspace itself on the local executor, or in a synced copy of it (without `.harnesslab/`) on a
remote one. Its JSON is parsed, the score recorded in the ledger with the task's direction
(lower or higher is better), and the candidate checkpointed, so rank_history and
restore_best_checkpoint work on command tasks as on kernel tasks.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution.launcher import Launcher, sandbox_level
from ..state.workspace import STATE, Workspace
from ..task.kinds import CommandKind, kind_of
from .objective import Progress, record_run

MAX_OUTPUT_KEYS = 40
COMMAND_CASE_SET = CommandKind.full_case_set  # a command task's objective is one fixed case set


class CommandRun(BaseModel):
    """One run of a command task's objective."""

    status: Literal["passed", "failed"]
    score: float | None = Field(description="value of score_key in the command's JSON")
    score_key: str
    higher_is_better: bool
    reason: str = ""
    exit_code: int | None
    timed_out: bool = False
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


def parse_output(stdout: str, score_key: str) -> tuple[dict[str, Any] | None, str]:
    """The command's JSON object: the whole stdout, or else its last line that is a JSON
    object holding `score_key`. Returns (object or None, why not)."""
    text = stdout.strip()
    candidates = [text] + [ln.strip() for ln in reversed(text.splitlines())]
    for chunk in candidates:
        if not chunk.startswith("{"):
            continue
        try:
            obj = json.loads(chunk)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and score_key in obj:
            return obj, ""
    if not text:
        return None, "the objective command printed nothing on stdout"
    return None, f"no JSON object with key {score_key!r} on stdout (last line: {text[-200:]!r})"


def score_of(obj: dict[str, Any], key: str) -> tuple[float | None, str]:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"{key}={value!r} is not a number"
    if not math.isfinite(value):
        return None, f"{key}={value!r} is not finite"
    return float(value), ""


async def run_command_objective(
    ws: Workspace,
    launcher: Launcher,
    *,
    timeout_s: float | None = None,
    progress: Progress | None = None,
    save: bool = True,
) -> CommandRun:
    task = ws.task
    if kind_of(task).runs_kernel:
        raise UsageError(f"{task.name} is a kernel task.", next_step="use run_objective")
    files = ws.editable_files()
    digest = ws.candidate_hash(files)
    slot = launcher.pick()
    executor = slot.executor
    timeout_s = timeout_s or launcher.settings.eval_timeout_s
    await _report(progress, 0, 1, f"running `{task.objective}` on {executor.host}")
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
        launcher._stage_common(task)
        async with launcher._sync_locks[id(executor)]:
            await executor.sync_tree(launcher.stage, executor.path("stage"))
        argv = launcher.sandboxed_argv(
            slot, ["sh", "-c", task.objective], read=[], write=[cwd], cwd=cwd
        )
        res = await executor.run(argv, cwd=cwd, timeout_s=timeout_s)
        sandbox = "none"
        first, _, rest = res.stdout.partition("\n")
        if first.startswith('{"event": "sandbox"'):  # the sandbox's own report comes first
            res = res.model_copy(update={"stdout": rest})
            try:
                sandbox = sandbox_level(json.loads(first))
            except json.JSONDecodeError:
                pass
    wall_s = time.perf_counter() - started
    obj, why = parse_output(res.stdout, task.score_key)
    score = None
    if obj is not None:
        score, why = score_of(obj, task.score_key)
    if res.timed_out:
        why = f"the objective command timed out after {timeout_s:.0f}s and was killed"
    elif res.exit_code != 0:
        tail = res.stderr_tail(3).replace("\n", " | ")
        why = f"the objective command exited with {res.exit_code}: {tail[-300:]}"
    run = CommandRun(
        status="passed" if score is not None and res.exit_code == 0 else "failed",
        score=score if res.exit_code == 0 else None,
        score_key=task.score_key,
        higher_is_better=task.higher_is_better,
        reason=why,
        exit_code=res.exit_code,
        timed_out=res.timed_out,
        output=dict(list((obj or {}).items())[:MAX_OUTPUT_KEYS]),
        stderr_tail=res.stderr_tail(10)[-2000:],
        candidate=digest,
        host=executor.host,
        wall_s=wall_s,
        sandbox=sandbox,
    )
    await _report(progress, 1, 1, f"{run.status}: {task.score_key}={run.score}")
    if save:
        record_command_run(ws, run, files)
    return run


def record_command_run(ws: Workspace, run: CommandRun, files: dict[str, bytes]) -> CommandRun:
    """A command run's record (objective.record_run), with the task's direction of better."""
    entry = {
        "config": {},
        "score_key": run.score_key,
        "meaningful": True,
        "reason": run.reason,
        "device": run.host,
        "output": run.output,
    }
    done = record_run(
        ws,
        files,
        entry,
        mode=run.mode,
        case_set=COMMAND_CASE_SET,
        status=run.status,
        score=run.score,
    )
    run.record_id, run.best_score = done.record_id, done.best_score
    run.delta_vs_best_pct, run.is_new_best = done.delta_vs_best_pct, done.is_new_best
    return run


async def _report(progress: Progress | None, done: float, total: float, message: str) -> None:
    if progress is not None:
        maybe = progress(done, total, message)
        if maybe is not None:
            await maybe


__all__ = ["CommandRun", "parse_output", "record_command_run", "run_command_objective"]
