"""`harnesslab run` (the iteration loop) and `harnesslab demo` (a 2-iteration autopilot run on
rmsnorm_gate in a temporary workspace). Progress goes to stderr (rich); the final table to
stdout, or summary.json with --json."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console
from rich.markup import escape

from harnesslab.tools.errors import UsageError
from harnesslab.tools.loop import resume_run, start_run
from harnesslab.tools.loop.state import RunConfig, RunStore
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.workspace import is_workspace, open_workspace
from harnesslab.tools.task import list_tasks

from .cli_support import add_executor_args, command, run_async, temp_workspace_dir
from .report import TIME_UNITS, FitTable, fit_table, versus
from .report import console as stdout_console

AGENT_FAILED_EXIT = 3  # the run finished, but no agent attempt ran to completion
GPU_FIELDS = ("gpu_host", "ssh_key", "known_hosts", "gpus", "interpret", "accept_new_host_key")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def durations_s(text: str) -> list[float]:
    """'5m,8m' -> [300.0, 480.0]."""
    return [duration_s(part) for part in text.split(",") if part.strip()] or [duration_s(text)]


def agent_conveniences(args: argparse.Namespace, settings: Settings) -> tuple[list[str], Settings]:
    """The HarnessGym-style runner flags as what they stand for: extra agent arguments and the
    programs to run. Each belongs to one runner; given with another it is an error."""
    runner = args.runner or "autopilot"
    extra: list[str] = []
    claude_only = {
        "--claude-model": getattr(args, "claude_model", None),
        "--claude-max-budget-usd": getattr(args, "claude_max_budget_usd", None),
        "--claude-bin": getattr(args, "claude_bin", None),
    }
    for flag, value in {**claude_only, "--codex-bin": getattr(args, "codex_bin", None)}.items():
        wanted = "codex" if flag == "--codex-bin" else "claude"
        if value is not None and runner != wanted:
            raise UsageError(
                f"{flag} is for --runner {wanted} (this run uses --runner {runner}).",
                next_step=f"drop {flag}, or pass --runner {wanted}",
            )
    if claude_only["--claude-model"]:
        extra += ["--model", str(claude_only["--claude-model"])]
    budget = claude_only["--claude-max-budget-usd"]
    if budget is not None:
        if budget <= 0:
            raise UsageError("--claude-max-budget-usd must be positive.")
        extra += ["--max-budget-usd", f"{budget:g}"]
    updates: dict[str, Any] = {}
    if claude_only["--claude-bin"]:
        updates["claude_command"] = str(claude_only["--claude-bin"])
    if getattr(args, "codex_bin", None):
        updates["codex_command"] = str(args.codex_bin)
    return extra, settings.model_copy(update=updates) if updates else settings


def duration_s(text: str) -> float:
    """'90', '90s', '5m', '1.5h' -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 90s, 5m, 1h)")
    value = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError("a duration must be positive")
    return value


class Progress:
    """Live progress on stderr: one line per event, a spinner for the step in progress."""

    def __init__(self, enabled: bool) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.t0 = time.time()
        self.run_id = ""
        self.run_dir = ""
        live = enabled and self.console.is_terminal
        self.status = self.console.status("starting") if live else None

    def __enter__(self) -> Progress:
        if self.status is not None:
            self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.stop()

    def __call__(self, ev: dict[str, Any]) -> None:
        if ev["kind"] == "run":
            self.run_id, self.run_dir = ev.get("run_id", ""), ev.get("dir", "")
        if not self.enabled:
            return
        stamp = f"[dim]{ev['time'] - self.t0:6.1f}s[/dim]"
        kind, msg = ev["kind"], ev["message"]
        if kind in ("phase", "step") and self.status is not None:
            self.status.update(msg)
        if kind == "score":
            sc = ev.get("score") or {}
            color = "green" if sc.get("verdict") == "passed" else "red"
            value = f"{sc['score_us']:.1f}" if sc.get("score_us") is not None else "-"
            why = f" {escape(sc.get('error') or '; '.join(sc.get('reasons') or []))}"
            msg = f"{msg.split(':')[0]}: [{color}]{sc.get('verdict')}[/{color}] {value}{why if sc.get('verdict') != 'passed' else ''}"
        elif kind == "turn":
            out = ev.get("outcome") or {}
            msg += f" in {out.get('duration_s', 0):.1f}s" + (
                f" - {escape(out['error'])}" if out.get("error") else ""
            )
        if kind != "phase":
            self.console.print(f"{stamp} {msg}", highlight=False)


