"""The autopilot: a built-in MCP client with a fixed strategy and no LLM, so the whole loop,
meta-server included, runs on any machine.

    python -m harnesslab.servers.autopilot --phase attempt|build|repair --workspace DIR
        --mcp-config FILE --result-file FILE [--prompt-file FILE] [--session-id ID]

It reads the same MCP config file a Claude or Codex session gets and starts the servers in it
with the SDK's stdio client.
- attempt (kernel and step tasks): inspect_context -> a preset sweep from a registered
  generated server, if there is one -> run_objective -> sweep_kernel_config (coarse, then around
  the best) -> apply the best config -> numerical_probe -> guarded_final_verify; a config that
  fails the probe or the verify is undone. A step task's cases are its dev traces. With the
  turn's limit (--time-limit-s, which the loop passes) each sweep tries only the configs that
  leave time for the probe and the verify (a config costs about one run_objective, then what
  the coarse sweep measured); with no room for two, the attempt stops after run_objective and
  says so.
- command tasks: servers/autopilot_command.py (one-knob changes of the config file, scored
  with run_objective; the build writes a tool that restores the winning config).
- build / repair: through the meta-server, generate a task-specific server that offers the
  winning sweep region as a preset of sweep_kernel_config, self-test (qualify) and register it;
  the next attempt starts with it.
Every call is logged as one JSON line on stdout (the transcript); result.json is rewritten
after every stage, so a timed-out autopilot still leaves its notes. Notes for the build phase
(the "session") are kept in .harnesslab/autopilot/<session>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from harnesslab.tools.catalog import META_SERVER, TASK_SERVER
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import STATE, Workspace, open_workspace
from harnesslab.tools.state.storage import atomic_write_json
from harnesslab.tools.task import kind_of

from . import autopilot_command

log = logging.getLogger("harnesslab.autopilot")

CALL_TIMEOUT_S = 900.0


class ToolFailed(Exception):
    pass


class Session:
    """Connected servers, the transcript, and the notes kept between phases."""

    def __init__(self, args: argparse.Namespace, stack: AsyncExitStack) -> None:
        self.args = args
        self.stack = stack
        self.clients: dict[str, Client] = {}
        self.schemas: dict[str, dict[str, dict[str, Any]]] = {}
        self.session_id = args.session_id or uuid.uuid4().hex[:12]
        self.notes_path = Path(args.workspace) / STATE / "autopilot" / f"{self.session_id}.json"
        self.notes: dict[str, Any] = {}
        if self.notes_path.is_file():
            self.notes = json.loads(self.notes_path.read_text())
        self.result: dict[str, Any] = {"status": "failed", "session_id": self.session_id}
        limit = getattr(args, "time_limit_s", None)
        self.deadline = time.monotonic() + limit if limit else None

    def left_s(self) -> float | None:
        """Seconds until the turn's limit (None: no limit known)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    async def connect(self, name: str, entry: dict[str, Any]) -> Client:
        env = dict(entry.get("env") or {})
        if os.environ.get("PYTHONPATH") and "PYTHONPATH" not in env:
            # The SDK passes only a safe subset of the environment; an install that lives on
            # PYTHONPATH (no venv) still has to find harnesslab in the servers it starts.
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        params = StdioServerParameters(
            command=entry["command"],
            args=list(entry.get("args", [])),
            env=env or None,
            cwd=entry.get("cwd") or None,
        )
        client = await self.stack.enter_async_context(Client(params, mode="legacy"))
        listed = await client.list_tools()
        self.clients[name] = client
        self.schemas[name] = {t.name: dict(t.input_schema or {}) for t in listed.tools}
        self.log({"event": "connected", "server": name, "tools": sorted(self.schemas[name])})
        return client

    def log(self, record: dict[str, Any]) -> None:
        print(json.dumps({"t": round(time.time(), 3), **record}, default=str), flush=True)

    def accepts(self, server: str, tool: str) -> set[str]:
        return set(self.schemas.get(server, {}).get(tool, {}).get("properties", {}))

    async def call(self, server: str, tool: str, **args: Any) -> dict[str, Any]:
        """Call a tool with the arguments its schema accepts; structured result or ToolFailed."""
        if tool not in self.schemas.get(server, {}):
            raise ToolFailed(f"{server} has no tool {tool}")
        known = self.accepts(server, tool)
        sent = {k: v for k, v in args.items() if v is not None and (not known or k in known)}
        started = time.perf_counter()
        with anyio.fail_after(CALL_TIMEOUT_S):
            res = await self.clients[server].call_tool(tool, sent)
        took = time.perf_counter() - started
        text = " ".join(getattr(c, "text", "") for c in res.content)
        data = res.structured_content
        if data is None:
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                data = {"text": text}
        if isinstance(data, dict) and set(data) == {"result"} and isinstance(data["result"], dict):
            data = data["result"]
        self.log(
            {
                "event": "call",
                "server": server,
                "tool": tool,
                "args": sent,
                "duration_s": round(took, 2),
                "is_error": bool(res.is_error),
                "result": _short(data if not res.is_error else text),
            }
        )
        if res.is_error:
            raise ToolFailed(f"{tool}: {text[:500]}")
        return data if isinstance(data, dict) else {"value": data}

    def save(self) -> None:
        atomic_write_json(self.notes_path, self.notes)
        atomic_write_json(Path(self.args.result_file), self.result)


