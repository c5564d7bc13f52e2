"""The guarded final verification of a command task: its final objective, run the way a verdict
must be reached.

Side of the trust boundary: trusted. What differs from the dev objective (tools/command_task.py):
- the command is the task's final objective as bound in the trusted store, never the agent's;
- it runs in a fresh folder (under the state dir, 0700) made from the task's files kept at bind
  time (tools/state/task_files.py) plus the candidate's editable files: an edited verifier.py in the
  workspace changes nothing;
- hidden cases, drawn from the workspace's secret when task.toml has a [final] domain, reach it
  as a JSON file outside the workspace ($HARNESSLAB_FINAL_CASES, or {cases_file}), deleted after
  the run; they never appear in a result, a reason or a file the agent can read;
- it runs in the sandbox (tools/sandbox.py) with write access to that folder only, and refuses
  to run where no sandbox can be applied (HARNESSLAB_ALLOW_UNSANDBOXED=1 opts out);
- its JSON is read as data: the score, whether it says it failed, and which error fields it
  sets; reasons are written here (tools/command_run.verdict_reason), never copied from it;
- the ledger gets the aggregate score; the objective's full output goes to the store's
  hidden-results only.

What it certifies is what the task's own verifier checks: the verifier and the candidate share
one sandboxed interpreter, so unlike a kernel task's replay there is no process the candidate
cannot reach. `certifies` says so.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..evaluation import record_run
from ..evaluation.command_run import (
    error_fields,
    expand,
    meaningful_of,
    parse_output,
    run_sandboxed,
    says_failed,
    score_of,
    verdict_reason,
)
from ..execution import CommandResult, Launcher
from ..progress import Progress, report
from ..settings import Settings
from ..state import Candidate, Workspace, task_files
from ..state.secrets_store import case_set_id, ensure_outside_workspace, workspace_secret
from ..state.trusted_store import private_dir
from ..task import kind_of

FIXED_CASE_SET = "final-fixed"  # a final objective without a [final] domain: its own cases
CASES_ENV = "HARNESSLAB_FINAL_CASES"


class CommandVerdict(BaseModel):
    """The verdict of a command task's final objective on the workspace's candidate."""

    verdict: Literal["passed", "rejected", "error"]
    reasons: list[dict[str, str]] = Field(
        default_factory=list, description="[{code, detail}], text written by the harness"
    )
    warnings: list[dict[str, str]] = Field(default_factory=list)
    score: float | None = None
    score_key: str
    unit: str = ""
    higher_is_better: bool = False
    case_set: str = Field(description="public id of the hidden case set (changes on rotate)")
    hidden_cases: int = Field(description="hidden cases passed in (0: the objective's own set)")
    best_final_score: float | None = None
    is_new_best: bool = False
    meaningful: bool | None = Field(
        default=None, description="the objective's own `meaningful`; None when it does not say"
    )
    certifies: Literal["task_verifier", "nothing"] = Field(
        default="nothing",
        description="task_verifier: the task's own final objective (as bound, not the agent's "
        "copy) passed this candidate in the sandbox; it certifies what that verifier checks",
    )
    sandbox: str = "none"
    candidate: str
    record_id: str | None = None
    wall_s: float = 0.0
    evidence: dict[str, Any] = Field(default_factory=dict)

    def score_label(self) -> str:
        unit = f" ({self.unit})" if self.unit else ""
        return f"{self.score_key}{unit}, {'higher' if self.higher_is_better else 'lower'} is better"


def hidden_payload(ws: Workspace, seed: str, case_set: str) -> dict[str, Any]:
    """The hidden cases as the final objective reads them: name, dtype, sizes and an input seed
    per case, all drawn from the workspace's secret."""
    assert ws.task.final is not None
    cases = []
    for i, case in enumerate(ws.task.final.draw(seed)):
        case_seed = int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:4], "big")
        cases.append(
            {"name": f"final{i}", "dtype": case.dtype, **case.shape, "seed": case_seed % 2**31}
        )
    return {"case_set": case_set, "cases": cases}


