"""The guarded verify's GPU lock (tools/gpu/phase_lock.py): shared while it works, exclusive
while it times, and a waiter hears once that it waits."""

from __future__ import annotations

import fcntl
import threading
import time
from pathlib import Path

import pytest

from harnesslab.tests.conftest_shared import flock_free
from harnesslab.tools.gpu.phase_lock import WAITING, PhaseLock


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
