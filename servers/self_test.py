"""`harnesslab serve --self-test`: the task server spun up in process on a temporary workspace,
every tool called through the SDK's in-memory Client. Exit 0 only if every tool works.

"Works" means the tool answers as documented: profile_kernel on a machine without a GPU or
ncu works when it answers with that clear error. The steps use one dev case and small sweeps so
the whole test stays under a minute on the Triton CPU interpreter.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnesslab.tools.settings import Settings
from harnesslab.tools.state import init_workspace
from harnesslab.tools.task import kind_of

Check = Callable[[dict[str, Any]], str]  # "" when the structured result is as expected


def _ok_if(cond: bool, why: str) -> str:
    return "" if cond else why


def steps(task: Any) -> list[tuple[str, dict[str, Any], Check, tuple[str, ...]]]:
    """(tool, arguments, check of the structured result, error texts that count as working).
    A tool that does not apply to the task's kind works when it refuses (servers/runtime.py)."""
    kind = kind_of(task)
    cases = kind.dev_cases(task)  # a step task's name its dev traces
    case = cases[0]["name"] if cases else None
    knob, values = next(iter(task.space.items())) if task.space else ("", [])
    out: list[tuple[str, dict[str, Any], Check, tuple[str, ...]]] = [
        ("inspect_context", {}, lambda r: _ok_if("next_step" in r, "no next_step"), ()),
        (
            "run_objective",
            {"cases": [case]} if case else {},
            lambda r: _ok_if(r.get("status") == "passed", f"status {r.get('status')}"),
            (),
        ),
        (
            "sweep_kernel_config",
            {"space": {knob: values[:2]}, "cases": [case], "max_configs": 2},
            lambda r: _ok_if(r.get("ok", 0) >= 1, "no config passed"),
            (),
        ),
        (
            "numerical_probe",
            {"dtypes": [task.dtypes[0]]} if task.dtypes else {},
            lambda r: _ok_if(r.get("status") == "passed", f"failing {r.get('failing')}"),
            (),
        ),
        (
            "guarded_final_verify",
            {},
            lambda r: _ok_if(r.get("verdict") == "passed", f"verdict {r.get('verdict')}"),
            (),
        ),
        ("rank_history", {"chart": True}, lambda r: _ok_if(r.get("total", 0) >= 1, "empty"), ()),
        ("restore_best_checkpoint", {}, lambda r: _ok_if("restored" in r, "nothing restored"), ()),
        (
            "profile_kernel",
            {"case": case} if case else {},
            lambda r: _ok_if(bool(r.get("bottleneck")), "no bottleneck line"),
            ("no GPU: profile_kernel needs a CUDA GPU", "ncu not found on"),
        ),
        ("remote_health_check", {}, lambda r: _ok_if(bool(r.get("hosts")), "no hosts"), ()),
    ]
    return [
        step if kind.applies(step[0]) else (step[0], {}, _refusal_expected, (REFUSED,))
        for step in out
    ]


# servers/runtime.py's answer to a tool that does not apply to the task's kind.
REFUSED = "works on kernel tasks"


def _refusal_expected(result: dict[str, Any]) -> str:
    return "should have answered with an error"


async def run_self_test(settings: Settings, task_name: str | None, name: str) -> int:
    from mcp import Client  # noqa: PLC0415

    from .builtin import ServerState  # noqa: PLC0415
    from .task_server import TASK_TOOL_NAMES, build_task_server  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="harnesslab-selftest-"))
    failures: list[str] = []

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        private = settings.model_copy(update={"state_dir": tmp / "state"})
        ws = init_workspace(task_name or "rmsnorm_gate", tmp / "ws", private)
        state = ServerState.open(ws.root, private, name=name)
        server = build_task_server(state)
        say(f"self-test: {name} on a temporary {ws.task.name} workspace ({ws.root})")
        try:
            async with Client(server) as client:
                listed = {t.name for t in (await client.list_tools()).tools}
                missing = sorted(set(TASK_TOOL_NAMES) - listed)
                if missing:
                    failures.append(f"tools/list lacks {', '.join(missing)}")
                for tool, arguments, check, accepted in steps(ws.task):
                    why = await _call(client, tool, arguments, check, accepted, say)
                    if why:
                        failures.append(f"{tool}: {why}")
                bad = await client.call_tool("run_objective", {"warmup": -1})
                if not bad.is_error:
                    failures.append("run_objective accepted warmup=-1")
                alive = await client.call_tool("inspect_context", {})
                if alive.is_error:
                    failures.append("the server stopped answering after a bad call")
        finally:
            await state.aclose()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        say("self-test FAILED:\n  " + "\n  ".join(failures))
        return 1
    say("self-test passed: every tool works")
    return 0


async def _call(
    client: Any,
    tool: str,
    arguments: dict[str, Any],
    check: Check,
    accepted: tuple[str, ...],
    say: Callable[[str], None],
) -> str:
    t0 = time.perf_counter()
    res = await client.call_tool(tool, arguments)
    took = time.perf_counter() - t0
    text = res.content[0].text if res.content and hasattr(res.content[0], "text") else ""
    if res.is_error:
        if any(a in text for a in accepted):
            say(f"  ok    {tool:26s} {took:6.2f}s  (expected answer: {text[:90]})")
            return ""
        say(f"  FAIL  {tool:26s} {took:6.2f}s  {text[:300]}")
        return text[:300]
    why = check(res.structured_content or {})
    summary = json.dumps(res.structured_content)[:90]
    say(f"  {'ok  ' if not why else 'FAIL'}  {tool:26s} {took:6.2f}s  {why or summary}")
    return why


__all__ = ["run_self_test"]
