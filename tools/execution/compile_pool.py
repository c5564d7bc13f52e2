"""Warm compile workers for sweeps: the launcher's warm runner workers, several per host, kept
between sweeps, so a sweep pays Triton compile time rather than a Python start-up (~3-4 s of
torch and triton imports on an H100 host) per process.

Trusted side (host). Each worker is `runner.py --worker` started inside the sandbox exactly as
the launcher starts its timing worker (Launcher.start_worker): it imports agent code. Workers
take configs one at a time from a shared queue (one `compile_only` sweep request per config:
correctness checked, nothing timed, no GPU lock), so a slow config never holds back the rest
and a worker that dies costs one config, retried once on a fresh worker. Timing stays in the
slot's warm worker, under the GPU lock (evaluation/sweep.py, phase 2).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import ExecutorError
from ..gpu.sandbox_policy import exit_report, limit_hit
from ..task.spec import TaskSpec

if TYPE_CHECKING:
    from .launcher import Launcher, Slot, Worker

# Folders of the stage that only the GPU host writes (sandbox scratch, Triton caches): the
# stage's sync (here and in the launcher) neither sends nor lists them.
HOST_WRITTEN = ("scratch", "tcache")

MAX_WORKERS = 16
LOG = "compile-{i}.log"  # the workers' stderr, under the stage folder on the host


class CompilePool:
    """Warm compile workers of one launcher; `compile()` sizes the pool and uses it."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.workers: dict[int, Worker] = {}  # index -> worker; worker i runs on slots[i % n]
        self.started = 0  # workers ever started (tests and the benchmark read it)
        self.unsupported = False  # the backend keeps no interactive processes

    def size_for(self, configs: int, requested: int | None = None) -> int:
        """Workers for a sweep of `configs`: the GPU host's cores (the runner's `cpu_count`),
        at most MAX_WORKERS, within the channels the executors allow (this pool's own workers
        count as available: they are what the channels are for)."""
        if requested:
            return max(1, min(requested, configs))
        launcher = self.launcher
        bound = min(configs, launcher.host_cpus(), MAX_WORKERS)
        capacity = launcher.parallel_capacity()
        if capacity is not None:
            timing = 0 if all(s.worker is not None for s in launcher.slots) else 1
            bound = min(bound, capacity + len(self.workers) - timing)
        return max(1, bound)

    def slot_of(self, i: int) -> Slot:
        slots = self.launcher.slots
        return slots[i % len(slots)]

    async def _worker(self, i: int, task: TaskSpec, timeout_s: float, scope: str) -> Worker | None:
        worker = self.workers.get(i)
        if worker is not None and self.launcher.worker_stale(worker, task, scope):
            await worker.proc.kill()
            self.workers.pop(i, None)
            worker = None
        if worker is None:
            slot = self.slot_of(i)
            _, env = self.launcher.prepare(slot, {}, task)
            try:
                worker = await self.launcher.start_worker(
                    slot, "sweep", task, env, timeout_s, LOG.format(i=i), scope
                )
            except NotImplementedError:
                self.unsupported = True
                return None
            self.started += 1
            if worker is not None:
                self.workers[i] = worker
        return worker

    async def _one(
        self, i: int, request: dict[str, Any], config: dict[str, Any], task: TaskSpec,
        timeout_s: float,
    ) -> dict[str, Any] | None:  # fmt: skip
        """One config on worker i: its entry, or None when the worker died or never started."""
        worker = await self._worker(i, task, timeout_s, self.launcher.candidates_of(request)[1])
        if worker is None:
            return None
        req, _ = self.launcher.prepare(
            self.slot_of(i), {**request, "configs": [config], "compile_only": True}, task
        )
        result: list[dict[str, Any]] = []
        limit: list[str] = []

        async def line_in(line: str) -> None:
            if line.startswith('{"event": "result"'):
                try:
                    result.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
            elif (end := exit_report(line, worker.token)) is not None:
                limit.append(limit_hit(end))

        try:
            done, timed_out = await self.launcher.serve(worker, req, timeout_s, line_in)
        except ExecutorError:  # it died before the request reached it (serve killed it)
            done, timed_out = False, False
        if not done:
            self.workers.pop(i, None)
            if limit and limit[0]:
                return failed(config, "error", f"resource_limit: {limit[0]} (the compile worker "
                              "hit its sandbox's limit)")  # fmt: skip
            if timed_out:
                return failed(config, "timeout", f"compile took over {timeout_s:.0f}s")
            return None
        entries = (result[0] if result else {}).get("configs") or []
        if not entries:  # the runner answered with an error instead of a sweep
            reason = (result[0] if result else {}).get("reason", "no result")
            return failed(config, "error", f"compile worker: {reason}")
        return entries[0]

    async def compile(
        self,
        request: dict[str, Any],
        configs: list[dict[str, Any]],
        *,
        task: TaskSpec,
        workers: int | None = None,
        timeout_s: float | None = None,
        progress: Callable[[float, float, str], Awaitable[None] | None] | None = None,
    ) -> list[dict[str, Any]] | None:
        """Compile (and check) every config on the pool; one runner sweep entry per config, in
        order. None when the backend cannot keep workers (the caller compiles another way).
        `progress(done, total, message)` after each config."""
        launcher = self.launcher
        timeout_s = timeout_s or launcher.settings.eval_timeout_s
        for slot in {id(s.executor): s for s in launcher.slots}.values():
            await slot.executor.connect()
        launcher._stage_common(task)
        size = self.size_for(len(configs), workers)
        for i in [i for i in self.workers if i >= size]:  # a smaller sweep: fewer workers
            await self.workers.pop(i).proc.kill()
        async with launcher._sync_locks[id(launcher.slots[0].executor)]:
            for ex in launcher.executors:
                await ex.sync_tree(launcher.stage, ex.path("stage"), skip=HOST_WRITTEN)
        entries: list[dict[str, Any] | None] = [None] * len(configs)
        queue = list(range(len(configs)))

        async def drain(i: int) -> None:
            while queue:
                k = queue.pop(0)
                entry = await self._one(i, request, configs[k], task, timeout_s)
                if entry is None and not self.unsupported:  # the worker died: once more, fresh
                    entry = await self._one(i, request, configs[k], task, timeout_s)
                    entry = entry or failed(
                        configs[k], "error", "compile worker died twice on this config"
                    )
                entries[k] = entry
                if self.unsupported:
                    return
                if progress is not None and entry is not None:
                    done = sum(e is not None for e in entries)
                    maybe = progress(done, len(configs), f"compiled config {k}: {entry['status']}")
                    if maybe is not None:
                        await maybe

        async with anyio.create_task_group() as tg:
            for i in range(size):
                tg.start_soon(drain, i)
        if self.unsupported:
            return None
        return [
            e or failed(c, "error", "not compiled") for e, c in zip(entries, configs, strict=True)
        ]

    async def aclose(self) -> None:
        for worker in self.workers.values():
            await worker.proc.kill()
        self.workers.clear()


def failed(config: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    """A sweep entry for a config the pool could not compile (sweep.classify reads it)."""
    return {
        "config": config,
        "status": "failed",
        "score_us": None,
        "reason": reason,
        "cases": [{"status": status, "reason": reason}],
    }


__all__ = ["CompilePool"]
