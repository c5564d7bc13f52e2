"""Which harnesslab modules one run_objective call from servers/ passes through: prints one table.

    python benchmarks/trace_objective.py [--verify] [--list]

Runs the task server's run_objective handler (`servers/task_tools._run_objective`) in process,
on the local executor and the Triton interpreter (one small dev case of rmsnorm_gate, a fresh
workspace and state dir), under `sys.setprofile`, and counts over the harnesslab frames only
(the runner is another process: not traced):
- stays: calls that enter a harnesslab module from another one (the nearest harnesslab frame
  below it is another module's; a coroutine resumed is not a call), the first one included;
- modules: distinct harnesslab modules entered;
- climbs back up: stays in a module that is already on the stack below (a callback, or a
  callee calling back into its caller's module);
- per module: its stays and climbs, to see where the call goes back and forth.
`--verify` traces `integrity/verify.guarded_verify` instead (the sandbox must be available) and
also names the stays in evaluation/objective.py (the verify's plumbing detours).
No GPU needed; the runner's own work dominates the wall time (~10-30 s on two cores).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import anyio

PREFIX = "harnesslab."
SMALL = "1024x1024_fp16"


GENERATOR_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class Trace:
    """The module-level path of one call: a profiler keeps the stack of Python frames (each
    frame's harnesslab module, or None) and counts a crossing whenever a fresh call (not a
    coroutine or generator resumed) enters a harnesslab module other than its nearest
    harnesslab caller's."""

    def __init__(self) -> None:
        self.stack: list[str | None] = []
        self.crossings: list[tuple[str, bool]] = []  # (module entered, already on the stack)
        self._started: list[FrameType] = []  # generator frames seen (kept: ids stay unique)
        self._started_ids: set[int] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "return":
            if self.stack:
                self.stack.pop()
            return
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        module = name.removeprefix(PREFIX) if name.startswith(PREFIX) else None
        if module is not None and module.startswith("tests"):
            module = None
        resumed = False
        if frame.f_code.co_flags & GENERATOR_FLAGS:
            resumed = id(frame) in self._started_ids
            if not resumed:
                self._started.append(frame)
                self._started_ids.add(id(frame))
        caller = next((m for m in reversed(self.stack) if m is not None), None)
        if module is not None and not resumed and module != caller:
            self.crossings.append((module, module in self.stack))
        self.stack.append(module)


def traced(coro_fn: Any, cleanup: Any) -> tuple[Any, Trace]:
    """Run `coro_fn()` under anyio with a Trace as the profiler (main thread only), then
    `cleanup()` in the same event loop, untraced."""
    trace = Trace()

    async def main() -> Any:
        sys.setprofile(trace)
        try:
            return await coro_fn()
        finally:
            sys.setprofile(None)
            await cleanup()

    return anyio.run(main), trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verify", action="store_true", help="trace guarded_verify instead")
    ap.add_argument("--list", action="store_true", help="print every stay in order")
    args = ap.parse_args()

    from harnesslab.servers.runtime import ServerState
    from harnesslab.servers.task_models import ObjectiveIn
    from harnesslab.servers.task_tools import _run_objective
    from harnesslab.tools.integrity.verify import guarded_verify
    from harnesslab.tools.settings import Settings
    from harnesslab.tools.state.workspace import init_workspace

    with tempfile.TemporaryDirectory(prefix="hl-trace-") as tmp:
        settings = Settings(state_dir=Path(tmp) / "state")
        ws_root = Path(tmp) / "ws"
        init_workspace("rmsnorm_gate", ws_root, settings)
        state = ServerState.open(ws_root, settings)

        async def call() -> Any:
            if args.verify:
                return await guarded_verify(state.workspace, state.launcher, settings)
            return await _run_objective(state, ObjectiveIn(cases=[SMALL]), None)

        result, trace = traced(call, state.aclose)
    status = getattr(result, "verdict", None) or getattr(result, "status", "?")
    per_module = Counter(m for m, _ in trace.crossings)
    climbs = [m for m, up in trace.crossings if up]
    what = "guarded_verify" if args.verify else "run_objective (servers/task_tools)"
    print(f"{what}: {status}")
    print(f"modules {len(per_module)}  stays {len(trace.crossings)}  climbs back up {len(climbs)}")
    if args.verify:
        print(f"stays in evaluation.objective: {per_module.get('tools.evaluation.objective', 0)}")
    print("  stays  climbs  module")
    for m, n in sorted(per_module.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:5d}  {climbs.count(m):6d}  {m}")
    if args.list:
        print(" -> ".join(m + ("^" if up else "") for m, up in trace.crossings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
