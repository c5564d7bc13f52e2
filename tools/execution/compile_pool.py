"""Warm compile workers for sweeps: the launcher's warm runner workers, several per host, kept
between sweeps, so a sweep pays Triton compile time rather than a Python start-up (~3-4 s of
torch and triton imports on an H100 host) per process.

Trusted side (host). Each worker is `runner.py --worker` started inside the sandbox exactly as
the launcher starts its timing worker (Launcher.start_worker): it imports agent code. Workers
take configs one at a time from a shared queue (one `compile_only` sweep request per config:
correctness checked, nothing timed, no GPU lock), so a slow config never holds back the rest
and a worker that dies costs one config, retried once on a fresh worker. Timing stays in the
slot's warm worker, under the GPU lock: each entry goes to the caller as it lands (`on_entry`),
so the sweep times the configs that passed while the rest compile (evaluation/sweep_pipeline.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio

from ..errors import ExecutorError, first_fault, killed_from_outside, signal_name, signal_of
from ..gpu import wire
from ..gpu.isolation.sandbox_policy import exit_report, limit_hit
from ..settings import Settings
from ..task import TaskSpec
from .executor import Executor
from .runner_policy import candidates_of
from .slot import Slot, Worker
from .staging import Stage
from .warm import WorkerHost, forget_workers

MAX_WORKERS = 16
LOG = "compile-{i}.log"  # the workers' stderr, under the stage folder on the host
# What compile() tells its caller as each config's entry lands: (the config's index, its entry).
OnEntry = Callable[[int, dict[str, Any]], Awaitable[None]]


class PoolHost(WorkerHost, Protocol):
    """What the compile pool needs of the launcher (launcher.Launcher is the one) beyond what a
    warm worker does: its settings, stage and executors, the host's cores and free channels, and
    a request prepared for a slot."""

    @property
    def settings(self) -> Settings: ...

    @property
    def staging(self) -> Stage: ...

    @property
    def executors(self) -> list[Executor]: ...

    def host_cpus(self) -> int: ...

    def parallel_capacity(self) -> int | None: ...

    def prepare(
        self, slot: Slot, request: dict[str, Any], task: TaskSpec
    ) -> tuple[dict[str, Any], dict[str, str]]: ...


class CompilePool:
    """Warm compile workers of one launcher; `compile()` sizes the pool and uses it."""

    def __init__(self, launcher: PoolHost) -> None:
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
            self.workers[i] = worker
        return worker

    async def _one(
        self, i: int, request: dict[str, Any], config: dict[str, Any], task: TaskSpec,
        timeout_s: float,
    ) -> tuple[dict[str, Any] | None, int | None]:  # fmt: skip
        """One config on worker i: its entry, or None when the worker died or never started,
        with the exit status of a worker that died (128+N for a signal)."""
        worker = await self._worker(i, task, timeout_s, candidates_of(request)[1])
        if worker is None:
            return None, None
        req, _ = self.launcher.prepare(
            self.slot_of(i), {**request, "configs": [config], "compile_only": True}, task
        )
        result: list[dict[str, Any]] = []
        limit: list[str] = []

        async def line_in(line: str) -> None:
            if line.startswith('{"event": "result"'):
                obj = wire.json_object(line)  # the worker imports the candidate: hostile
                if obj is not None:
                    result.append(obj)
            elif (end := exit_report(line, worker.token)) is not None:
                limit.append(limit_hit(end))

        try:
            served = await self.launcher.serve(worker, req, timeout_s, line_in)
        except ExecutorError as exc:
            self.workers.pop(i, None)
            if exc.started:  # its connection or allocation was lost under it: not the config's
                await forget_workers(self.launcher, self.slot_of(i).executor)
                raise
            return None, None  # it was gone before the request reached it (serve killed it)
        if not served.done:
            self.workers.pop(i, None)
            if limit and limit[0]:
                return failed(config, "error", f"resource_limit: {limit[0]} (the compile worker "
                              "hit its sandbox's limit)"), None  # fmt: skip
            if served.timed_out:
                return failed(config, "timeout", f"compile took over {timeout_s:.0f}s"), None
            return None, served.exit_code
        entries = (result[0] if result else {}).get("configs") or []
        if not entries:  # the runner answered with an error instead of a sweep
            reason = (result[0] if result else {}).get("reason", "no result")
            return failed(config, "error", f"compile worker: {reason}"), None
        return entries[0], None

    async def compile(
        self,
        request: dict[str, Any],
        configs: list[dict[str, Any]],
        *,
        task: TaskSpec,
        workers: int | None = None,
        timeout_s: float | None = None,
        on_entry: OnEntry | None = None,
    ) -> list[dict[str, Any]] | None:
        """Compile (and check) every config on the pool; one runner sweep entry per config, in
        order. None when the backend cannot keep workers (the caller compiles another way).
        `on_entry(index, entry)` as each config's entry lands, in the order they finish (the
        sweep times a config while the others still compile); what it raises ends compile()."""
        launcher = self.launcher
        timeout_s = timeout_s or launcher.settings.eval_timeout_s
        for slot in {id(s.executor): s for s in launcher.slots}.values():
            await slot.executor.connect()
        size = self.size_for(len(configs), workers)
        for i in [i for i in self.workers if i >= size]:  # a smaller sweep: fewer workers
            await self.workers.pop(i).proc.kill()
        await launcher.staging.publish(task, launcher.executors)
        entries: list[dict[str, Any] | None] = [None] * len(configs)
        queue = list(range(len(configs)))

        async def drain(i: int) -> None:
            while queue:
                k = queue.pop(0)
                entry, _ = await self._one(i, request, configs[k], task, timeout_s)
                if entry is None and not self.unsupported:  # the worker died: once more, fresh
                    entry, code = await self._one(i, request, configs[k], task, timeout_s)
                    if entry is None:
                        host = self.slot_of(i).executor.host
                        fault = killed_from_outside(code, what="a compile worker", host=host)
                        if fault is not None:  # twice: the host, not this config
                            raise fault
                        sig = signal_of(code)
                        how = f"killed by {signal_name(sig)}" if sig else f"exit {code}"
                        entry = failed(
                            configs[k], "error", f"compile worker died twice on this config ({how})"
                        )
                entries[k] = entry
                if self.unsupported:
                    return
                if entry is not None and on_entry is not None:
                    await on_entry(k, entry)

        try:
            async with anyio.create_task_group() as tg:
                for i in range(size):
                    tg.start_soon(drain, i)
        except BaseExceptionGroup as group:  # a named fault, not a group, reaches the caller
            fault = first_fault(group)
            if fault is group:
                raise
            raise fault from None
        if self.unsupported:
            return None
        return [
            e or failed(c, "error", "not compiled") for e, c in zip(entries, configs, strict=True)
        ]

    async def forget(self, executor: Executor) -> None:
        """Kill the workers on `executor` (its connection or allocation was lost)."""
        for i in [i for i in self.workers if self.slot_of(i).executor is executor]:
            await self.workers.pop(i).proc.kill()

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