def _score(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _unit(summary: dict[str, Any]) -> str:
    """'score us' for a kernel task, 'best_cycles (cycles)' for a command task."""
    key, unit = summary.get("score_key") or "score_us", summary.get("unit", "us")
    if key == "score_us":
        return "score us"
    return f"{key} ({unit})" if unit else key


def _vs(value: float | None, base: float | None, summary: dict[str, Any], than: str = "") -> str:
    """'1.40x faster' (than `than`); '' where timings mean nothing (the interpreter)."""
    if not summary.get("meaningful"):
        return ""
    timing = _unit(summary) == "score us" or summary.get("unit") in TIME_UNITS
    higher = bool(summary.get("higher_is_better"))
    return versus(value, base, ref_name=than, higher_is_better=higher, timing=timing)


def _speedup(sc: dict[str, Any], meaningful: bool) -> str:
    """The guarded verify's A B B A comparison with the best so far (incumbent time over this
    candidate's: > 1 is faster), in the same words; '' on the interpreter."""
    x = sc.get("speedup_vs_incumbent")
    if not meaningful or not x:
        return ""
    return versus(1.0, x, ref_name="")


def _build(build: dict[str, Any], servers: list[dict[str, Any]]) -> str:
    what = build.get("skipped") or build.get("status", "-")
    built = ", ".join(f"{s['name']} {s['status']}" for s in servers)
    return f"{what}: {built}" if built else what


def iterations_table(summary: dict[str, Any]) -> FitTable:
    base = (summary.get("baseline") or {}).get("score_us")
    meaningful = bool(summary.get("meaningful"))
    note = "" if meaningful else " (Triton CPU interpreter: timings not meaningful)"
    unit = _unit(summary)
    columns = ["iter", "attempt", f"verified {unit}", "vs baseline", "vs best (ABBA)"]
    columns += ["new best", "build: servers"]
    rows = [["base", "-", _score(base), "", "", "", ""]]
    for it in summary["iterations"]:
        sc = it.get("score") or {}
        att = it.get("attempt") or {}
        value = sc.get("score_us")
        build = it.get("build") or {}
        rows.append(
            [
                str(it["iteration"]),
                f"{att.get('status', '-')} {att.get('duration_s', 0):.0f}s",
                _score(value) if value is not None else sc.get("verdict", "-"),
                _vs(value, base, summary),
                _speedup(sc, meaningful),
                "yes" if it.get("new_best") else "",
                _build(build, it.get("servers", [])),
            ]
        )
    title = f"run {summary['run_id']}: {summary['status']} - {summary['stop_reason']}{note}"
    return fit_table(title, columns, rows)


def result_table(summary: dict[str, Any]) -> FitTable:
    base = summary.get("baseline") or {}
    best = summary.get("best") or {}
    final = summary.get("final") or {}
    hidden = "hidden cases" if summary.get("unit", "us") == "us" else "final objective"
    vs = _vs(best.get("score_us"), base.get("score_us"), summary, than="the baseline")
    rows = [[f"baseline ({hidden})", _score(base.get("score_us")), base.get("verdict", "-")]]
    rows.append(
        [
            f"best (same {hidden})",
            _score(best.get("score_us")),
            f"iteration {best.get('iteration', '-')}, checkpoint {best.get('candidate', '-')}"
            + (f", {vs}" if vs else "")
            + (", restored into the workspace" if summary.get("restored") else ""),
        ]
    )
    failed = final.get("verdict") not in (None, "passed")
    rows.append(
        [
            f"final ({'NEW ' if final.get('case_set') != best.get('case_set') else ''}{hidden})",
            _score(final.get("score_us")),
            f"{final.get('verdict', '-')} on {final.get('case_set', '-')}"
            + (
                f": {final.get('error') or '; '.join(final.get('reasons') or [])}" if failed else ""
            ),
        ]
    )
    built = {s["name"]: s["status"] for it in summary["iterations"] for s in it.get("servers", [])}
    if built:
        rows.append(
            ["servers", "", ", ".join(f"{name} ({status})" for name, status in built.items())]
        )
    calls = summary.get("tool_calls") or {}
    if calls:
        rows.append(
            [
                "tool calls",
                str(sum(calls.values())),
                ", ".join(f"{k} x{v}" for k, v in calls.items()),
            ]
        )
    gpu = summary.get("gpu_work_s") or {}
    if gpu:
        rows.append(
            [
                "GPU-backed work",
                f"{gpu.get('total', 0):.0f} s",
                f"tools {gpu.get('tools', 0):.0f} s + scoring {gpu.get('scoring', 0):.0f} s "
                f"of {summary.get('wall_s', 0):.0f} s wall",
            ]
        )
    rows.append(["workspace", "", f"{summary['workspace']} ({summary.get('wall_s', 0):.0f}s)"])
    return fit_table("result", ["", _unit(summary), "note"], rows)


def print_summary(summary: dict[str, Any]) -> None:
    out = stdout_console()
    out.print(iterations_table(summary))
    out.print(result_table(summary))


def _gpu_settings(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json", exclude_defaults=True)
    return {k: data[k] for k in GPU_FIELDS if k in data}


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", help=f"task name ({', '.join(list_tasks())}) or task folder")
    p.add_argument("-w", "--workspace", type=Path, required=True, help="workspace folder")
    p.add_argument("--iterations", type=int, default=3, help="attempts (default 3)")
    p.add_argument(
        "--runner",
        choices=["exec", "claude", "codex", "autopilot"],
        help="agent runner (default autopilot; with --resume: the run's own unless given)",
    )
    p.add_argument(
        "--agent-cmd",
        default=None,
        help="exec runner command; placeholders {prompt_file} {workspace} {mcp_config} "
        "{result_file} {phase} {session_id}",
    )
    p.add_argument(
        "--agent-arg", action="append", default=None, help="extra runner argument (repeatable)"
    )
    p.add_argument("--attempt-timeout", type=duration_s, default=300.0, help="e.g. 5m")
    p.add_argument(
        "--attempt-timeouts",
        type=durations_s,
        default=None,
        metavar="LIST",
        help="per-iteration attempt limits, e.g. 5m,8m (the last holds for later iterations)",
    )
    p.add_argument("--build-timeout", type=duration_s, default=300.0, help="e.g. 5m")
    p.add_argument(
        "--artifact-repair-attempts",
        type=int,
        default=1,
        metavar="N",
        help="repair turns after a failed qualification (default 1; 0: quarantine at once)",
    )
    p.add_argument("--run-id", help="name of the new run (default: time + random suffix)")
    p.add_argument(
        "--task-text", help="the brief, inline (instead of the task's task.md) for the prompts"
    )
    g = p.add_argument_group("agent CLIs (conveniences over --agent-arg and HARNESSLAB_*)")
    g.add_argument("--claude-bin", help="Claude Code program for --runner claude")
    g.add_argument("--codex-bin", help="Codex program for --runner codex")
    g.add_argument("--claude-model", help="--runner claude: the model (claude --model)")
    g.add_argument(
        "--claude-max-budget-usd",
        type=float,
        help="--runner claude: spend cap per turn (claude --max-budget-usd)",
    )
    p.add_argument("--stop-score", type=float, help="stop once the verified score is this good")
    p.add_argument(
        "--budget",
        type=duration_s,
        help="wall-clock budget, e.g. 10m: no new iteration starts after it (with a large "
        "--iterations, a run of fixed length)",
    )
    p.add_argument("--higher-is-better", action="store_true", help="for command tasks' scores")
    p.add_argument(
        "--optimization-mode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="checkpoint the best verified workspace and restore it at the end (default on)",
    )
    p.add_argument(
        "--no-restore-best", action="store_true", help="leave the last attempt's workspace"
    )
    p.add_argument(
        "--build",
        choices=["auto", "always", "never"],
        default="auto",
        help="reflect/build turns: auto = until solved",
    )
    p.add_argument("--resume", metavar="RUN_ID", help="continue a run after a crash or Ctrl-C")
    p.add_argument("--json", action="store_true", help="print summary.json on stdout")
    add_executor_args(p)


async def _until_signalled(runner_coro, progress: Progress) -> dict[str, Any] | None:
    """Run the loop; Ctrl-C (SIGINT), SIGTERM and SIGHUP cancel it through this task group, so
    it records the interruption and kills what it started instead of dying with agents
    orphaned. SIGINT is taken here too rather than left to Python's default handler, which a
    process started with SIGINT ignored never gets (a script's background job; an xdist worker
    of the full suite passed that on, and the loop ran on past its Ctrl-C). A second Ctrl-C
    after the first raises KeyboardInterrupt at once."""
    summary: dict[str, Any] | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            with anyio.open_signal_receiver(
                signal.SIGINT, signal.SIGTERM, signal.SIGHUP
            ) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(watch)
        try:
            summary = await runner_coro(progress)
        except Exception as exc:  # re-raised bare below, not wrapped in an ExceptionGroup
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return summary


def _go(args: argparse.Namespace, settings: Settings, runner_coro, epilogue=None) -> int:
    with Progress(True) as progress:  # stderr: --json output on stdout stays clean
        try:
            summary = run_async(_until_signalled, runner_coro, progress)
            if summary is None:
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            if progress.run_id:
                print(
                    f"interrupted; continue with: harnesslab run -w {args.workspace} "
                    f"--resume {progress.run_id}",
                    file=sys.stderr,
                )
            raise
    if args.json:
        print(json.dumps(summary))
    else:
        print_summary(summary)
    if epilogue is not None:
        epilogue(summary)
    if summary.get("status") == "agent_failed":
        print(f"error: the agent never worked: {summary['stop_reason']}", file=sys.stderr)
        print(
            f"next: fix the runner (`harnesslab doctor -w {args.workspace}`); its output is in "
            f"{progress.run_dir or 'the run folder'}/iter-*/attempt/",
            file=sys.stderr,
        )
        return AGENT_FAILED_EXIT
    final = summary.get("final") or {}
    return 0 if final.get("verdict") == "passed" else 1


@command("run", "Run the agent loop: attempt, verify, checkpoint, build tools, repeat.", _run_args)
def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    if args.resume:
        # Only the command line and the trusted store say how a run resumes: its runner, agent
        # command and executor settings come from the run's state in the store unless given
        # again here; nothing in the workspace's run folder is read.
        ws = open_workspace(args.workspace, settings)
        stored = RunStore(ws, args.resume).load().config
        args.runner = args.runner or stored.runner
        extra, settings = agent_conveniences(args, settings)
        if extra:
            args.agent_arg = [*(args.agent_arg or stored.agent_args), *extra]
        given = _gpu_settings(settings)
        settings = settings.model_copy(update={**stored.gpu, **given})
        update: dict[str, Any] = {"gpu": {**stored.gpu, **given}}
        for field, value in (
            ("runner", args.runner),
            ("agent_cmd", args.agent_cmd),
            ("agent_args", args.agent_arg),
        ):
            if value is not None:
                update[field] = value

        async def resume(progress: Progress) -> dict[str, Any]:
            return await resume_run(
                args.workspace, args.resume, settings, on_event=progress, config_update=update
            )

        return _go(args, settings, resume)
    if not args.task and not is_workspace(args.workspace, settings):
        raise UsageError(
            "--task is needed for a new workspace.", next_step="pass --task rmsnorm_gate"
        )
    if args.iterations < 1:
        raise UsageError("--iterations must be at least 1.")
    if not 0 <= args.artifact_repair_attempts <= 5:
        raise UsageError("--artifact-repair-attempts must be 0..5.")
    extra, settings = agent_conveniences(args, settings)
    config = RunConfig(
        task=args.task or "",
        workspace=args.workspace,
        iterations=args.iterations,
        runner=args.runner or "autopilot",
        agent_cmd=args.agent_cmd or "",
        agent_args=[*(args.agent_arg or []), *extra],
        attempt_timeout_s=args.attempt_timeout,
        attempt_timeouts_s=args.attempt_timeouts or [],
        repair_attempts=args.artifact_repair_attempts,
        task_text=args.task_text or "",
        build_timeout_s=args.build_timeout,
        stop_score=args.stop_score,
        budget_s=args.budget,
        higher_is_better=args.higher_is_better,
        optimization_mode=args.optimization_mode,
        restore_best=not args.no_restore_best,
        build=args.build,
        gpu=_gpu_settings(settings),
    )

    async def start(progress: Progress) -> dict[str, Any]:
        return await start_run(config, settings, on_event=progress, run_id=args.run_id)

    return _go(args, settings, start)


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workspace", type=Path, help="demo workspace (default: a new temp folder)")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print summary.json on stdout")
    add_executor_args(p)


@command(
    "demo",
    "A 2-iteration autopilot loop on rmsnorm_gate in a temporary workspace: sweep, verify, "
    "build a task-specific MCP server, use it, restore the best.",
    _demo_args,
)
def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    temp = args.workspace is None
    root = args.workspace or temp_workspace_dir() / "ws"
    args.workspace = root
    config = RunConfig(
        task="rmsnorm_gate",
        workspace=root,
        iterations=args.iterations,
        runner="autopilot",
        attempt_timeout_s=240.0,
        build_timeout_s=180.0,
        gpu=_gpu_settings(settings),
    )
    print(f"demo workspace: {root}", file=sys.stderr)

    async def start(progress: Progress) -> dict[str, Any]:
        return await start_run(config, settings, on_event=progress)

    return _go(
        args,
        settings,
        start,
        epilogue=lambda summary: demo_epilogue(root, summary, args.json, temp=temp),
    )


def demo_epilogue(root: Path, summary: dict[str, Any], as_json: bool, *, temp: bool) -> None:
    """Where the demo left its workspace, and what it is good for next."""
    registered = sorted(
        {s["name"] for it in summary["iterations"] for s in it.get("servers", [])
         if s.get("status") == "registered"}
    )  # fmt: skip
    lines = [f"the demo's workspace is kept: {root}", f"  look around: harnesslab eval -w {root}"]
    if registered:
        lines.append(
            f"  does its server ({', '.join(registered)}) help? harnesslab compare --task "
            f"rmsnorm_gate --harness-from {root} --trials 3 --out cmp"
        )
    if temp:
        lines.append(f"  remove it: rm -rf {root.parent}")
    print("\n".join(lines), file=sys.stderr if as_json else sys.stdout)


__all__ = ["cmd_demo", "cmd_run", "duration_s", "iterations_table", "result_table"]
