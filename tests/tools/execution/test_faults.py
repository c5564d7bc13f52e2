"""Fault injection on this machine's executor: workers killed from outside mid-call, workers
crashed by the candidate, workers gone while idle. The blame must land where it belongs
(tools/errors.py) and nothing may be lost: an infrastructure fault records nothing of the
candidate and the next call works; a crash of the candidate's own is its recorded result.
SSH and Slurm: test_faults_remote.py."""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_workspace
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution.launcher import Launcher

SMALL = "1024x1024_fp16"
pytestmark = pytest.mark.slow  # each warm worker starts torch under the Triton interpreter


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def slowed(source: str, seconds: float) -> str:
    """The kernel, taking `seconds` at import: a window to kill its runner in."""
    return f"import time\ntime.sleep({seconds})\n{source}"


async def kill_worker_mid_call(launcher: Launcher, *, after_s: float = 1.0) -> int:
    """Once the slot's warm worker took the request: SIGKILL its process group, as the
    out-of-memory killer would. Returns the killed pid."""
    with anyio.fail_after(120):
        while launcher.slots[0].worker is None:
            await anyio.sleep(0.05)
    pid = launcher.slots[0].worker.proc.pid
    await anyio.sleep(after_s)
    os.killpg(pid, signal.SIGKILL)
    return pid


@pytest.mark.anyio
async def test_a_runner_killed_from_outside_mid_call_is_retryable_and_records_nothing(tmp_path):
    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path, interpret="always")
    source = (ws.root / "kernel.py").read_text()
    (ws.root / "kernel.py").write_text(slowed(source, 8))
    errors: list[ExecutorError] = []
    try:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                try:
                    await run_objective(ws, launcher, cases=[SMALL])
                except ExecutorError as exc:
                    errors.append(exc)

            tg.start_soon(call)
            await kill_worker_mid_call(launcher)
        assert [(e.kind, e.blame, e.retryable) for e in errors] == [
            ("killed", "infrastructure", True)
        ]
        assert "SIGKILL" in errors[0].message and "out-of-memory" in errors[0].message
        assert ws.ledger().records() == []  # not a failed run of the candidate
        (ws.root / "kernel.py").write_text(source)
        again = await run_objective(ws, launcher, cases=[SMALL])
        assert again.status == "passed", again.reason
    finally:
        await launcher.aclose()


CRASHING = """
import faulthandler
def rmsnorm_gate(x, gate, weight, eps=1e-5):
    faulthandler._sigsegv()  # the candidate's own crash: a segfault in its process
"""


@pytest.mark.anyio
async def test_a_candidate_that_crashes_its_runner_is_recorded_as_its_failure_naming_the_signal(
    tmp_path,
):
    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path, interpret="always")
    (ws.root / "kernel.py").write_text(CRASHING)
    try:
        result = await run_objective(ws, launcher, cases=[SMALL])
    finally:
        await launcher.aclose()
    assert result.status == "failed"
    assert "SIGSEGV" in result.reason, result.reason
    (record,) = ws.ledger().records()
    assert record["status"] == "failed" and "SIGSEGV" in record["reason"]


@pytest.mark.anyio
async def test_a_worker_gone_while_idle_is_replaced_without_failing_the_next_call(tmp_path):
    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path, interpret="always")
    try:
        first = await run_objective(ws, launcher, cases=[SMALL])
        worker = launcher.slots[0].worker
        assert first.status == "passed" and worker is not None
        os.killpg(worker.proc.pid, signal.SIGKILL)  # between two calls
        with anyio.fail_after(30):
            while worker.proc.alive():
                await anyio.sleep(0.05)
        second = await run_objective(ws, launcher, cases=[SMALL])
        assert second.status == "passed", second.reason
        assert launcher.slots[0].worker is not None and launcher.slots[0].worker is not worker
    finally:
        await launcher.aclose()
    assert [r["status"] for r in ws.ledger().records()] == ["passed", "passed"]


@pytest.mark.anyio
async def test_a_sweep_whose_runner_is_killed_from_outside_blames_no_config(tmp_path):
    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path, interpret="always")
    (ws.root / "kernel.py").write_text(slowed((ws.root / "kernel.py").read_text(), 8))
    errors: list[ExecutorError] = []
    try:
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                try:
                    await sweep(ws, launcher, space={"num_warps": [2, 4]}, cases=[SMALL])
                except ExecutorError as exc:
                    errors.append(exc)

            tg.start_soon(call)
            await kill_worker_mid_call(launcher)
    finally:
        await launcher.aclose()
    # Before: every config "timeout: runner exited with None: worker died", a sweep record.
    assert [e.kind for e in errors] == ["killed"]
    assert "kernel" not in errors[0].next_step
    assert ws.ledger().records() == []
