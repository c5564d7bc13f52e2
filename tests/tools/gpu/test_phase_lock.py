"""The guarded verify's GPU lock (tools/gpu/verify/phase_lock.py): shared while it works, exclusive
while it times, and a waiter hears once that it waits."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import flock_free
from harnesslab.tools.gpu.verify.phase_lock import WAITING, PhaseLock


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "gpu-locks" / "local-gpu0.lock"


def test_work_goes_beside_other_work_and_keeps_a_timing_run_out(path: Path) -> None:
    lock = PhaseLock(str(path), 0, lambda _m: None)
    with lock.work():
        assert flock_free(path, fcntl.LOCK_SH)  # another verify's step
        assert not flock_free(path, fcntl.LOCK_EX)  # a timing run
    assert flock_free(path, fcntl.LOCK_EX)  # nothing held between steps
    with lock.exclusive():  # its own timed window: nobody else, not even a step
        assert not flock_free(path, fcntl.LOCK_SH)
    assert flock_free(path, fcntl.LOCK_EX)
    lock.close()


def test_a_timed_window_waits_for_running_steps_and_no_new_step_starts(path: Path) -> None:
    """Writers first: once a timed window is asked for, another verify's next step waits for
    it, so four verifies' steps cannot keep a timing run out for ever."""
    a = PhaseLock(str(path), 3, lambda _m: None)
    heard: list[str] = []
    timer = PhaseLock(str(path), 3, heard.append)
    b = PhaseLock(str(path), 3, lambda _m: None)
    order: list[str] = []
    timing, stepping = threading.Event(), threading.Event()

    def timed() -> None:
        with timer.exclusive():
            order.append("timed")
            timing.set()
            time.sleep(0.2)

    def step() -> None:
        with b.work():
            order.append("b step")
            stepping.set()

    with a.work():  # a step is running
        t = threading.Thread(target=timed)
        t.start()
        while not heard:  # the timed window waits for it, and says so
            time.sleep(0.01)
        s = threading.Thread(target=step)
        s.start()
        time.sleep(0.3)
        assert not timing.is_set() and not stepping.is_set()  # the new step waits too
    assert timing.wait(10) and stepping.wait(10)
    t.join()
    s.join()
    assert order == ["timed", "b step"]
    assert heard == [WAITING.format(gpu=3)]
    assert timer.waited_s > 0
    for lock in (a, timer, b):
        lock.close()


def test_no_file_means_nothing_is_held(tmp_path: Path) -> None:
    lock = PhaseLock(None, 0, lambda _m: pytest.fail("nothing to wait for"))
    with lock.work():
        pass
    with lock.exclusive():
        pass
    lock.close()
    assert list(tmp_path.iterdir()) == []


def _held(path: Path, mode: int) -> int:
    """Another process's hold on `path` (an open file description of its own)."""
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, mode)
    return fd


def test_the_files_are_the_owners_alone_and_no_child_inherits_them(path: Path) -> None:
    """Rule: the lock's folder is 0700 and its files 0600 (no other user can hold a GPU), and a
    process the verify starts (a candidate's sandbox) never inherits a hold (close-on-exec)."""
    lock = PhaseLock(str(path), 0, lambda _m: None)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    for p in (path, Path(f"{path}.gate")):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    for fd in (lock.fd, lock.gate):
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    lock.close()


def test_a_link_in_place_of_the_lock_file_is_refused(path: Path, tmp_path: Path) -> None:
    """Rule: the lock file is never opened through a symlink (O_NOFOLLOW): a link planted
    there could point the lock at a file of someone else's."""
    path.parent.mkdir(mode=0o700)
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        PhaseLock(str(path), 0, lambda _m: None)
    assert not (tmp_path / "elsewhere").exists()


def test_waited_s_counts_only_the_wait(path: Path) -> None:
    """Rule: a hold taken at once adds no waiting time; a queued one adds the time it waited,
    never more than the wall time around it."""
    heard: list[str] = []
    lock = PhaseLock(str(path), 0, heard.append)
    with lock.work():
        pass
    assert lock.waited_s == 0.0 and heard == []
    other = _held(path, fcntl.LOCK_EX)  # someone times
    t0 = time.perf_counter()
    t = threading.Thread(target=lambda: lock.work().__enter__())
    t.start()
    while not heard:
        time.sleep(0.01)
    time.sleep(0.1)
    os.close(other)
    t.join(10)
    wall = time.perf_counter() - t0
    assert 0.1 <= lock.waited_s <= wall
    lock.close()


def _enter(hold: contextlib.AbstractContextManager[None], done: threading.Event) -> None:
    hold.__enter__()  # held until the lock closes
    done.set()


def test_a_step_passes_the_gate_beside_others_and_a_timed_window_does_not(path: Path) -> None:
    """Rule: a step takes the gate shared (another step passing it never makes it wait), a timed
    window takes it exclusively (it waits for a step passing it)."""
    heard: list[str] = []
    lock = PhaseLock(str(path), 0, heard.append)
    passing = _held(Path(f"{path}.gate"), fcntl.LOCK_SH)  # another verify's step, at the gate
    try:
        done = threading.Event()
        t = threading.Thread(target=_enter, args=(lock.work(), done), daemon=True)
        t.start()
        assert done.wait(5) and heard == []
        lock.close()
        lock = PhaseLock(str(path), 0, heard.append)
        done.clear()
        t = threading.Thread(target=_enter, args=(lock.exclusive(), done))
        t.start()
        while not heard:
            time.sleep(0.01)
        assert not done.is_set()
    finally:
        os.close(passing)
    assert done.wait(10)
    t.join()
    lock.close()


def test_a_lock_on_descriptor_0_locks_and_closes(path: Path) -> None:
    """Rule: 0 is a descriptor like any other (a daemon with no stdin opens its lock there): only
    a negative one means no file."""
    saved = os.dup(0)
    try:
        os.close(0)
        lock = PhaseLock(str(path), 0, lambda _m: None)
        assert lock.fd == 0
        with lock.work():
            assert not flock_free(path, fcntl.LOCK_EX)
        lock.close()
        with pytest.raises(OSError):
            os.fstat(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_close_drops_every_hold_and_leaves_no_file_open(path: Path) -> None:
    """Rule: close releases both files (a hold left by an exception too) and marks the lock as
    having none (-1, as a lock with no file), so closing twice closes nothing else."""
    assert (PhaseLock(None, 0, lambda _m: None).fd, PhaseLock(None, 0, print).gate) == (-1, -1)
    lock = PhaseLock(str(path), 0, lambda _m: None)
    fds = (lock.fd, lock.gate)
    lock.exclusive().__enter__()  # never left
    lock.close()
    assert flock_free(path, fcntl.LOCK_EX)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert (lock.fd, lock.gate) == (-1, -1)
    lock.close()