def _short(obj: Any, limit: int = 600) -> Any:
    text = json.dumps(obj, default=str)
    return obj if len(text) <= limit else text[:limit] + "..."


def spread(values: list[Any], n: int) -> list[Any]:
    """n values spread over a sorted list (first, ..., last)."""
    if len(values) <= n:
        return list(values)
    if n == 1:
        return [values[len(values) // 2]]
    return [values[round(i * (len(values) - 1) / (n - 1))] for i in range(n)]


def neighbours(values: list[Any], best: Any) -> list[Any]:
    if best not in values:
        return [best]
    i = values.index(best)
    return values[max(0, i - 1) : i + 2]


def coarse_space(space: dict[str, list[Any]], max_configs: int) -> dict[str, list[Any]]:
    """The two knobs with the most values, spread: 3 x 2 values for max_configs 6."""
    knobs = sorted(space, key=lambda k: -len(space[k]))[:2]
    if not knobs:
        return {}
    if len(knobs) == 1:
        return {knobs[0]: spread(space[knobs[0]], max_configs)}
    first = max(2, max_configs // 2)
    return {
        knobs[0]: spread(space[knobs[0]], first),
        knobs[1]: spread(space[knobs[1]], max(1, max_configs // first)),
    }


def refine_space(
    space: dict[str, list[Any]],
    coarse: dict[str, list[Any]],
    best: dict[str, Any],
    max_configs: int,
) -> dict[str, list[Any]]:
    """Around the best: each swept knob's neighbours in the declared list."""
    out = {k: neighbours(space[k], best[k]) for k in coarse if k in best}
    while _size(out) > max_configs:
        widest = max(out, key=lambda k: len(out[k]))
        vals = out[widest]
        # drop the neighbour farther from the best value's position
        out[widest] = vals[1:] if vals[0] != best[widest] else vals[:-1]
    return out


def _size(space: dict[str, list[Any]]) -> int:
    n = 1
    for v in space.values():
        n *= len(v)
    return n


def pick_cases(dev_cases: list[dict[str, Any]], interpreted: bool) -> list[str] | None:
    """All dev cases on a GPU; on the CPU interpreter the smallest and the widest (cheap)."""
    if not interpreted or len(dev_cases) <= 2:
        return None
    by_size = sorted(dev_cases, key=lambda c: (c.get("dim", 0) * c.get("rows", 0), c["name"]))
    widest = max(dev_cases, key=lambda c: (c.get("dim", 0), c["name"]))
    names = [by_size[0]["name"], widest["name"]]
    return sorted(set(names))


def configs_that_fit(left_s: float | None, per_config_s: float, reserve_s: float, cap: int) -> int:
    """How many configs a sweep may try so that `reserve_s` (the probe and the verify after
    it) is still left before the turn's limit, at `per_config_s` each (at most `cap`)."""
    if left_s is None:
        return cap
    return max(0, min(cap, int((left_s - reserve_s) // max(per_config_s, 1e-3))))


def best_of(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in results if r.get("status") == "ok" and r.get("score_us") is not None]
    return min(ok, key=lambda r: r["score_us"]) if ok else None


async def attempt(s: Session, servers: dict[str, dict[str, Any]], ws: Workspace) -> None:
    """A kernel or step task's attempt: sweeps of the launch config (a command task has no
    sweep tool, maybe no config file: autopilot_command.py)."""
    await s.connect(TASK_SERVER, servers[TASK_SERVER])
    ctx = await s.call(TASK_SERVER, "inspect_context")
    task = ctx.get("task") or {}
    space: dict[str, list[Any]] = task.get("launch_space") or ws.task.space
    dev_cases = kind_of(ws.task).dev_cases(ws.task)  # a step task's: its dev traces
    interpreted = bool((ctx.get("executor") or {}).get("interpreted", True))
    max_configs = s.args.max_configs or (6 if interpreted else 24)  # None or 0: the default
    cases = pick_cases(dev_cases, interpreted)
    config_path = ws.root / ws.task.config_file
    original = json.loads(config_path.read_text())
    s.result.update(status="no_change", summary="", metrics={"interpreted": interpreted})
    s.save()
    sweeps: list[dict[str, Any]] = []

    # A registered generated server with a preset sweep: the last run's winning region.
    for name, entry in servers.items():
        if name in (TASK_SERVER, META_SERVER):
            continue
        try:
            await s.connect(name, entry)
        except Exception as exc:  # a broken generated server must not stop the attempt
            s.log({"event": "connect_failed", "server": name, "error": str(exc)[:300]})
            continue
        for tool in sorted(s.schemas[name]):
            if tool.startswith("sweep"):
                try:
                    sweeps.append(
                        await s.call(name, tool, cases=cases, max_configs=max_configs, apply=False)
                    )
                except ToolFailed as exc:
                    s.log({"event": "tool_failed", "error": str(exc)})

    started = time.monotonic()
    base = await s.call(TASK_SERVER, "run_objective", cases=cases)
    s.result["metrics"]["dev_score_us_before"] = base.get("score")
    # What the turn's limit allows: a config costs about one objective call (then what the
    # coarse sweep measured), and the probe and the verify after the sweeps about three.
    per_config_s = time.monotonic() - started
    reserve_s = 3 * per_config_s
    known = best_of([r for sw in sweeps for r in sw.get("results", [])])
    if known is None:
        fit = configs_that_fit(s.left_s(), per_config_s, reserve_s, max_configs)
        if fit < 2:
            s.result.update(status="no_change", summary=no_time(s, per_config_s))
            s.save()
            return
        coarse = coarse_space(space, fit)
        started = time.monotonic()
        sw = await s.call(
            TASK_SERVER, "sweep_kernel_config", space=coarse, cases=cases, max_configs=fit
        )
        per_config_s = (time.monotonic() - started) / max(int(sw.get("tried") or 0), 1)
        sweeps.append(sw)
        known = best_of(sw.get("results", []))
    else:
        coarse = {k: space[k] for k in known["config"] if k in space and len(space[k]) > 1}
        coarse = dict(sorted(coarse.items(), key=lambda kv: -len(kv[1]))[:2])
    if known is None:
        s.result.update(status="failed", summary="no config in the coarse sweep passed")
        s.save()
        return
    fit = configs_that_fit(s.left_s(), per_config_s, reserve_s, max_configs)
    around = refine_space(space, coarse, known["config"], max(fit, 1))
    if fit > 1 and _size(around) > 1:
        sw = await s.call(
            TASK_SERVER, "sweep_kernel_config", space=around, cases=cases, max_configs=fit
        )
        sweeps.append(sw)
    best = best_of([r for sw in sweeps for r in sw.get("results", [])]) or known
    s.notes.update(
        space=space, coarse=coarse, around=around, best=best, cases=cases, interpreted=interpreted
    )
    s.result["metrics"].update(best_config=best["config"], best_sweep_score_us=best["score_us"])
    s.save()

    if best["config"] != original:
        config_path.write_text(json.dumps(best["config"], indent=2) + "\n")
    probe = await s.call(TASK_SERVER, "numerical_probe")
    verdict = await s.call(TASK_SERVER, "guarded_final_verify")
    ok = probe.get("status") == "passed" and verdict.get("verdict") == "passed"
    if not ok and best["config"] != original:
        config_path.write_text(json.dumps(original, indent=2) + "\n")
    s.result.update(
        status="improved" if ok and best["config"] != original else "no_change",
        summary=f"swept {sum(sw.get('tried', 0) for sw in sweeps)} configs; "
        f"{'applied' if ok else 'kept'} {json.dumps(best['config'] if ok else original)}",
        selected_improvement="a preset sweep of the winning region, so the next session starts there",
    )
    s.result["metrics"].update(
        probe=probe.get("status"),
        verify=verdict.get("verdict"),
        verify_score_us=verdict.get("score_us"),
    )
    s.save()


def no_time(s: Session, objective_s: float) -> str:
    """Why the attempt stopped before its sweep, and what gives it room."""
    left = s.left_s() or 0.0
    s.log({"event": "no_time", "objective_s": round(objective_s, 1), "left_s": round(left, 1)})
    return (
        f"no sweep: run_objective took {objective_s:.0f} s and {left:.0f} s of the turn were "
        f"left, too little for two configs and the probe and verify after them (~"
        f"{3 * objective_s:.0f} s); raise the limit (harnesslab run --attempt-timeout)"
    )


def server_spec(task_name: str, notes: dict[str, Any]) -> dict[str, Any]:
    """A server whose one tool is sweep_kernel_config with the winning region preset. Its probe
    is one config on one case: qualification calls it several times."""
    region = notes["around"] or {k: [v] for k, v in notes["best"]["config"].items()}
    cases = notes.get("cases") or []
    best = json.dumps(notes["best"]["config"])
    probe: dict[str, Any] = {"max_configs": 1, "apply": False}
    if cases:
        probe["cases"] = cases[:1]
    return {
        "name": f"{task_name.replace('_', '-')}-tuned",
        "description": f"Launch-config sweep of the region where {task_name} was fastest so far "
        f"(best {best}).",
        "when_to_use": "Start here in a fresh session: one call re-times the winning region.",
        "tools": [
            {
                "builtin": "sweep_kernel_config",
                "name": "sweep_winning_region",
                "description": f"Sweep the launch configs {json.dumps(region)} (the region that "
                "won the last run) on the given dev cases; costs one runner session. apply=true "
                "writes the best config into kernel_config.json; next: guarded_final_verify.",
                "presets": {"space": region},
                "probe_args": probe,
            }
        ],
    }


async def build(s: Session, servers: dict[str, dict[str, Any]], ws: Workspace) -> None:
    if not s.notes.get("best"):
        s.result.update(status="not_built", summary="the attempt found no winning config")
        s.save()
        return
    await s.connect(META_SERVER, servers[META_SERVER])
    spec = server_spec(ws.task.name, s.notes)
    s.result.update(status="not_built", server=spec["name"])
    s.save()
    await s.call(META_SERVER, "generate_server", **spec)
    region = json.dumps(spec["tools"][0]["presets"]["space"])
    s.result.update(status="built", summary=f"{spec['name']}: sweep_winning_region over {region}")
    if s.args.self_test:
        test = await s.call(META_SERVER, "self_test_server", name=spec["name"])
        if test.get("qualified"):
            await s.call(META_SERVER, "register_server", name=spec["name"])
        else:
            s.result.update(status="not_built", summary=str(test.get("reason", ""))[:1000])
    s.save()


# Each phase's strategy per task kind (tools/task/kinds.py KINDS); "repair" builds again.
PHASES_BY_KIND = {
    "kernel": {"attempt": attempt, "build": build, "repair": build},
    "command": {
        "attempt": autopilot_command.attempt,
        "build": autopilot_command.build,
        "repair": autopilot_command.build,
    },
    # A step task's tools take its launch space and dev traces as a kernel task's take its own
    # (the sweep scores each config with the step objective; the verify is the step's).
    "step": {"attempt": attempt, "build": build, "repair": build},
}


async def main_async(args: argparse.Namespace) -> int:
    servers = json.loads(Path(args.mcp_config).read_text()).get("mcpServers", {})
    async with AsyncExitStack() as stack:
        s = Session(args, stack)
        s.save()
        try:
            ws = open_workspace(Path(s.args.workspace), s.args.settings)
            await PHASES_BY_KIND[kind_of(ws.task).name][args.phase](s, servers, ws)
        except ToolFailed as exc:
            s.result.update(status="failed", summary=str(exc)[:1000])
            s.save()
            s.log({"event": "failed", "error": str(exc)})
            return 1
        except Exception as exc:  # boundary: the traceback to stderr, the failure to result.json
            log.exception("autopilot %s failed", args.phase)
            s.result.update(status="failed", summary=f"{type(exc).__name__}: {exc}"[:1000])
            s.save()
            return 1
        s.save()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", choices=["attempt", "build", "repair"], required=True)
    p.add_argument("--workspace", required=True)
    p.add_argument("--mcp-config", required=True)
    p.add_argument("--result-file", required=True)
    p.add_argument("--prompt-file")
    p.add_argument("--session-id")
    p.add_argument(
        "--max-configs",
        type=int,
        default=None,
        help="per sweep (default 6 on the CPU); command tasks: one-knob tries (0: none)",
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=None,
        help="the turn's limit: sweeps shrink to leave time for the probe and the verify",
    )
    p.add_argument(
        "--self-test",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build: qualify with self_test_server, then register_server (default on)",
    )
    args = p.parse_args(argv)
    args.settings = Settings()  # the loop passes its own as HARNESSLAB_* variables
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return anyio.run(main_async, args)


if __name__ == "__main__":
    sys.exit(main())
