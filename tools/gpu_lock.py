"""One timing run per GPU, whoever starts it: a lock file per (host, GPU) on the executor's host.

Side of the trust boundary: trusted (the lock files live in the state dir, or under the GPU
host's remote_root).

The launcher's slot lock serialises calls inside one process; this lock serialises processes:
two servers on one workspace, a server and a CLI `verify`, two users' loops on one GPU host.
- Local executor: `flock` on `<state_dir>/gpu-locks/<host>-gpu<N>.lock`, taken in this process.
- Executors that run elsewhere (SSH): a small lock-holder process started on the GPU host over
  the executor's own connections (`Executor.start`); it takes the flock there and holds it until
  told to let go or until its connection drops (the kernel releases a dead holder's flock, so a
  crashed server never leaves a GPU locked).
The holder writes its pid into the file, so a waiter can say "waiting for GPU 0 (held by pid N)".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio

from .errors import ExecutorError
from .executor import Executor, LocalExecutor
from .settings import Settings

log = logging.getLogger(__name__)

OnWait = Callable[[str], Awaitable[None] | None]
POLL_S = (0.01, 0.25)  # first and longest wait between tries of a busy local lock

# Runs on the GPU host with only the standard library. argv[1] = lock file. Prints
# {"busy": pid} while another process holds it, then {"locked": pid} once held; lets go at EOF
# or on any line on stdin.
HOLDER = r"""
import fcntl, json, os, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print(json.dumps({"busy": os.pread(fd, 32, 0).decode(errors="replace").strip()}), flush=True)
    fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.pwrite(fd, str(os.getpid()).encode(), 0)
print(json.dumps({"locked": os.getpid()}), flush=True)
sys.stdin.readline()
"""


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


@contextlib.asynccontextmanager
async def _local(path: Path, gpu_index: int, on_wait: OnWait | None) -> AsyncIterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        told, pause = False, POLL_S[0]
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                    await _notify(on_wait, _message(gpu_index, holder))
                    told = True
                # Polled, not a blocking flock in a thread: a cancelled waiter must not go on
                # to take the lock after its caller has gone.
                await anyio.sleep(pause)
                pause = min(pause * 2, POLL_S[1])
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.asynccontextmanager
async def _remote(
    executor: Executor, python: str, gpu_index: int, on_wait: OnWait | None
) -> AsyncIterator[None]:
    path = executor.path("gpu-locks", f"gpu{gpu_index}.lock")
    try:
        holder = await executor.start([python, "-c", HOLDER, path])
    except NotImplementedError:
        log.warning("%s cannot hold a cross-process GPU lock; in-process lock only", executor.host)
        yield
        return
    try:
        while True:
            line = await holder.receive_line()
            if line is None:
                raise ExecutorError(
                    f"{executor.host}: the GPU lock holder for GPU {gpu_index} died.",
                    kind="remote_env",
                    next_step=f"check that {python} runs on {executor.host}",
                )
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "busy" in msg:
                await _notify(on_wait, _message(gpu_index, str(msg["busy"])))
            elif "locked" in msg:
                break
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await holder.kill()


@contextlib.asynccontextmanager
async def hold_gpu(
    executor: Executor, gpu_index: int, settings: Settings, *, on_wait: OnWait | None = None
) -> AsyncIterator[None]:
    """Hold GPU `gpu_index` of `executor`'s host against every other process that takes this
    lock; `on_wait` hears once why it waits."""
    if isinstance(executor, LocalExecutor):
        async with _local(lock_path(settings, executor.host, gpu_index), gpu_index, on_wait):
            yield
    else:
        async with _remote(executor, settings.remote_python, gpu_index, on_wait):
            yield


__all__ = ["HOLDER", "OnWait", "hold_gpu", "lock_path"]
