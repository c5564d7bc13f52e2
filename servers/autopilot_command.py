"""The autopilot's strategy on a command task (servers/autopilot.py dispatches here): no LLM,
only the task server's generic tools and whatever generated servers are registered.

- attempt: inspect_context -> every tool of a registered generated server that needs no
  arguments (a harness built by an earlier build turn: `apply_winning_config`) -> run_objective
  -> when the task declares a config file and a launch space, a few one-knob changes of that
  file, each scored with run_objective, the best kept (the rest undone). The loop's guarded
  score follows the attempt, so the autopilot does not verify on its own.
- build / repair: a generated server whose one custom tool writes the winning config back, so
  the next session starts where this one ended; qualified and registered through the
  meta-server like any agent's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harnesslab.tools.state.workspace import STATE, Workspace
from harnesslab.tools.task import kind_of

TRIES_INTERPRETED, TRIES_GPU = 2, 6
WINNING_FILE = "winning.py"
WINNING_PY = '''"""Writes the launch config that won the last attempt back into the workspace."""

import json
from pathlib import Path

WINNING = {winning}
CONFIG_FILE = {config_file!r}


async def apply_winning_config(workspace: str) -> dict:
    """Write the winning config into the workspace's config file; returns what was written."""
    path = Path(workspace) / CONFIG_FILE
    path.write_text(json.dumps(WINNING, indent=2) + "\\n")
    return {{"applied": WINNING, "file": CONFIG_FILE}}
'''


def candidates(space: dict[str, list[Any]], current: dict[str, Any], n: int) -> list[dict]:
    """Up to n configs that differ from `current` in one knob: the widest knobs first, values
    nearest the current one's position first (a coordinate step, not a grid)."""
    out: list[dict[str, Any]] = []
    for knob in sorted(space, key=lambda k: (-len(space[k]), k)):
        values = list(space[knob])
        here = values.index(current[knob]) if current.get(knob) in values else 0
        for v in sorted(values, key=lambda v: (abs(values.index(v) - here), -values.index(v))):
            if v != current.get(knob):
                out.append({**current, knob: v})
            if len(out) >= n:
                return out
    return out


def _better(a: float | None, b: float | None, higher: bool) -> bool:
    if a is None:
        return False
    return b is None or (a > b if higher else a < b)


async def attempt(s: Any, servers: dict[str, dict[str, Any]], ws: Workspace) -> None:
    from .autopilot import META_SERVER, TASK_SERVER, ToolFailed  # noqa: PLC0415 - cycle

    await s.connect(TASK_SERVER, servers[TASK_SERVER])
    ctx = await s.call(TASK_SERVER, "inspect_context")
    interpreted = bool((ctx.get("executor") or {}).get("interpreted", True))
    s.result.update(status="no_change", summary="", metrics={"interpreted": interpreted})
    s.save()
    used: list[str] = []
    for name, entry in servers.items():  # a harness from an earlier build: use it first
        if name in (TASK_SERVER, META_SERVER):
            continue
        try:
            await s.connect(name, entry)
        except Exception as exc:  # a broken generated server must not stop the attempt
            s.log({"event": "connect_failed", "server": name, "error": str(exc)[:300]})
            continue
        for tool, schema in sorted(s.schemas[name].items()):
            if schema.get("required"):
                continue
            try:
                await s.call(name, tool)
                used.append(f"{name}.{tool}")
            except ToolFailed as exc:
                s.log({"event": "tool_failed", "error": str(exc)})
    higher = kind_of(ws.task).higher_is_better(ws.task, "dev")
    base = await s.call(TASK_SERVER, "run_objective")
    best_score = base.get("score") if base.get("status") == "passed" else None
    s.result["metrics"].update(dev_score_before=best_score, harness_tools_used=used)
    config_file, space = ws.task.config_file, ws.task.space
    path = ws.root / config_file if config_file else None
    if path is None or not space or not path.is_file():
        s.result.update(summary=f"ran the objective: {best_score}; no launch space to tune")
        s.save()
        return
    original = json.loads(path.read_text())
    best = dict(original)
    tries = s.args.max_configs  # 0: run the objective only (compare's CI trials)
    if tries is None:
        tries = TRIES_INTERPRETED if interpreted else TRIES_GPU
    tried = []
    for config in candidates(space, original, tries):
        path.write_text(json.dumps(config, indent=2) + "\n")
        res = await s.call(TASK_SERVER, "run_objective")
        score = res.get("score") if res.get("status") == "passed" else None
        tried.append({"config": config, "score": score})
        if _better(score, best_score, higher):
            best, best_score = config, score
    path.write_text(json.dumps(best, indent=2) + "\n")
    s.notes.update(best={"config": best, "score": best_score}, config_file=config_file)
    s.result["metrics"].update(best_config=best, dev_score_after=best_score, tried=tried)
    s.result.update(
        status="improved" if best != original else "no_change",
        summary=f"tried {len(tried)} one-knob configs; kept {json.dumps(best)}",
        selected_improvement="a tool that writes the winning config, so the next session "
        "starts there",
    )
    s.save()


def server_spec(task_name: str, config_file: str) -> dict[str, Any]:
    """The server the build turn generates: its one custom tool writes `config_file` (the
    task's editable config), so that file is its declared write set (its sandbox lets it
    write nothing else)."""
    return {
        "name": f"{task_name.replace('_', '-')}-winning",
        "description": f"Starts a {task_name} session from the launch config that won the last "
        "attempt.",
        "when_to_use": "First thing in a fresh session: one call writes the winning config.",
        "tools": [
            {
                "custom": {"function": "apply_winning_config", "file": WINNING_FILE},
                "description": "Write the launch config that won the last attempt into the "
                "workspace's config file (no GPU time); then run_objective to confirm it.",
                "probe_args": {},
            }
        ],
        "writes": [config_file],
    }


async def build(s: Any, servers: dict[str, dict[str, Any]], ws: Workspace) -> None:
    from .autopilot import META_SERVER  # noqa: PLC0415 - cycle

    best = (s.notes.get("best") or {}).get("config")
    if not best or not ws.task.config_file:
        s.result.update(status="not_built", summary="the attempt found no config to keep")
        s.save()
        return
    spec = server_spec(ws.task.name, ws.task.config_file)
    folder = Path(ws.root) / STATE / "mcp" / spec["name"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WINNING_FILE).write_text(
        WINNING_PY.format(winning=json.dumps(best), config_file=ws.task.config_file)
    )
    await s.connect(META_SERVER, servers[META_SERVER])
    s.result.update(status="not_built", server=spec["name"])
    s.save()
    await s.call(META_SERVER, "generate_server", **spec)
    s.result.update(status="built", summary=f"{spec['name']}: apply_winning_config {best}")
    if s.args.self_test:
        test = await s.call(META_SERVER, "self_test_server", name=spec["name"])
        if test.get("qualified"):
            await s.call(META_SERVER, "register_server", name=spec["name"])
        else:
            s.result.update(status="not_built", summary=str(test.get("reason", ""))[:1000])
    s.save()


__all__ = ["attempt", "build", "candidates", "server_spec"]
