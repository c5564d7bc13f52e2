"""The iteration loop behind `harnesslab run`.

Per iteration: attempt (a fresh runner session with the task brief and the active servers) ->
independent scoring with the guarded verifier (always, also after a timeout or a crash: that
score drives the loop, never the agent's claim) -> best checkpoint -> reflect/build (the same
session resumed, with the meta-server) -> qualification -> register or quarantine (one repair
turn first). Stop on the stop score; at the end restore the best checkpoint and verify it on a
freshly drawn hidden case set.

State is written after every step (`runs/<id>/state.json`, atomic); `resume_run` continues after
a crash or Ctrl-C: a step that was in progress is recorded as interrupted and the loop moves on,
process groups the dead loop left behind are killed first. Every process the loop starts runs in
its own group and is killed with its children when the loop stops for any reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import anyio

from ..errors import HarnesslabError, UsageError
from ..execution import Launcher, build_launcher
from ..integrity import Verdict, guarded_step_verify, guarded_verify, public_verdict
from ..integrity.command_verify import command_verify
from ..meta.client_audit import audit_workspace, prune_command
from ..settings import Settings
from ..state import Checkpoints
from ..state.storage import atomic_write_json
from ..state.workspace import Workspace, init_workspace, is_workspace, open_workspace
from ..task import kind_of
from .prompts import attempt_prompt, brief_text, build_prompt, repair_prompt
from .runners import AgentRunner, Turn, TurnOutcome, build_runner
from .servers import (
    META_SERVER,
    Qualification,
    build_candidates,
    fresh_qualification,
    generated_snapshot,
    qualify,
    quarantine,
    register,
    turn_servers,
    write_mcp_config,
    write_skills_plugin,
)
from .state import (
    Best,
    Iteration,
    RunConfig,
    RunState,
    RunStore,
    Score,
    ServerOutcome,
    agent_never_ran,
    is_better,
    kill_leftovers,
    new_run_id,
    process_start,
    reached,
    summarize,
)

EventSink = Callable[[dict[str, Any]], None]
log = logging.getLogger(__name__)


def prepare_workspace(task: str, root: Path, settings: Settings) -> Workspace:
    """Open the workspace at `root` (its task must be `task` when one is given), or create it
    from `task` when it is new or empty."""
    root = root.expanduser()
    if is_workspace(root, settings):
        return open_workspace(root, settings, task=task or None)
    return init_workspace(task, root, settings)


def task_scoring(ws: Workspace, config: RunConfig) -> dict[str, Any]:
    """Direction, score key and unit of the loop's scores: the task's final objective's (a
    kernel task's are microseconds, lower is better). `--higher-is-better` may only agree."""
    task, kind = ws.task, kind_of(ws.task)
    higher = kind.higher_is_better(task)
    if config.higher_is_better and not higher:
        raise UsageError(
            f"--higher-is-better contradicts task {task.name}: its final objective's scores are "
            f"{kind.score_label(task)}.",
            next_step="drop --higher-is-better, or set higher_is_better = true in task.toml",
        )
    return kind.scoring(task)


async def _score_command(
    ws: Workspace, launcher: Launcher, settings: Settings, *, rotate: bool
) -> Score:
    """A command task's final objective, guarded (tools/integrity/command_verify.py)."""
    cv = await command_verify(ws, launcher, settings, rotate=rotate)
    return Score(
        verdict=cv.verdict,
        score_us=cv.score,
        candidate=cv.candidate,
        case_set=cv.case_set,
        meaningful=bool(cv.meaningful),
        certifies=cv.certifies,
        reasons=[r["detail"] for r in cv.reasons][:8],
    )


async def _score_kernel(
    ws: Workspace, launcher: Launcher, settings: Settings, *, rotate: bool
) -> Score:
    """A kernel task's guarded verify on hidden cases (tools/integrity/verify.py)."""
    return _score_verdict(await guarded_verify(ws, launcher, settings, rotate=rotate))


