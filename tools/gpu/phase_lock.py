"""The GPU lock as the guarded verify takes it: shared while it works, exclusive while it times.

Side of the trust boundary: trusted (staged; runs in the verify-mode runner, which never imports
agent code). Standard library only.

Every process that times on a GPU takes that GPU's lock file (tools/execution/gpu_lock.py): a
run_objective call holds it exclusively for the whole call. A guarded verify is long (sandboxed
processes, compiles, recordings, every check) and times only in short windows (the copy
bandwidth, each case's timed samples), so the host does not hold the lock around it; the verify
holds the same file itself, shared while it works and exclusive only while it measures. Several
verifies on one GPU then overlap their untimed work and queue only for the timed windows;
nobody else's work runs on that GPU while one of them times, and a run_objective (exclusive for
its whole call) waits for every verify's shared hold, as it always did.

flock converts a hold by releasing it first, so two holders that both ask for the exclusive
hold never deadlock: each lets go of its shared hold and waits its turn.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator

WAITING = "waiting for GPU {gpu}: another process is timing on it"


class PhaseLock:
    """`path` is the GPU's lock file on this host (None: nothing to take, e.g. a GPU that a
    scheduler reserves); `on_wait(message)` hears, once per wait, that a hold is queued."""

    def __init__(self, path: str | None, gpu: int, on_wait: Callable[[str], None]) -> None:
        self.fd: int | None = None
        self.mode = 0  # 0, fcntl.LOCK_SH or fcntl.LOCK_EX
        self.message = WAITING.format(gpu=gpu)
        self.on_wait = on_wait
        if path:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self.fd = os.open(path, flags, 0o600)

    def _take(self, mode: int) -> None:
        if self.fd is None or self.mode == mode:
            return
        try:
            fcntl.flock(self.fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            self.on_wait(self.message)
            fcntl.flock(self.fd, mode)
        self.mode = mode

    def shared(self) -> None:
        """Hold the GPU alongside other verifies' untimed work (no exclusive holder meanwhile)."""
        self._take(fcntl.LOCK_SH)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the GPU alone for a timed window, then go back to the hold held before."""
        before = self.mode
        self._take(fcntl.LOCK_EX)
        try:
            yield
        finally:
            if before:
                self._take(before)
            else:
                self.release()

    def release(self) -> None:
        if self.fd is not None and self.mode:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.mode = 0

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # drops any hold
            self.fd, self.mode = None, 0
