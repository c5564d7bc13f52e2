"""One timing run per GPU, whoever starts it: a lock file per (host, GPU) on the executor's host.

Side of the trust boundary: trusted (the lock files live in the state dir, or under the GPU
host's remote_root).

The launcher's slot lock serialises calls inside one process; this lock serialises processes:
two servers on one workspace, a server and a CLI `verify`, two users' loops on one GPU host.
- Local executor: `flock` on `<state_dir>/gpu-locks/<host>-gpu<N>.lock`, taken in this process.
- Executors that run elsewhere (SSH): a small lock-holder process per GPU, started on the GPU
  host over the executor's own connections (`Executor.start`) and kept while the executor
  lives; it takes and releases the flock there on request (one round trip each) and exits when
  its connection drops (the kernel releases a dead holder's flock, so a crashed server never
  leaves a GPU locked). A caller cancelled while waiting kills its holder, so it cannot take
  the lock later.
- Executors whose GPUs a scheduler reserves for them (`gpus_reserved`: a Slurm allocation): no
  lock file; Slurm keeps other jobs off those GPUs, and the slot lock serialises this process.
The holder writes its pid into the file, so a waiter can say "waiting for GPU 0 (held by pid N)".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio

from ..errors import ExecutorError
from ..settings import Settings
from .executor import Executor, InteractiveProcess, OnWait

log = logging.getLogger(__name__)

POLL_S = (0.01, 0.25)  # first and longest wait between tries of a busy local lock

# Runs on the GPU host with only the standard library; argv[1] = lock file. One per (executor,
# GPU), kept for the executor's life: each "acquire" line takes the flock, through its gate as
# every exclusive taker does (tools/gpu/verify/phase_lock.py), printing {"busy": pid} first while
# another process holds either, answers {"locked": pid}; "release" lets go and answers
# {"released": 1}. At EOF (its connection closed) it exits, and the kernel drops its flock.
HOLDER = r"""
import fcntl, json, os, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
gate = os.open(path + ".gate", os.O_RDWR | os.O_CREAT, 0o600)
def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    if line.strip() == "acquire":
        told = False
        for target in (gate, fd):
            try:
                fcntl.flock(target, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not told:
                    say({"busy": os.pread(fd, 32, 0).decode(errors="replace").strip()})
                    told = True
                fcntl.flock(target, fcntl.LOCK_EX)
        fcntl.flock(gate, fcntl.LOCK_UN)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        say({"locked": os.getpid()})
    elif line.strip() == "release":
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        say({"released": 1})
"""
# The holders this process keeps, per executor and GPU (a slot's calls are already serialised
# by the launcher's in-process slot lock, so one holder serves each slot).
_holders: weakref.WeakKeyDictionary[Executor, dict[int, InteractiveProcess]] = (
    weakref.WeakKeyDictionary()
)


def held_channels(executor: Executor) -> int:
    """Connections' channels this module's holders occupy on `executor` (for capacity sums)."""
    return len(_holders.get(executor, {}))


def _message(gpu_index: int, holder: str) -> str:
    who = f"pid {holder}" if holder.isdigit() else "another process"
    return f"waiting for GPU {gpu_index} (held by {who})"


async def _notify(on_wait: OnWait | None, message: str) -> None:
    log.info(message)
    if on_wait is not None:
        maybe = on_wait(message)
        if maybe is not None:
            await maybe


def lock_path(settings: Settings, host: str, gpu_index: int) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in host) or "local"
    return settings.state_dir / "gpu-locks" / f"{safe}-gpu{gpu_index}.lock"


def lock_file(executor: Executor, gpu_index: int, settings: Settings) -> str | None:
    """The lock file of `gpu_index` as a process on `executor`'s host opens it (the guarded
    verify holds it there phase by phase: tools/gpu/verify/phase_lock.py); None where a scheduler
    reserves the GPU and no lock file is used."""
    if executor.gpus_reserved:
        return None
    if executor.on_this_machine:
        return str(lock_path(settings, executor.host, gpu_index))
    return _remote_file(executor, gpu_index)


def _remote_file(executor: Executor, gpu_index: int) -> str:
    return executor.path("gpu-locks", f"gpu{gpu_index}.lock")


@contextlib.asynccontextmanager
async def _local(path: Path, gpu_index: int, on_wait: OnWait | None) -> AsyncIterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    gate = os.open(f"{path}.gate", flags, 0o600)  # writers first (tools/gpu/verify/phase_lock.py)
    try:
        told, pause = False, POLL_S[0]
        for target in (gate, fd):
            while True:
                try:
                    fcntl.flock(target, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                        await _notify(on_wait, _message(gpu_index, holder))
                        told = True
                    # Polled, not a blocking flock in a thread: a cancelled waiter must not go
                    # on to take the lock after its caller has gone.
                    await anyio.sleep(pause)
                    pause = min(pause * 2, POLL_S[1])
        fcntl.flock(gate, fcntl.LOCK_UN)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(gate)
        os.close(fd)


async def _ask(
    holder: InteractiveProcess,
    line: str,
    want: str,
    on_busy: Callable[[str], Awaitable[None]] | None = None,
) -> bool:
    """Send `line`; True once the holder answers `want` (False: it died)."""
    await holder.send_line(line)
    while True:
        reply = await holder.receive_line()
        if reply is None:
            return False
        try:
            msg = json.loads(reply)
        except json.JSONDecodeError:
            continue
        if "busy" in msg and on_busy is not None:
            await on_busy(str(msg["busy"]))
        if want in msg:
            return True


async def _drop(executor: Executor, gpu_index: int) -> None:
    """Forget and kill the holder of `gpu_index` (its death releases its flock)."""
    dead = _holders.get(executor, {}).pop(gpu_index, None)
    if dead is not None:
        with anyio.CancelScope(shield=True):
            await dead.kill()


async def _acquire(
    executor: Executor, python: str, gpu_index: int, on_wait: OnWait | None
) -> InteractiveProcess | None:
    """The holder of `gpu_index`, holding the lock (None: the backend cannot start one)."""
    holders = _holders.setdefault(executor, {})

    async def busy(pid: str) -> None:
        await _notify(on_wait, _message(gpu_index, pid))

    for _ in range(2):  # a holder whose connection dropped is replaced once
        holder = holders.get(gpu_index)
        if holder is None:
            path = _remote_file(executor, gpu_index)
            try:
                holder = await executor.start([python, "-c", HOLDER, path])
            except NotImplementedError:
                log.warning("%s cannot hold a cross-process GPU lock", executor.host)
                return None
            holders[gpu_index] = holder
        try:
            if await _ask(holder, "acquire", "locked", busy):
                return holder
        except ExecutorError:  # its channel is gone (the connection dropped): replace it
            pass
        except BaseException:  # cancelled while waiting: it must not take the lock later
            await _drop(executor, gpu_index)
            raise
        await _drop(executor, gpu_index)
    raise ExecutorError(
        f"{executor.host}: the GPU lock holder for GPU {gpu_index} died.",
        kind="remote_env",
        next_step=f"check that {python} runs on {executor.host}",
    )


@contextlib.asynccontextmanager
async def _remote(
    executor: Executor, python: str, gpu_index: int, on_wait: OnWait | None
) -> AsyncIterator[None]:
    holder = await _acquire(executor, python, gpu_index, on_wait)
    try:
        yield
    finally:
        released = False
        if holder is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                try:
                    released = await _ask(holder, "release", "released")
                except ExecutorError:
                    pass
            if not released:
                await _drop(executor, gpu_index)


@contextlib.asynccontextmanager
async def hold_gpu(
    executor: Executor, gpu_index: int, settings: Settings, *, on_wait: OnWait | None = None
) -> AsyncIterator[None]:
    """Hold GPU `gpu_index` of `executor`'s host against every other process that takes this
    lock; `on_wait` hears once why it waits."""
    if executor.gpus_reserved:  # the scheduler keeps other jobs off it (a Slurm allocation)
        yield
    elif executor.on_this_machine:
        async with _local(lock_path(settings, executor.host, gpu_index), gpu_index, on_wait):
            yield
    else:
        async with _remote(executor, executor.python(settings), gpu_index, on_wait):
            yield


__all__ = ["HOLDER", "OnWait", "held_channels", "hold_gpu", "lock_file", "lock_path"]
