"""A sweep's compiles and timing, overlapped (evaluation/sweep.py is its caller).

Configs compile (and are checked) on the launcher's warm compile workers
(execution/compile_pool.py, no GPU lock) and, as each one passes, wait for a timing runner: a
slot's warm worker, under the GPU lock. Whenever a slot's runner is idle and passed configs are
waiting, it takes them all in one request (dealt over every idle slot when there are several),
so the timing does not wait for the slowest compile and the batches grow while the compiles
outrun the timing. Measured on an H100 (32 Triton configs, 16 cold compile workers), the
phases one after the other took 24.9 s + 13.2 s. A config that fails to compile is never timed;
it keeps the compile pool's entry. Without the compile pool (a step task, the interpreter
unless compile workers are asked for, a single config) every config is ready at once and is
dealt over the slots in one request each, as before the overlap. The pool's checks run each
config's dev cases once on the GPU without its lock, so they now run beside the timing of the
configs before it (as another sweep's compiles always could).

One task group holds both halves; the timing half reads one memory object stream ("ready"
configs from the compile half, "idle" slots from its own requests, "done" once every config
compiled). An error in either half cancels the other (the compile workers and the timing
runner it was serving are killed by the launcher, as for any cancelled call) and reaches the
caller as the named fault, not a group; so does the client cancelling the sweep.

Side of the trust boundary: trusted (host); the runners' events (they share stdout with the
candidate) are progress text only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..errors import first_fault
from ..execution import Launcher, RunnerCall
from ..execution.disk import stage_full
from ..progress import Progress, report
from ..task import TaskSpec

Batch = list[dict[str, Any]]
Note = tuple[str, Any]  # ("ready", configs) | ("idle", slot index) | ("done", None)
OnEvent = Callable[[dict[str, Any]], Awaitable[None]]


def config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


class Tally:
    """The sweep's one progress count. MCP requires progress that only grows and keeps its
    total: with compiles, each config is two steps (compiled, then timed; a config that failed
    to compile takes both at once), otherwise one (timed). Every step is counted under one lock,
    so steps from the two halves reach `progress` in order."""

    def __init__(self, progress: Progress | None, configs: int, *, compiling: bool) -> None:
        self.progress = progress
        self.total = configs * (2 if compiling else 1)
        self.configs = configs
        self.done = 0
        self.compiled = 0
        self.timed = 0
        self.lock = anyio.Lock()

    async def step(self, steps: int, message: str) -> None:
        async with self.lock:
            self.done = min(self.done + steps, self.total)
            await report(self.progress, self.done, self.total, message)

    async def landed(self, index: int, status: str) -> None:
        """Config `index` compiled (status "passed") or failed to."""
        self.compiled += 1
        said = f"compiled {self.compiled} of {self.configs} configs (config {index + 1}: {status})"
        await self.step(1 if status == "passed" else 2, said)

    def timing(self, batch: Batch) -> tuple[OnEvent, Callable[[], Awaitable[None]]]:
        """(on_event for the runner timing `batch`, the step that closes the batch): one step
        per config the runner says it timed, never more than the batch holds; the close counts
        the rest (a runner that died under them: salvage's entries)."""
        seen = [0]

        async def on_event(ev: dict[str, Any]) -> None:
            kind = ev.get("event")
            if kind == "waiting":  # for the GPU, for an allocation: why nothing moves
                await self.step(0, str(ev.get("message")))
            elif kind == "config" and seen[0] < len(batch):
                seen[0] += 1
                self.timed += 1
                await self.step(1, f"timed {self.timed} configs (the last: {ev.get('status', '')})")

        async def close() -> None:
            rest = len(batch) - seen[0]
            seen[0] = len(batch)
            self.timed += rest
            if rest:
                await self.step(rest, f"timed {self.timed} configs")

        return on_event, close


class Pipeline:
    """Compile `configs` on the pool (when `compiling`) and time those that passed, overlapped.
    After run(): `compiled` (config key -> the pool's entry), `timed` (each request's configs
    and its runner call), and the clocks (anyio.current_time() values, None when never)."""

    def __init__(
        self,
        launcher: Launcher,
        request: dict[str, Any],
        task: TaskSpec,
        configs: Batch,
        *,
        compiling: bool,
        workers: int | None,
        timeout_s: Callable[[Batch], float],
        progress: Progress | None,
    ) -> None:
        self.launcher = launcher
        self.request = request
        self.task = task
        self.configs = configs
        self.compiling = compiling
        self.workers = workers
        self.timeout_s = timeout_s  # a batch's timing request's limit
        self.tally = Tally(progress, len(configs), compiling=compiling)
        self.compiled: dict[str, dict[str, Any]] = {}
        self.timed: list[tuple[Batch, RunnerCall]] = []
        self.started = anyio.current_time()
        self.compile_end: float | None = None
        self.first_request: float | None = None
        self.last_result: float | None = None

    async def run(self) -> None:
        send, receive = anyio.create_memory_object_stream[Note](math.inf)
        try:
            async with send, receive, anyio.create_task_group() as tg:
                tg.start_soon(self._compile, send)
                await self._deal(receive, send, tg)
        except BaseExceptionGroup as group:  # a lost connection, a full disk: the fault
            fault = first_fault(group)
            if fault is group:
                raise
            raise fault from None

    # -- the compile half ---------------------------------------------------------------------
    async def _compile(self, send: MemoryObjectSendStream[Note]) -> None:
        if not self.compiling:
            await send.send(("ready", self.configs))
            await send.send(("done", None))
            return
        executor = self.launcher.slots[0].executor

        async def landed(k: int, entry: dict[str, Any]) -> None:
            config = self.configs[k]  # ours: the worker that wrote the entry ran agent code
            self.compiled[config_key(config)] = {**entry, "config": config}
            if entry.get("status") == "passed":
                await send.send(("ready", [config]))
            else:  # failed for want of disk space: the host's fault (measured there)
                full = await stage_full(executor, executor.path("stage"), [json.dumps(entry)])
                if full is not None:
                    raise full
            await self.tally.landed(k, str(entry.get("status")))

        pooled = await self.launcher.compile_pool.compile(
            self.request, self.configs, task=self.task, workers=self.workers, on_entry=landed
        )
        self.compile_end = anyio.current_time()
        if pooled is None:  # the backend keeps no workers: each config compiles as it is timed
            await self.tally.step(len(self.configs), "no compile workers on this backend")
            await send.send(("ready", self.configs))
        await send.send(("done", None))

    # -- the timing half ----------------------------------------------------------------------
    async def _deal(
        self,
        receive: MemoryObjectReceiveStream[Note],
        send: MemoryObjectSendStream[Note],
        tg: TaskGroup,
    ) -> None:
        """Hand the waiting configs to the idle slots until every config is compiled and timed:
        all of them at once, each idle slot its share, the slots that timed fewer requests
        first (then in slot order), so every slot takes work."""
        slots = len(self.launcher.slots)
        idle, waiting, compiling = list(range(slots)), [], True
        requests = [0] * slots
        async for kind, item in receive:
            if kind == "ready":
                waiting += item
            elif kind == "idle":
                idle.append(item)
            else:
                compiling = False
            if waiting and idle:
                idle.sort(key=lambda i: (requests[i], i))
                n = min(len(idle), len(waiting))
                for j, i in enumerate(idle[:n]):
                    requests[i] += 1
                    tg.start_soon(self._time, i, waiting[j::n], send)
                idle, waiting = idle[n:], []
            if not compiling and not waiting and len(idle) == slots:
                return

    async def _time(self, i: int, batch: Batch, send: MemoryObjectSendStream[Note]) -> None:
        """Time `batch` on slot i's runner, then say that slot is idle."""
        if self.first_request is None:
            self.first_request = anyio.current_time()
        slots = self.launcher.slots
        on_event, close = self.tally.timing(batch)
        call = await self.launcher.call(
            {**self.request, "configs": batch},
            task=self.task,
            on_event=on_event,
            timeout_s=self.timeout_s(batch),
            slot=slots[i] if len(slots) > 1 else None,
        )
        self.last_result = anyio.current_time()
        if (killed := call.fault()) is not None:  # killed from outside: the host's, no config's
            raise killed
        self.timed.append((batch, call))
        await close()
        await send.send(("idle", i))

    # -- the clocks -----------------------------------------------------------------------------
    def compile_s(self) -> float:
        """From the start to the last compile's entry (0 without compiles)."""
        return 0.0 if self.compile_end is None else self.compile_end - self.started

    def timing_s(self) -> float:
        """From the first timing request to the last result, waits for compiles included."""
        if self.first_request is None or self.last_result is None:
            return 0.0
        return self.last_result - self.first_request

    def wall_s(self) -> float:
        """From the start to whichever half ended last."""
        ends = [t for t in (self.compile_end, self.last_result) if t is not None]
        return max(ends, default=self.started) - self.started


__all__ = ["Pipeline", "Tally", "config_key"]
