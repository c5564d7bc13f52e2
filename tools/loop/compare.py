"""`harnesslab compare`: does a harness help? An A/B of two configurations of the loop (plain vs
harnessed: the generated servers of a finished run; or any two runner setups) over N trials each.

Every trial starts from a fresh workspace made from the task template, gets its arm's runner and
servers, runs attempt-only iterations (no build), and is scored by the loop's guarded path
(kernel tasks: the guarded verify; command tasks: the final objective) on ONE hidden case set
shared by every trial, so scores compare across trials. A trial without a verified passing score
is invalid and counted apart, never dropped; with `require_harness_tool_use`, so is a trial of an
arm with generated servers whose agent never called one (telemetry). The report (report.json,
report.md, scores.png) holds every trial, per-arm medians and spread, and a bootstrap confidence
interval for the difference of the medians (B - A), with the direction of better.

Side of the trust boundary: trusted. A harnessed arm's servers come from the source workspace's
trusted store (the bundle its qualification passed, re-hashed), never from workspace files.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, Field

from ..errors import UsageError
from ..execution import Launcher, build_launcher
from ..meta import registry
from ..meta.qualification import bundle_roots
from ..settings import Settings
from ..state import Workspace, init_workspace, open_workspace
from ..state import workspace_files as wf
from ..state.secrets_store import adopt_secret, workspace_secret
from ..state.storage import append_jsonl, read_jsonl
from ..state.trusted_store import TrustedStore, private_dir
from ..task import kind_of, load_task
from .compare_report import ArmSummary, CompareReport, Trial, markdown, plot
from .driver import start_run
from .runners import RunnerName
from .servers import META_SERVER, TASK_SERVER
from .state import RunConfig, RunStore

EventSink = Callable[[dict[str, Any]], None]
CONFIG_FILE = "compare.json"  # the compare's settings, for --resume
TRIALS_FILE = "trials.jsonl"  # one line per finished trial, written as it finishes
BOOTSTRAP_RESAMPLES = 4000
MIN_TRIALS_FOR_CI = 3


class Arm(BaseModel):
    """One side of the comparison."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    runner: RunnerName = "autopilot"
    agent_cmd: str = ""
    agent_args: list[str] = Field(default_factory=list)
    servers_from: Path | None = Field(
        default=None,
        description="a workspace whose registered generated servers (and skills) this arm's "
        "trials get: the harness of a finished run",
    )


class CompareConfig(BaseModel):
    task: str = Field(description="task name or task folder (the template of every trial)")
    out: Path = Field(description="folder for the trial workspaces and the report")
    arms: list[Arm] = Field(min_length=2, max_length=2)
    trials: int = Field(default=3, ge=1, le=100)
    iterations: int = Field(default=1, ge=1, le=20)
    attempt_timeout_s: float = Field(default=300.0, gt=0)
    attempt_timeouts_s: list[float] = Field(default_factory=list)
    require_harness_tool_use: bool = False
    seed: int = Field(default=0, description="bootstrap resampling seed (the report is stable)")
    parallel: int = Field(
        default=0,
        ge=0,
        description="trials run at once, each on its own GPU slot of the executor (0: one per "
        "slot; 1: one after another)",
    )


# -- trials -----------------------------------------------------------------------------------


def registered_servers(ws: Workspace) -> list[str]:
    return [r.name for r in registry.list_servers(ws) if r.status == "registered"]


def adopt_servers(source: Workspace, dest: Workspace, settings: Settings) -> list[str]:
    """Give `dest` the registered generated servers of `source` (same task): each qualified
    bundle from source's trusted store, re-hashed, goes into dest's workspace and trusted store
    with its qualification report, then is registered there (projected like any other)."""
    if source.task.name != dest.task.name:
        raise UsageError(
            f"{source.root} holds servers for task {source.task.name}, not {dest.task.name}.",
            next_step="name a workspace of the same task with --harness-from",
        )
    adopted = []
    for name in registered_servers(source):
        report = registry.trusted_report(source, name)
        if report is None or not report.passed:
            continue
        kept = registry.qualified_bundle(source, name, report.bundle_hash)
        for rel in bundle_roots(name):
            for path, data in wf.walk_files(kept, rel):
                wf.write_bytes(dest.root, path, data)
        staging = private_dir(dest.store.root / "adopting") / name
        if staging.exists():
            shutil.rmtree(staging)
        shutil.copytree(kept, staging)
        registry.record_qualification(dest, report, snapshot=staging)
        registry.register(dest, name, env=settings.to_env())
        adopted.append(name)
    return adopted


