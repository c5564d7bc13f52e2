"""A slot's warm worker: reused, replaced when stale or gone, and what its death means.

Side of the trust boundary: trusted (host). The worker itself is a sandboxed runner that imports
candidates (Launcher.start_worker); this module decides only which faults are the machinery's.
A worker whose connection or allocation went away raises that fault (tools/errors.py:
infrastructure, retryable) and takes every other worker of its executor with it; a request that
never reached a worker (it was gone already, or its transport was lost while it started) is sent
once more to a fresh one. A worker that died under a request of its own accord (a signal of its
own, an exit) is the candidate's crash: the caller records it, with the exit status.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

from ..errors import ExecutorError
from ..task import TaskSpec
from .executor import Executor
from .slot import Slot, Worker

log = logging.getLogger(__name__)

# Faults that take every process the executor holds with them (the connection they ran over,
# the allocation they ran in): the launcher forgets all of that executor's warm workers.
TRANSPORT_LOST = ("dropped", "allocation_lost", "node_failure", "preempted")
# Faults after which a request that never reached a worker is sent once more, to a fresh one.
RETRY_FRESH = (*TRANSPORT_LOST, "crashed")

LineIn = Callable[[str], Awaitable[None]]


class Served(NamedTuple):
    """What serving one request on a warm worker came to: a result (`done`), a timeout, or the
    exit status of a worker that died (128+N for a signal)."""

    done: bool
    timed_out: bool
    exit_code: int | None


class Forgets(Protocol):
    async def forget(self, executor: Executor) -> None: ...


class WorkerHost(Protocol):
    """What a warm worker needs of the launcher (launcher.Launcher is the one): its slots, a
    worker started, checked and served, and its compile pool's workers forgotten."""

    @property
    def slots(self) -> list[Slot]: ...

    @property
    def compile_pool(self) -> Forgets: ...

    def worker_stale(self, worker: Worker, task: TaskSpec, scope: str = "candidates") -> bool: ...

    async def start_worker(
        self, slot: Slot, mode: str, task: TaskSpec, env: dict[str, str], timeout_s: float,
        log: str, scope: str = "candidates",
    ) -> Worker: ...  # fmt: skip

    async def serve(
        self, worker: Worker, req: dict[str, Any], timeout_s: float, line_in: LineIn
    ) -> Served: ...


async def call_worker(
    launcher: WorkerHost,
    slot: Slot,
    req: dict[str, Any],
    env: dict[str, str],
    timeout_s: float,
    line_in: LineIn,
    task: TaskSpec,
    scope: str = "candidates",
    tokens: list[str] | None = None,
) -> tuple[bool, str, int | None] | None:
    """Serve one request on the slot's warm worker (a sandboxed runner reading `scope`'s staged
    candidates). Returns (timed_out, stderr_tail, exit status of a worker that died), or None
    when the backend cannot keep a worker. A crash, timeout or cancel kills the worker; the next
    call starts a new one. Infrastructure faults raise (see the module docstring). `tokens` gets
    the token of the worker's sandbox (its exit report names a limit it hit)."""
    for attempt in range(2):
        try:
            worker = await ready_worker(launcher, slot, env, timeout_s, task, scope)
            if worker is None:
                return None
            if tokens is not None and worker.token not in tokens:
                tokens.append(worker.token)
            served = await launcher.serve(worker, req, timeout_s, line_in)
        except ExecutorError as exc:
            slot.worker = None
            if exc.kind in TRANSPORT_LOST:
                await forget_workers(launcher, slot.executor)
            never_started = not exc.started or exc.kind == "crashed"
            if attempt or not never_started or exc.kind not in RETRY_FRESH:
                raise
            log.info("%s: %s; sending the request again to a new worker", slot.label, exc)
            await slot.executor.connect()  # a new connection or allocation where needed
            continue
        except BaseException:
            slot.worker = None
            raise
        if not served.done:
            slot.worker = None
            why = "worker timed out and was killed" if served.timed_out else "worker died"
            return (served.timed_out, why, served.exit_code)
        return (False, "", None)
    raise AssertionError("unreachable")  # pragma: no cover


async def ready_worker(
    launcher: WorkerHost,
    slot: Slot,
    env: dict[str, str],
    timeout_s: float,
    task: TaskSpec,
    scope: str = "candidates",
) -> Worker | None:
    """The slot's warm worker, replaced first when stale or gone, started when missing; None
    when the backend keeps no interactive processes. A start that failed raises with
    started=False: no request was sent."""
    worker = slot.worker
    if worker is not None and launcher.worker_stale(worker, task, scope):
        await worker.proc.kill()
        slot.worker = worker = None
    if worker is None:
        try:
            worker = await launcher.start_worker(
                slot, "evaluate", task, env, timeout_s, f"worker-gpu{slot.gpu_index}.log", scope
            )
        except NotImplementedError:
            slot.warm_supported = False
            return None
        except ExecutorError as exc:
            exc.started = False
            raise
        slot.worker = worker
    return worker


async def forget_workers(launcher: WorkerHost, executor: Executor) -> None:
    """Kill (and so reap) every warm worker on `executor`, timing and compile workers alike:
    its connection or allocation was lost, so none of them can serve again."""
    for slot in launcher.slots:
        if slot.executor is executor and slot.worker is not None:
            worker, slot.worker = slot.worker, None
            await worker.proc.kill()
    await launcher.compile_pool.forget(executor)


__all__ = ["RETRY_FRESH", "TRANSPORT_LOST", "Served", "WorkerHost", "call_worker", "forget_workers"]