async def command_verify(
    ws: Workspace,
    launcher: Launcher,
    settings: Settings,
    *,
    rotate: bool = False,
    progress: Progress | None = None,
    save: bool = True,
) -> CommandVerdict:
    """Run the task's final objective on the candidate; see the module docstring."""
    task = ws.task
    kind_of(task).require_objective(task, "command_verify", "guarded_verify")
    obj = task.objective_for("final")
    key = obj.score_key or "score"
    ensure_outside_workspace(settings, ws.root)
    payload: dict[str, Any] | None = None
    evidence: dict[str, Any] = {}
    if task.final is not None:
        secret = workspace_secret(settings, ws.root, rotate=rotate)
        case_set = case_set_id(secret["seed"])
        payload = hidden_payload(ws, secret["seed"], case_set)
        evidence["case_set_generation"] = secret["generation"]
    else:
        case_set = FIXED_CASE_SET
    warnings: list[dict[str, str]] = []
    if not task_files.has_snapshot(ws.store):
        task_files.snapshot(ws.store, task)
        warnings.append(
            {
                "code": "task_files_late",
                "detail": "this workspace was bound before task files were kept: they were "
                "copied now, from the task folder as it is",
            }
        )
    candidate = ws.snapshot()
    room_files = {**task_files.room_files(task_files.kept_files(ws.store)), **candidate.files}
    slot = launcher.pick()
    executor = slot.executor
    python = launcher.python(slot)
    timeout_s = obj.timeout_s or settings.eval_timeout_s
    run_id = uuid.uuid4().hex[:12]
    local = private_dir(private_dir(launcher.stage / "final") / run_id)
    task_files.write_tree(local / "room", room_files)
    if payload is not None:
        private_dir(local / "cases")
        (local / "cases" / "cases.json").write_text(json.dumps(payload))
    await report(progress, 0, 1, f"final objective on {executor.host}")
    started = time.perf_counter()
    remote_dir = ""
    try:
        async with launcher.hold(slot):
            if executor.on_this_machine:
                base = str(local)
            else:
                remote_dir = executor.path("final", run_id)
                await executor.sync_tree(local, remote_dir)
                base = remote_dir
            await launcher.staging.publish(task, [executor])
            room = f"{base}/room"
            cases_file = f"{base}/cases/cases.json" if payload is not None else ""
            values = {"python": python, "task_dir": room, "cases_file": cases_file}
            res, level, limit = await run_sandboxed(
                launcher,
                slot,
                expand(obj.command, values),
                cwd=room,
                read=[f"{base}/cases"] if payload is not None else [],
                write=[room],
                env={CASES_ENV: cases_file} if payload is not None else {},
                timeout_s=timeout_s,
                require=not settings.allow_unsandboxed,
            )
    finally:
        shutil.rmtree(local, ignore_errors=True)
        if remote_dir:
            try:
                await executor.run(["rm", "-rf", remote_dir], cwd=executor.path(), timeout_s=60)
            except Exception:  # noqa: BLE001 - cleanup is best effort; the folder is private
                pass
    wall_s = time.perf_counter() - started
    verdict, reasons, score, parsed = judge_run(
        res, key, level, limit, timeout_s=timeout_s, python=python,
        hidden=payload is not None, allow_unsandboxed=settings.allow_unsandboxed,
    )  # fmt: skip
    out = CommandVerdict(
        verdict=verdict,
        reasons=reasons,
        warnings=warnings,
        score=score,
        score_key=key,
        unit=obj.unit or "",
        higher_is_better=bool(obj.higher_is_better),
        case_set=case_set,
        hidden_cases=len((payload or {}).get("cases", [])),
        meaningful=meaningful_of(parsed),
        certifies="task_verifier" if verdict == "passed" else "nothing",
        sandbox=level,
        candidate=candidate.digest,
        wall_s=wall_s,
        evidence={
            **evidence,
            "candidate": candidate.digest,
            "host": executor.host,
            "exit_code": res.exit_code,
            "timed_out": res.timed_out,
            "sandbox": level,
            "objective": obj.command,
            "error_fields": [p for p, _ in error_fields(parsed)][:32],
        },
    )
    await report(progress, 1, 1, f"{verdict}: {key}={score}")
    if save:
        _record(ws, out, candidate, parsed, payload, res.stderr_tail(20))
    return out


Outcome = Literal["passed", "rejected", "error"]


def judge_run(res: CommandResult, key: str, level: str, limit: str, *, timeout_s: float,
              python: str, hidden: bool, allow_unsandboxed: bool,
              ) -> tuple[Outcome, list[dict[str, str]], float | None, dict[str, Any] | None]:  # fmt: skip
    """The verdict on one run of the final objective: (verdict, reasons, score, its JSON).
    Refused (error) where no sandbox applied unless allowed; rejected, with no score, when the
    run timed out, exited non-zero, gave no finite score or says it failed; a limit the
    sandbox counted comes first among the reasons."""
    parsed, why = parse_output(res.stdout, key)
    score = None
    if parsed is not None and not why:
        score, why = score_of(parsed, key)
    if level == "none" and not allow_unsandboxed:
        refused = {
            "code": "sandbox_unavailable",
            "detail": "no sandbox (Landlock) can be applied on the GPU host, so the final "
            "objective would run agent-written code unconfined: refused. Run on a Linux "
            "kernel with Landlock, or set HARNESSLAB_ALLOW_UNSANDBOXED=1 to verify anyway",
        }
        return "error", [refused], None, parsed
    failed = res.timed_out or res.exit_code != 0 or score is None
    failed = failed or (parsed is not None and says_failed(parsed))
    if not failed:
        return "passed", [], score, parsed
    reasons = verdict_reason(res, parsed, why, timeout_s, python, hidden=hidden)
    if limit:  # counted by the sandbox's trusted outer process
        reasons.insert(0, {"code": "resource_limit",
                           "detail": f"resource_limit: {limit} (a limit of the sandbox "
                           "ended the final objective)"})  # fmt: skip
    if not reasons:
        reasons = [{"code": "no_score", "detail": "the final objective gave no score"}]
    return "rejected", reasons, None, parsed


def _record(
    ws: Workspace,
    v: CommandVerdict,
    candidate: Candidate,
    output: dict[str, Any] | None,
    payload: dict[str, Any] | None,
    stderr_tail: str,
) -> None:
    """Ledger (aggregate only) + checkpoint + best pointer; the objective's output and the
    hidden cases go to the store's hidden-results file, which the agent never sees."""
    status = "passed" if v.verdict == "passed" else "failed"
    entry: dict[str, Any] = {
        "config": {},
        "score_key": v.score_key,
        "meaningful": v.meaningful,
        "reason": v.reasons[0]["detail"] if v.reasons else "",
        "device": v.evidence.get("host"),
        "sandbox": v.sandbox,
    }
    done = record_run(
        ws,
        candidate,
        entry,
        mode="final",
        case_set=v.case_set,
        status=status,
        score=v.score,
        hidden=(payload or {}).get("cases", []),
        store_only={"output": output, "stderr_tail": stderr_tail[-4000:]},
    )
    v.record_id, v.best_final_score, v.is_new_best = (
        done.record_id,
        done.best_score,
        done.is_new_best,
    )


__all__ = [
    "CASES_ENV",
    "FIXED_CASE_SET",
    "CommandVerdict",
    "command_verify",
    "hidden_payload",
    "judge_run",
]