def said(flags: Iterable[bool | None]) -> bool | None:
    """Meaningful when any says so, not when one says not, unknown when none says."""
    seen = [f for f in flags if f is not None]
    return any(seen) if seen else None


def _harness_calls(calls: dict[str, int]) -> int:
    return sum(
        n for key, n in calls.items() if key.split(".", 1)[0] not in (TASK_SERVER, META_SERVER)
    )


def trial_root(config: CompareConfig, arm: Arm, index: int) -> Path:
    return config.out / "trials" / f"{arm.name}-{index + 1}"


def discard_trial(root: Path, settings: Settings) -> None:
    """Remove a trial's workspace and its trusted store: a trial run again at the same path
    must not inherit the old one's ledger, best pointer or servers."""
    if root.exists():
        shutil.rmtree(TrustedStore.location(settings, root.resolve()), ignore_errors=True)
        shutil.rmtree(root)


async def run_trial(
    config: CompareConfig,
    arm: Arm,
    index: int,
    secret: dict[str, Any],
    settings: Settings,
    *,
    launcher: Launcher | None = None,
) -> Trial:
    """One trial's loop. With `launcher` (a view pinned to one GPU slot: `Launcher.pinned`),
    its scores run on that slot and its agent's servers are given that GPU alone."""
    root = trial_root(config, arm, index)
    if root.exists():
        raise UsageError(
            f"{root} exists.", next_step="pass --resume to finish the compare, or --force"
        )
    ws = init_workspace(config.task, root, settings)
    adopt_secret(settings, ws.root, secret)  # every trial on the same hidden case set
    servers: list[str] = []
    if arm.servers_from is not None:
        servers = adopt_servers(open_workspace(arm.servers_from, settings), ws, settings)
    started = time.perf_counter()
    trial = Trial(arm=arm.name, index=index + 1, workspace=str(ws.root))
    if launcher is not None and len(launcher.slots) == 1:
        slot = launcher.slots[0]
        trial.slot = slot.label
        settings = settings.model_copy(update={"gpus": str(slot.gpu_index)})
    run = RunConfig(
        task=config.task,
        workspace=ws.root,
        iterations=config.iterations,
        runner=arm.runner,
        agent_cmd=arm.agent_cmd,
        agent_args=arm.agent_args,
        attempt_timeout_s=config.attempt_timeout_s,
        attempt_timeouts_s=config.attempt_timeouts_s,
        build="never",
        score_baseline=False,
        final_verify=False,
        restore_best=False,
    )
    summary = await start_run(run, settings, launcher=launcher)
    trial.run_id = summary["run_id"]
    trial.wall_s = round(time.perf_counter() - started, 1)
    trial.tool_calls = dict(summary.get("tool_calls") or {})
    trial.harness_calls = _harness_calls(trial.tool_calls)
    trial.attempts = [str((it.get("attempt") or {}).get("status")) for it in summary["iterations"]]
    scores = [it.get("score") or {} for it in summary["iterations"]]
    trial.verdict = str((scores[-1] if scores else {}).get("verdict", ""))
    trial.meaningful = said(sc.get("meaningful") for sc in scores)
    trial.certifies = str((scores[-1] if scores else {}).get("certifies") or "")
    trial.slot = str((scores[-1] if scores else {}).get("slot") or trial.slot)
    best = summary.get("best")
    trial.score = best["score_us"] if best else None
    if summary.get("status") == "agent_failed":
        trial.invalid_reason = f"the agent never worked: {summary.get('stop_reason', '')}"[:500]
    elif trial.score is None:
        why = "; ".join((scores[-1] if scores else {}).get("reasons") or [])
        trial.invalid_reason = (
            f"no passing verified score ({trial.verdict}{': ' + why if why else ''})"[:500]
        )
    elif config.require_harness_tool_use and servers and trial.harness_calls == 0:
        trial.invalid_reason = "--require-harness-tool-use: no generated tool was called"
    trial.valid = not trial.invalid_reason
    return trial


