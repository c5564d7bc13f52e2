"""The guarded verify's GPU lock (tools/gpu/phase_lock.py): shared while it works, exclusive
while it times, and a waiter hears once that it waits."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from harnesslab.tools.gpu.phase_lock import WAITING, PhaseLock


def probe(path: Path, mode: int) -> bool:
    """Could another open of the lock file take `mode` now?"""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "gpu-locks" / "local-gpu0.lock"


def test_shared_lets_other_verifies_work_and_keeps_a_timing_run_out(path: Path) -> None:
    lock = PhaseLock(str(path), 0, lambda _m: None)
    lock.shared()
    assert probe(path, fcntl.LOCK_SH)
    assert not probe(path, fcntl.LOCK_EX)
    with lock.exclusive():  # its own timed window: nobody else, not even shared
        assert not probe(path, fcntl.LOCK_SH)
    assert probe(path, fcntl.LOCK_SH)  # back to shared after the window
    assert not probe(path, fcntl.LOCK_EX)
    lock.close()
    assert probe(path, fcntl.LOCK_EX)


def test_an_exclusive_window_without_a_shared_hold_ends_free(path: Path) -> None:
    lock = PhaseLock(str(path), 0, lambda _m: None)
    with lock.exclusive():
        assert not probe(path, fcntl.LOCK_SH)
    assert probe(path, fcntl.LOCK_EX)
    lock.close()


def test_a_timed_window_waits_for_every_shared_holder_and_says_so(path: Path) -> None:
    other = PhaseLock(str(path), 3, lambda _m: None)
    other.shared()
    heard: list[str] = []
    lock = PhaseLock(str(path), 3, heard.append)
    lock.shared()  # shared beside shared: no wait
    assert heard == []
    entered = threading.Event()

    def timed() -> None:
        with lock.exclusive():
            entered.set()

    t = threading.Thread(target=timed)
    t.start()
    time.sleep(0.3)
    assert not entered.is_set()  # the other verify still works on the GPU
    other.close()
    assert entered.wait(10)
    t.join()
    assert heard == [WAITING.format(gpu=3)]
    lock.close()


def test_no_file_means_nothing_is_held(tmp_path: Path) -> None:
    lock = PhaseLock(None, 0, lambda _m: pytest.fail("nothing to wait for"))
    lock.shared()
    with lock.exclusive():
        pass
    lock.close()
    assert list(tmp_path.iterdir()) == []
