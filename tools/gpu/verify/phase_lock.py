"""The GPU lock as the guarded verify takes it: shared while it works, exclusive while it times.

Side of the trust boundary: trusted (staged; runs in the verify-mode runner, which never imports
agent code). Standard library only.

Every process that times on a GPU takes that GPU's lock file (tools/execution/gpu_lock.py): a
run_objective call holds it exclusively for the whole call. A guarded verify is long (sandboxed
processes, compiles, recordings, every check) and times only in short windows (the copy
bandwidth, each case's timed samples), so the host does not hold the lock around it; the verify
takes the same file itself, shared for each step of GPU work (the inputs, a case's recordings
and checks) and exclusively for its one timed window, after every case has passed its
checks. Several verifies on one GPU then overlap their untimed work and queue only for the
timed windows, and nobody else's work runs on a GPU while one of them times.

Writers go first: an exclusive taker first holds the gate file (`<lock>.gate`) exclusively, and
a shared taker passes the gate (shared) before it takes the lock, so once a timed window is
asked for no new step starts; it waits only for the steps already running. Every exclusive taker
(a run_objective's holder too: gpu_lock.py) uses the gate, and lets go of it once it holds the
lock. Nobody holds the lock while waiting for the gate, so the two files never deadlock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator

WAITING = "waiting for GPU {gpu}: another process is timing on it"


def _open(path: str) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    return os.open(path, flags, 0o600)


class PhaseLock:
    """`path` is the GPU's lock file on this host (None: nothing to take, e.g. a GPU that a
    scheduler reserves); `on_wait(message)` hears, once per wait, that a hold is queued.
    `waited_s` sums the time spent waiting."""

    def __init__(self, path: str | None, gpu: int, on_wait: Callable[[str], None]) -> None:
        self.fd = self.gate = -1
        self.message = WAITING.format(gpu=gpu)
        self.on_wait = on_wait
        self.waited_s = 0.0
        if path:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            self.fd, self.gate = _open(path), _open(path + ".gate")

    def _flock(self, fd: int, mode: int) -> None:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            self.on_wait(self.message)
            t0 = time.perf_counter()
            fcntl.flock(fd, mode)
            self.waited_s += time.perf_counter() - t0

    @contextlib.contextmanager
    def _hold(self, mode: int) -> Iterator[None]:
        if self.fd < 0:
            yield
            return
        self._flock(self.gate, fcntl.LOCK_SH if mode == fcntl.LOCK_SH else fcntl.LOCK_EX)
        try:
            self._flock(self.fd, mode)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def work(self) -> contextlib.AbstractContextManager[None]:
        """One step of untimed GPU work, beside other verifies' steps (no timing meanwhile)."""
        return self._hold(fcntl.LOCK_SH)

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """A timed window: the GPU alone. Never taken inside `work()`."""
        return self._hold(fcntl.LOCK_EX)

    def close(self) -> None:
        for fd in (self.fd, self.gate):
            if fd >= 0:
                os.close(fd)  # drops any hold
        self.fd = self.gate = -1