# -- statistics -------------------------------------------------------------------------------


def quantile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default)."""
    xs = sorted(xs)
    if not xs:
        return None
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bootstrap_difference(
    a: list[float], b: list[float], *, seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float] | None:
    """95% percentile interval of median(B*) - median(A*) over resamples of each arm's valid
    scores with replacement; None when an arm has no valid trial."""
    if not a or not b:
        return None
    rng = random.Random(seed)
    diffs = sorted(
        statistics.median(rng.choices(b, k=len(b))) - statistics.median(rng.choices(a, k=len(a)))
        for _ in range(resamples)
    )
    return quantile(diffs, 0.025) or 0.0, quantile(diffs, 0.975) or 0.0


def summarize_arm(arm: Arm, trials: list[Trial], servers: list[str], higher: bool) -> ArmSummary:
    valid = [t.score for t in trials if t.valid and t.score is not None]
    calls = [float(sum(t.tool_calls.values())) for t in trials]
    harness = [float(t.harness_calls) for t in trials]
    return ArmSummary(
        arm=arm.name,
        runner=arm.runner,
        harnessed=bool(servers),
        servers=servers,
        trials=len(trials),
        valid=len(valid),
        invalid=len(trials) - len(valid),
        median=statistics.median(valid) if valid else None,
        p10=quantile(valid, 0.1),
        p90=quantile(valid, 0.9),
        best=(max(valid) if higher else min(valid)) if valid else None,
        worst=(min(valid) if higher else max(valid)) if valid else None,
        tool_calls_median=statistics.median(calls) if calls else None,
        harness_calls_median=statistics.median(harness) if harness else None,
    )


def difference(a: ArmSummary, b: ArmSummary, trials: list[Trial], higher: bool, seed: int) -> dict:
    sa = [t.score for t in trials if t.arm == a.arm and t.valid and t.score is not None]
    sb = [t.score for t in trials if t.arm == b.arm and t.valid and t.score is not None]
    out: dict[str, Any] = {"of": f"median({b.arm}) - median({a.arm})", "value": None}
    if a.median is None or b.median is None:
        out["verdict"] = "no comparison: an arm has no valid trial"
        return out
    diff = b.median - a.median
    ci = bootstrap_difference(sa, sb, seed=seed)
    gain = diff if higher else -diff
    out.update(
        value=diff,
        ci95=list(ci) if ci else None,
        pct_of_a=100.0 * diff / a.median if a.median else None,
        better=b.arm if gain > 0 else a.arm if gain < 0 else "neither",
    )
    if min(len(sa), len(sb)) < MIN_TRIALS_FOR_CI:
        out["verdict"] = (
            f"too few valid trials for an interval to mean much (fewer than "
            f"{MIN_TRIALS_FOR_CI} in an arm): raise --trials"
        )
    elif ci is not None:
        excludes_zero = ci[0] > 0 or ci[1] < 0
        out["verdict"] = (
            f"{out['better']} is better (the 95% interval excludes 0)"
            if excludes_zero and gain != 0
            else "no clear difference (the 95% interval includes 0)"
        )
    return out


# -- the run ----------------------------------------------------------------------------------


def finished_trials(out: Path) -> list[Trial]:
    """The trials an earlier run of this compare finished (trials.jsonl, one per line)."""
    return [Trial.model_validate(rec) for rec in read_jsonl(out / TRIALS_FILE)]


def prepare_out(config: CompareConfig, settings: Settings, *, resume: bool, force: bool) -> None:
    """An empty --out, or one this compare may reuse: --resume keeps the finished trials of the
    same compare (its config must match), --force starts over (trials, report and the hidden
    case set)."""
    out = config.out
    if not out.exists() or not any(out.iterdir()):
        return
    if force:
        for trial in (out / "trials").glob("*") if (out / "trials").is_dir() else []:
            discard_trial(trial, settings)
        for item in out.iterdir():
            if item.is_dir():
                shutil.rmtree(item)
            else:
                item.unlink()
        return
    done = finished_trials(out)
    started = out / CONFIG_FILE
    if not resume:
        what = (
            f"holds a compare with {len(done)} of {2 * config.trials} trials finished"
            if started.is_file()
            else "is not empty"
        )
        raise UsageError(
            f"{out} {what}.",
            next_step="pass --resume to finish that compare (its finished trials are kept), "
            "--force to start over in it, or a new --out folder",
        )
    if not started.is_file():
        raise UsageError(
            f"{out} holds no compare to resume (no {CONFIG_FILE}).",
            next_step="pass --force to start over in it, or a new --out folder",
        )
    before = json.loads(started.read_text())
    now = config.model_dump(mode="json")
    changed = sorted(  # trials, out and parallel change how, not what, a compare measures
        k
        for k in {*before, *now}
        if k not in ("trials", "out", "parallel") and before.get(k) != now.get(k)
    )
    if changed:
        raise UsageError(
            f"--resume: {out} was started with other settings ({', '.join(changed)}).",
            next_step="repeat the first command's settings with --resume, or pass --force",
        )


async def compare(
    config: CompareConfig,
    settings: Settings,
    *,
    on_event: EventSink | None = None,
    resume: bool = False,
    force: bool = False,
) -> CompareReport:
    """Run every trial (A and B alternating, so drift hits both; on several GPU slots at once,
    one trial per slot: `_run_trials`) and write the report. Each finished trial is appended to
    trials.jsonl at once: `resume` runs only the others (a trial that was cut short starts
    again from scratch); `force` starts over in a used --out."""
    prepare_out(config, settings, resume=resume, force=force)
    names = [a.name for a in config.arms]
    if len(set(names)) != 2:
        raise UsageError(f"the two arms need two names (got {names}).")
    task = load_task(config.task)
    for arm in config.arms:
        if arm.servers_from is not None:
            src = open_workspace(arm.servers_from, settings)
            if not registered_servers(src):
                raise UsageError(
                    f"{arm.servers_from} has no registered generated server for arm {arm.name}.",
                    next_step="run `harnesslab run` with a build turn there first (or name "
                    "another workspace with --harness-from)",
                )
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / CONFIG_FILE).write_text(config.model_dump_json(indent=1))
    # One hidden case set for every trial: a secret of the compare's own, adopted by each (a
    # resumed compare keeps it; --force draws a new one).
    anchor = config.out / ".secret-anchor"
    anchor.mkdir(exist_ok=True)
    secret = workspace_secret(settings, anchor, rotate=force)
    started = time.perf_counter()
    done = {(t.arm, t.index): t for t in finished_trials(config.out)} if resume else {}
    order = [(i, j, arm) for i in range(config.trials) for j, arm in enumerate(config.arms)]
    trials = [done[(arm.name, i + 1)] for i, _, arm in order if (arm.name, i + 1) in done]
    for kept in trials:
        if on_event:
            on_event({"kind": "trial_done", "message": f"{_trial_line(kept)} (kept)"})
    todo = [(i, j, arm) for i, j, arm in order if (arm.name, i + 1) not in done]
    launcher = build_launcher(settings)
    try:
        trials += await _run_trials(config, todo, secret, settings, launcher, on_event)
    finally:
        await launcher.aclose()
    trials.sort(key=lambda t: (t.index, names.index(t.arm)))
    higher = kind_of(task).higher_is_better(task)
    adopted: dict[str, list[str]] = {}
    for t in trials:
        if t.index == 1:
            adopted[t.arm] = registered_servers(open_workspace(Path(t.workspace), settings))
    arms = [
        summarize_arm(
            arm, [t for t in trials if t.arm == arm.name], adopted.get(arm.name, []), higher
        )
        for arm in config.arms
    ]
    scoring = kind_of(task).scoring(task)
    report = CompareReport(
        task=task.name,
        case_set=_case_set(trials, settings),
        score_key=scoring["score_key"],
        unit=scoring["unit"],
        higher_is_better=higher,
        meaningful=said(t.meaningful for t in trials if t.valid),
        config=config.model_dump(mode="json"),
        arms=arms,
        difference=difference(arms[0], arms[1], trials, higher, config.seed),
        trials=trials,
        wall_s=round(time.perf_counter() - started, 1),
    )
    write_report(report, config.out)
    return report


async def _run_trials(
    config: CompareConfig,
    todo: list[tuple[int, int, Arm]],
    secret: dict[str, Any],
    settings: Settings,
    launcher: Launcher,
    on_event: EventSink | None,
) -> list[Trial]:
    """Run `todo` ((trial index, arm index, arm), A and B alternating) on the launcher's GPU
    slots at once, one trial per slot: trial i of arm j goes to slot (i + j) mod width, so with
    two slots each arm's trials alternate between the GPUs instead of one arm owning one GPU.
    Each finished trial is appended to trials.jsonl at once. The first failure stops the others
    (what they finished is kept) and is raised as itself."""
    width = min(config.parallel or len(launcher.slots), len(launcher.slots), max(1, len(todo)))
    slots = launcher.slots[:width]
    queues: list[list[tuple[int, int, Arm]]] = [[] for _ in slots]
    for i, j, arm in todo:
        queues[(i + j) % width].append((i, j, arm))
    out: list[Trial] = []
    failed: list[BaseException] = []

    async def work(slot_index: int, scope: anyio.CancelScope) -> None:
        view = launcher.pinned(slots[slot_index]) if width > 1 else launcher
        for i, _, arm in queues[slot_index]:
            discard_trial(trial_root(config, arm, i), settings)  # cut short before: again
            if on_event:
                where = f" on {slots[slot_index].label}" if width > 1 else ""
                on_event({"kind": "trial", "message": f"{arm.name} trial {i + 1}/"
                          f"{config.trials}{where}"})  # fmt: skip
            try:
                trial = await run_trial(config, arm, i, secret, settings, launcher=view)
            except Exception as exc:  # the first failure ends the compare, raised as itself
                failed.append(exc)
                scope.cancel()
                return
            append_jsonl(config.out / TRIALS_FILE, trial.model_dump(mode="json"))
            out.append(trial)
            if on_event:
                on_event({"kind": "trial_done", "message": _trial_line(trial), "trial": trial})

    async with anyio.create_task_group() as tg:
        for k in range(width):
            tg.start_soon(work, k, tg.cancel_scope)
    if failed:
        raise failed[0]
    return out


def _case_set(trials: list[Trial], settings: Settings) -> str:
    for t in trials:
        try:
            ws = open_workspace(Path(t.workspace), settings)
            state = RunStore(ws, t.run_id).load()
        except UsageError:
            continue
        for it in state.iterations:
            if it.score is not None and it.score.case_set:
                return it.score.case_set
    return ""


def _trial_line(t: Trial) -> str:
    score = "-" if t.score is None else f"{t.score:.6g}"
    if t.score is not None and t.meaningful is False:
        score += " (timings not meaningful)"
    where = f" ({t.slot})" if t.slot else ""
    return f"{t.arm} {t.index}{where}: {'valid' if t.valid else 'INVALID'} score {score}" + (
        f" ({t.invalid_reason})" if t.invalid_reason else ""
    )


def write_report(report: CompareReport, out: Path) -> None:
    """report.json, report.md and scores.png (when matplotlib is there) in `out`."""
    report.files = {"json": str(out / "report.json"), "markdown": str(out / "report.md")}
    png = plot(report, out / "scores.png")
    if png is not None:
        report.files["plot"] = str(png)
    (out / "report.md").write_text(markdown(report))
    (out / "report.json").write_text(report.model_dump_json(indent=1))


__all__ = [
    "Arm",
    "ArmSummary",
    "CompareConfig",
    "CompareReport",
    "Trial",
    "adopt_servers",
    "bootstrap_difference",
    "compare",
    "finished_trials",
    "quantile",
    "run_trial",
]