async def _score_step(
    ws: Workspace, launcher: Launcher, settings: Settings, *, rotate: bool
) -> Score:
    """A step task's guarded verify on hidden traces (tools/integrity/step_verify.py): the sum
    over the traces of the timed pass's p50 step latency."""
    return _score_verdict(await guarded_step_verify(ws, launcher, settings, rotate=rotate))


def _score_verdict(v: Verdict) -> Score:
    # The run's summary and prompts are the agent's to read: the public view only.
    shown = public_verdict(v)
    inc = shown.get("incumbent") or {}
    return Score(
        verdict=v.verdict,
        score_us=v.score_us if v.verdict == "passed" else None,
        candidate=str(v.evidence.get("candidate") or "") or None,
        case_set=v.case_set,
        meaningful=v.meaningful,
        certifies=v.certifies,
        reasons=[r.get("detail", "") for r in shown["reasons"]][:8],
        incumbent=inc.get("hash"),
        speedup_vs_incumbent=inc.get("speedup"),
        faster_than_incumbent=inc.get("faster"),
    )


# The loop's score per task kind (tools/task/kinds.py KINDS).
SCORE_BY_KIND = {"kernel": _score_kernel, "command": _score_command, "step": _score_step}


class Loop:
    """One run: a state, its folder, the workspace, a runner and a launcher for scoring."""

    def __init__(
        self,
        state: RunState,
        store: RunStore,
        ws: Workspace,
        settings: Settings,
        *,
        runner: AgentRunner | None = None,
        on_event: EventSink | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        self.state = state
        self.store = store
        self.ws = ws
        self.settings = settings
        cfg = state.config
        self.runner = runner or build_runner(
            cfg.runner, agent_cmd=cfg.agent_cmd, extra_args=cfg.agent_args, settings=settings
        )
        self.on_event = on_event
        # A launcher from the caller (compare's trials share one, each pinned to its GPU) is
        # the caller's to close; one built here is closed when the run ends.
        self.shared_launcher = launcher
        self.launcher: Launcher | None = None
        self.kind = kind_of(ws.task)
        self.higher = cfg.higher_is_better or self.kind.higher_is_better(ws.task)

    # -- bookkeeping ----------------------------------------------------------------------------
    def emit(self, kind: str, message: str = "", **data: Any) -> None:
        if self.on_event is not None:
            self.on_event({"kind": kind, "message": message, "time": time.time(), **data})

    def save(self) -> None:
        self.store.save(self.state)
        self.store.write_artifact(
            "summary.json", summarize(self.state, self.ws.telemetry_records())
        )

    def _started(self, pid: int) -> None:
        self.state.active.append({"pid": pid, "start": process_start(pid)})
        self.save()

    def _exited(self, pid: int) -> None:
        self.state.active = [p for p in self.state.active if p.get("pid") != pid]
        self.save()

    # -- scoring ----------------------------------------------------------------------------------
    async def score(self, *, rotate: bool = False, label: str = "") -> Score:
        """Guarded verification of the workspace as it stands, on one GPU slot (a free one;
        the score names it); never raises for a bad candidate."""
        assert self.launcher is not None
        slot = self.launcher.pick()
        launcher = self.launcher.pinned(slot)
        self.emit(
            "phase",
            f"{label}: guarded verify on {slot.label}" + (" (rotated cases)" if rotate else ""),
        )
        started = time.perf_counter()
        try:
            score_of = SCORE_BY_KIND[self.kind.name]
            out = await score_of(self.ws, launcher, self.settings, rotate=rotate)
        except HarnesslabError as exc:  # kernel.py deleted, bad config, executor down
            out = Score(verdict="error", error=str(exc)[:1000])
        except Exception as exc:  # boundary: whatever the workspace holds, scoring goes on
            log.exception("%s: scoring failed", label)
            out = Score(verdict="error", error=f"{type(exc).__name__}: {exc}"[:1000])
        out.wall_s = time.perf_counter() - started
        out.slot = slot.label
        self.emit("score", f"{label}: {out.verdict} {out.score_us}", score=out.model_dump())
        return out

    def update_best(self, score: Score, iteration: int) -> bool:
        if score.verdict != "passed" or score.score_us is None:
            return False
        best = self.state.best
        if best is not None and score.candidate == best.candidate:
            return False
        if (
            best is not None
            and score.incumbent == best.candidate
            and score.faster_than_incumbent is not None
        ):
            # The verifier timed this candidate and the best interleaved (ABBA) in one run: that
            # comparison survives load drift between runs, two separate scores do not.
            if not score.faster_than_incumbent:
                return False
        elif best is not None and score.case_set != best.case_set:
            return False  # scores on different case sets compare to nothing (cases rotated)
        elif best is not None and not is_better(score.score_us, best.score_us, self.higher):
            return False
        ckpt = Checkpoints(self.ws)
        digest = score.candidate
        if not digest or not ckpt.exists(digest):
            digest = ckpt.save()
        self.state.best = Best(
            score_us=score.score_us, candidate=digest, iteration=iteration, case_set=score.case_set
        )
        self.store.write("best.json", self.state.best.model_dump())
        return True

    # -- turns ------------------------------------------------------------------------------------
    def _turn(
        self, it: Iteration, phase: str, *, meta: bool, timeout_s: float
    ) -> tuple[Turn, dict[str, list[str]]]:
        """The turn's folder and MCP config; returns the turn and the servers' tool names."""
        folder = self.store.fresh_turn_dir(it.index, phase)
        servers = turn_servers(self.ws, self.settings, meta=meta)
        config = write_mcp_config(folder / "mcp.json", servers)
        self.report_foreign(folder)
        if phase == "attempt":
            it.active_servers = list(servers.entries)
        turn = Turn(
            phase=phase,  # type: ignore[arg-type]
            prompt="",
            dir=folder,
            workspace=self.ws.root,
            mcp_config=config,
            timeout_s=timeout_s,
            session_id=None if phase == "attempt" else it.session_id,
            env=self.settings.to_env(),
            output_cap_bytes=self.state.config.output_cap_bytes,
            plugin_dir=write_skills_plugin(self.store.dir / "skills-plugin", self.ws),
        )
        return turn, servers.tools

    def report_foreign(self, folder: Path) -> None:
        """What the workspace's client files hold that harnesslab did not write (servers,
        hooks, approvals, skills: written by the agent or planted by its code). The agent CLIs
        are started without them (claude: --strict-mcp-config --setting-sources user; codex:
        the workspace untrusted for the turn); they are reported here, and in the turn folder,
        with the command that removes them."""
        found = audit_workspace(self.ws.root, self.settings)
        if not found:
            return
        atomic_write_json(folder / "foreign.json", [f.model_dump() for f in found])
        fix = prune_command(self.ws.root)
        lines = "; ".join(f.line() for f in found[:3]) + ("; ..." if len(found) > 3 else "")
        self.emit(
            "warning",
            f"{len(found)} entries of the workspace's client files were not written by "
            f"harnesslab ({lines}); the agent CLI is started without them; remove them: {fix}",
            findings=[f.model_dump() for f in found],
            fix=fix,
        )

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        self.emit("phase", f"{turn.phase}: {self.runner.name} (limit {turn.timeout_s:.0f}s)")
        outcome = await self.runner.run(turn, on_start=self._started, on_exit=self._exited)
        atomic_write_json(turn.dir / "outcome.json", outcome.model_dump(mode="json"))
        self.emit("turn", f"{turn.phase}: {outcome.status}", outcome=outcome.model_dump())
        return outcome

    # -- steps ------------------------------------------------------------------------------------
    async def step_attempt(self, it: Iteration) -> None:
        cfg = self.state.config
        limit_s = cfg.attempt_limit_s(it.index)
        turn, tools = self._turn(it, "attempt", meta=False, timeout_s=limit_s)
        turn.prompt = attempt_prompt(
            self.ws,
            self.state,
            it,
            tools,
            result_file=str(turn.result_file),
            brief=cfg.task_text or brief_text(self.ws),
        )
        it.attempt = await self.run_turn(turn)
        it.session_id = it.attempt.session_id
        it.step = "score"

    async def step_score(self, it: Iteration) -> None:
        it.score = await self.score(label=f"iteration {it.index}")
        self.store.write(f"iter-{it.index:02d}/score.json", it.score.model_dump())
        it.new_best = self.update_best(it.score, it.index)
        cfg = self.state.config
        if it.score.verdict != "passed" and cfg.optimization_mode and self.state.best:
            # A broken workspace (deleted kernel.py, wrong results) is not where the next fresh
            # session should start: reset it to the best checkpoint (current files saved first).
            Checkpoints(self.ws).restore(self.state.best.candidate)
            it.reset_to_best = self.state.best.candidate
            self.emit("info", f"workspace reset to the best checkpoint {it.reset_to_best}")
        solved = reached(it.score.score_us, cfg.stop_score, self.higher)
        if cfg.build == "never":
            it.build_skipped = "build disabled (--build never)"
        elif solved and cfg.build != "always":
            it.build_skipped = "solved: stop score reached"
        it.step = "build" if not it.build_skipped else "done"

    async def step_build(self, it: Iteration) -> None:
        cfg = self.state.config
        before = generated_snapshot(self.ws)
        turn, tools = self._turn(it, "build", meta=True, timeout_s=cfg.build_timeout_s)
        turn.prompt = build_prompt(
            self.ws,
            self.state,
            it,
            tools,
            result_file=str(turn.result_file),
            meta_server=META_SERVER,
        )
        it.build = await self.run_turn(turn)
        it.session_id = it.build.session_id or it.session_id
        it.candidates = build_candidates(before, generated_snapshot(self.ws), it.build.result)
        it.step = "qualify"

    async def _qualify(self, it: Iteration, name: str, *, repaired: bool) -> Qualification:
        """Qualify in a clean room; a pass is registered at once (projected for the next
        session). A registration refused (files changed since) counts as a failure."""
        self.emit("phase", f"qualify {name}" + (" after repair" if repaired else ""))
        turn = it.repair if repaired else it.build
        since = turn.started_at if turn is not None and turn.started_at else time.time()
        try:
            q = fresh_qualification(self.ws, name, since)
            if q is None:
                q = await qualify(self.ws, name, self.settings)
            if q.passed:
                register(self.ws, name, self.settings)
        except HarnesslabError as exc:
            q = Qualification(name=name, passed=False, report=str(exc))
        it.qualification.append({**q.model_dump(), "after_repair": repaired})
        self.store.write(f"iter-{it.index:02d}/qualification.json", it.qualification)
        if q.passed:
            it.servers.append(
                ServerOutcome(name=name, status="registered", repaired=repaired, tools=q.tools)
            )
            self.emit("server", f"{name}: registered", name=name, status="registered")
        self.save()
        return q

    async def step_qualify(self, it: Iteration) -> None:
        cfg = self.state.config
        done = {s.name for s in it.servers}
        failed: dict[str, Qualification] = {}
        for name in it.candidates:
            if name not in done:
                q = await self._qualify(it, name, repaired=False)
                if not q.passed:
                    failed[name] = q
        if it.repair is not None and it.repairs == 0:  # a run from before repairs were counted
            it.repairs = 1
        while failed and it.repairs < cfg.repair_attempts:
            # A repair turn (--artifact-repair-attempts, default one): the same session gets
            # the failure reports.
            it.repairs += 1
            turn, _ = self._turn(it, "repair", meta=True, timeout_s=cfg.build_timeout_s)
            turn.prompt = repair_prompt(
                {n: q.report for n, q in failed.items()},
                result_file=str(turn.result_file),
                meta_server=META_SERVER,
                timeout_s=cfg.build_timeout_s,
            )
            it.repair = await self.run_turn(turn)
            it.session_id = it.repair.session_id or it.session_id
            self.save()
            for name in list(failed):
                q = await self._qualify(it, name, repaired=True)
                if q.passed:
                    del failed[name]
                else:
                    failed[name] = q
        for name, q in failed.items():
            status: Literal["quarantined", "failed"] = "quarantined"
            try:
                quarantine(self.ws, name, _first_line(q.report))
            except HarnesslabError as exc:
                status = "failed"
                q.report += f"\n(quarantine failed: {exc})"
            it.servers.append(
                ServerOutcome(
                    name=name, status=status, repaired=it.repair is not None, report=q.report[:4000]
                )
            )
            self.emit("server", f"{name}: {status}", name=name, status=status)
        it.step = "done"

    # -- driver ----------------------------------------------------------------------------------
    def recover(self, it: Iteration) -> None:
        """A step that was in progress when the loop died: record it, move on."""
        if it.running is None:
            return
        now = time.time()
        if it.running == "attempt":
            it.attempt = TurnOutcome(
                phase="attempt",
                status="interrupted",
                error="the loop stopped during the attempt",
                started_at=now,
                finished_at=now,
            )
            it.step = "score"
        elif it.running == "build":
            it.build = TurnOutcome(
                phase="build",
                status="interrupted",
                error="the loop stopped during the build",
                started_at=now,
                finished_at=now,
            )
            it.step = "qualify"
        it.running = None

    async def run(self) -> dict[str, Any]:
        state, cfg = self.state, self.state.config
        killed = kill_leftovers(state.active)
        if killed:
            self.emit("info", f"killed process groups left by the previous loop: {killed}")
        state.active = []
        await self.runner.ready()
        if state.status != "stopped":
            state.status = "running"
        state.error = ""
        self.save()
        steps = {
            "attempt": self.step_attempt,
            "score": self.step_score,
            "build": self.step_build,
            "qualify": self.step_qualify,
        }
        self.launcher = self.shared_launcher or build_launcher(self.settings)
        try:
            if state.baseline is None and cfg.score_baseline:
                state.baseline = await self.score(label="baseline")
                self.store.write("baseline.json", state.baseline.model_dump())
                self.update_best(state.baseline, 0)
                self.save()
            while not state.finished:
                it = self._current_iteration()
                if it is None:
                    break
                self.recover(it)
                while it.step != "done":
                    step = it.step
                    self.emit(
                        "step", f"iteration {it.index}: {step}", iteration=it.index, step=step
                    )
                    it.running = step
                    self.save()
                    try:
                        await steps[step](it)
                    except Exception as exc:  # boundary: one iteration never ends the run
                        self.fail_iteration(it, step, exc)
                    it.running = None
                    self.save()
                it.finished_at = time.time()
                self.save()
                if it.score and reached(it.score.score_us, cfg.stop_score, self.higher):
                    state.status = "stopped"
                    state.stop_reason = f"stop score {cfg.stop_score:g} reached"
                    break
            await self.finish()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                interrupted = isinstance(exc, KeyboardInterrupt | anyio.get_cancelled_exc_class())
                state.status = "interrupted" if interrupted else "failed"
                state.error = "" if interrupted else f"{type(exc).__name__}: {exc}"[:2000]
                self.save()
                await self._close_launcher()
            raise
        await self._close_launcher()
        return summarize(state, self.ws.telemetry_records())

    async def _close_launcher(self) -> None:
        if self.launcher is not None and self.launcher is not self.shared_launcher:
            await self.launcher.aclose()

    def fail_iteration(self, it: Iteration, step: str, exc: Exception) -> None:
        """An unexpected error in a step: the iteration is scored as an error and done; the
        loop goes on to the next one and, at the end, to its final restore and verify."""
        log.exception("iteration %s: %s failed", it.index, step)
        it.error = f"{step}: {type(exc).__name__}: {exc}"[:1000]
        if it.score is None:
            it.score = Score(verdict="error", error=it.error)
        it.step = "done"
        self.emit("info", f"iteration {it.index}: {it.error[:200]}")

    def _current_iteration(self) -> Iteration | None:
        state = self.state
        if state.iterations and state.iterations[-1].step != "done":
            return state.iterations[-1]
        if state.status == "stopped" or len(state.iterations) >= state.config.iterations:
            return None
        budget = state.config.budget_s
        if budget is not None and time.time() - state.created_at >= budget:
            state.status = "stopped"
            state.stop_reason = (
                f"budget of {budget:g} s spent after {len(state.iterations)} iterations"
            )
            return None
        it = Iteration(index=len(state.iterations) + 1)
        state.iterations.append(it)
        return it

    async def finish(self) -> None:
        state, cfg = self.state, self.state.config
        if state.best is not None and cfg.optimization_mode and cfg.restore_best:
            try:
                state.restored = Checkpoints(self.ws).restore(state.best.candidate)
                self.emit("info", f"restored the best checkpoint {state.best.candidate}")
            except Exception as exc:  # boundary: the final verify still runs
                log.exception("final restore failed")
                state.restored = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
        if cfg.final_verify:
            rotate = self.kind.draws_hidden_cases(self.ws.task)
            state.final = await self.score(rotate=rotate, label="final")
            self.store.write("final.json", state.final.model_dump())
        state.finished = True
        if state.status == "running":
            state.status = "completed"
            state.stop_reason = state.stop_reason or f"{len(state.iterations)} iterations done"
            failed = agent_never_ran(state)
            if failed:  # scores of an untouched workspace are no result: say so, exit non-zero
                state.status = "agent_failed"
                state.stop_reason = f"no attempt ran to completion: {failed}"[:1000]
        self.save()


async def start_run(
    config: RunConfig,
    settings: Settings,
    *,
    on_event: EventSink | None = None,
    runner: AgentRunner | None = None,
    run_id: str | None = None,
    launcher: Launcher | None = None,
) -> dict[str, Any]:
    """Start a new run; returns summary.json's content. `launcher`: score through this one
    (the caller closes it) instead of one built for the run."""
    runner = runner or build_runner(
        config.runner, agent_cmd=config.agent_cmd, extra_args=config.agent_args, settings=settings
    )
    await runner.ready()  # before a workspace or a run folder is created
    ws = prepare_workspace(config.task, config.workspace, settings)
    kind_of(ws.task).require_final_score(ws.task, "harnesslab run")  # before any run folder
    config = config.model_copy(update={"workspace": ws.root, **task_scoring(ws, config)})
    store = RunStore(ws, run_id or new_run_id())
    if store.state_path.is_file():
        raise UsageError(
            f"run {store.run_id!r} already exists in {ws.root}.",
            next_step=f"continue it with --resume {store.run_id}, or choose another --run-id",
        )
    state = RunState(run_id=store.run_id, config=config)
    store.write("config.json", config.model_dump(mode="json"))
    loop = Loop(state, store, ws, settings, runner=runner, on_event=on_event, launcher=launcher)
    loop.emit("run", f"run {store.run_id} in {store.dir}", run_id=store.run_id, dir=str(store.dir))
    return await loop.run()


async def resume_run(
    workspace: Path,
    run_id: str,
    settings: Settings,
    *,
    on_event: EventSink | None = None,
    runner: AgentRunner | None = None,
    config_update: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Continue a run after a crash or Ctrl-C (a finished run just returns its summary). The
    run's config comes from the trusted store; `config_update` (what the command line gave
    again: runner, agent command, executor settings) replaces its fields."""
    ws = open_workspace(workspace, settings)
    store = RunStore(ws, run_id)
    state = store.load()
    if config_update:
        state.config = state.config.model_copy(update=config_update)
    loop = Loop(state, store, ws, settings, runner=runner, on_event=on_event)
    if state.finished:
        return summarize(state, ws.telemetry_records())
    state.resumes += 1
    loop.emit(
        "run", f"resuming run {run_id} (resume {state.resumes})", run_id=run_id, dir=str(store.dir)
    )
    return await loop.run()


def _first_line(text: str) -> str:
    lines = [ln.strip("# ").strip() for ln in text.strip().splitlines() if ln.strip()]
    return " ".join(lines[:3])[:500]


__all__ = ["Loop", "RunConfig", "prepare_workspace", "resume_run", "start_run"]
