"""What the loop tells the agent: the attempt, build and repair prompts. Plain text, written to
the run folder before every turn, so a transcript can be read next to what the agent was told."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..state import Workspace
from ..state import workspace_files as wf
from ..task import kind_of
from .state import Iteration, RunState

RESULT_CONTRACT = """Write a JSON object to {result_file} before you stop:
  {{"status": "improved" | "no_change" | "failed", "summary": "what you did, two sentences",
    "metrics": {{...numbers you measured...}},
    "selected_improvement": "the ONE tool or server that would have helped you most"}}"""

BUILD_CONTRACT = """Write a JSON object to {result_file} before you stop:
  {{"status": "built" | "not_built", "server": "<name of the server you generated>",
    "summary": "what the server offers and why"}}"""


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def scoreboard(state: RunState, ws: Workspace) -> str:
    cfg = state.config
    kind = kind_of(ws.task)
    unit = kind.unit(ws.task)
    better = "higher" if cfg.higher_is_better or kind.higher_is_better(ws.task) else "lower"
    hidden = ws.task.final is not None
    lines = [
        "Scores are the loop's own guarded verification"
        + (" on hidden cases" if hidden else " (the task's final objective)")
        + f" ({better} is better):"
    ]
    if state.baseline is not None:
        lines.append(f"- baseline: {_f(state.baseline.score_us)} {unit} ({state.baseline.verdict})")
    for it in state.iterations:
        if it.score is not None:
            lines.append(
                f"- iteration {it.index}: {_f(it.score.score_us)} {unit} ({it.score.verdict})"
            )
    if state.best is not None:
        lines.append(
            f"- best so far: {_f(state.best.score_us)} {unit} (iteration {state.best.iteration}, "
            f"checkpoint {state.best.candidate})"
        )
    if cfg.stop_score is not None:
        lines.append(f"- target (stop score): {cfg.stop_score:g} {unit}")
    if state.baseline is not None and not state.baseline.meaningful:
        lines.append("  (Triton CPU interpreter: timings are not meaningful, only relative)")
    return "\n".join(lines)


def servers_text(servers: dict[str, list[str]]) -> str:
    lines = []
    for name, tools in servers.items():
        lines.append(f"- {name}: {', '.join(tools) if tools else '(tools listed by the server)'}")
    return "\n".join(lines)


def attempt_prompt(
    ws: Workspace,
    state: RunState,
    it: Iteration,
    servers: dict[str, list[str]],
    *,
    result_file: str,
    brief: str,
) -> str:
    cfg = state.config
    return f"""# harnesslab: iteration {it.index} of {cfg.iterations} - attempt

You are optimizing the task below in the workspace {ws.root} (edit only: {", ".join(ws.task.editable)}).
You have {cfg.attempt_limit_s(it.index):.0f} seconds; the loop kills the session after that and scores
the workspace as it stands, so keep it correct at every step.

## MCP servers available
{servers_text(servers)}
Prefer these tools to ad-hoc scripts: they time on the real GPU, record every candidate, and
checkpoint it (restore_best_checkpoint undoes a bad change).

## Where things stand
{scoreboard(state, ws)}

After you stop, the loop verifies the workspace independently on hidden cases; that score, not
your claim, decides whether this attempt becomes the new best.

## Result
{RESULT_CONTRACT.format(result_file=result_file)}

## Task brief
{brief}
"""


def build_prompt(
    ws: Workspace,
    state: RunState,
    it: Iteration,
    servers: dict[str, list[str]],
    *,
    result_file: str,
    meta_server: str,
) -> str:
    cfg = state.config
    claim = (it.attempt.result or {}) if it.attempt else {}
    selected = claim.get("selected_improvement") or "(none given)"
    usage = telemetry_text(ws)
    score = it.score
    verified = f"{_f(score.score_us)} us ({score.verdict})" if score else "not scored"
    return f"""# harnesslab: iteration {it.index} of {cfg.iterations} - reflect and build

The attempt is over; the loop verified the workspace at {verified}.
{scoreboard(state, ws)}

Now improve the TOOLING, not the kernel: pick ONE improvement that would make the next fresh
session faster or more reliable (you suggested: {selected}) and build it as a task-specific
MCP server with the meta-server `{meta_server}`:
1. generate_server(spec): built-in tools with presets (a sweep region that worked, a case
   subset) and/or small custom async functions (they run sandboxed: JSON arguments and result,
   the workspace through a `workspace` parameter, which they read; they write only their
   output folder .harnesslab/out/<name>/; no network);
2. self_test_server(name) until it passes (qualification in a clean copy of the workspace);
3. register_server(name).
After this turn the loop registers every server you generated or changed that qualified for
exactly its current files, qualifies the others itself, and gives a failing one ONE repair turn
before quarantining it. You have {cfg.build_timeout_s:.0f} seconds. Do not change the kernel
files in this phase.

## MCP servers available now
{servers_text(servers)}

## Tool usage so far (telemetry)
{usage}

## Result
{BUILD_CONTRACT.format(result_file=result_file)}
"""


def repair_prompt(
    failures: dict[str, str], *, result_file: str, meta_server: str, timeout_s: float
) -> str:
    reports = "\n\n".join(f"### {name}\n{report}" for name, report in failures.items())
    return f"""# harnesslab: repair turn

Qualification of the server(s) you built failed. This is the one repair turn: fix them (their
files are under .harnesslab/mcp/<name>/; regenerate with `{meta_server}`'s generate_server or
edit the custom files) and run self_test_server until it passes. A server that still fails
qualification after this turn is quarantined. You have {timeout_s:.0f} seconds.

## Failure reports
{reports}

## Result
{BUILD_CONTRACT.format(result_file=result_file)}
"""


def telemetry_text(ws: Workspace, limit: int = 40) -> str:
    """One line per tool: calls, outcomes, median duration (what was used, what failed)."""
    lines = []
    for tool, st in list(ws.telemetry_usage().items())[:limit]:
        outcomes = ", ".join(f"{k} {v}" for k, v in st["status"].items())
        median = st.get("median_ms")
        lines.append(
            f"- {tool}: {st['calls']} calls ({outcomes})"
            + (f", median {median / 1e3:.1f} s" if median is not None else "")
        )
    return "\n".join(lines) or "(no tool calls recorded)"


def brief_text(ws: Workspace) -> str:
    """The task's own brief (from the bound task, not the workspace's copy: a task.md linked
    to some other file would put that file into the prompt)."""
    if ws.task.brief_path().is_file():
        return ws.task.brief_path().read_text(errors="replace")
    try:
        return wf.read_text(ws.root, "task.md")
    except UsageError:
        return f"{ws.task.name}: {ws.task.summary}"


def claim_summary(result: dict[str, Any] | None) -> str:
    if not result:
        return ""
    return str(result.get("summary", ""))[:200]


__all__ = ["attempt_prompt", "brief_text", "build_prompt", "claim_summary", "repair_prompt"]
