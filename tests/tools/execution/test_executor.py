"""The local executor: process groups, timeouts, pipes."""

from __future__ import annotations

import anyio
import pytest

from harnesslab.tools.execution.executor import LocalExecutor


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_a_background_child_holding_the_pipes_does_not_keep_a_finished_command_open(tmp_path):
    ex = LocalExecutor(tmp_path)
    with anyio.fail_after(20):
        res = await ex.run(["sh", "-c", "sleep 60 & echo done"], timeout_s=60)
    assert res.exit_code == 0 and not res.timed_out
    assert res.stdout.strip() == "done"
    assert res.duration_s < 10


# A program that leaves an interactive process (whose own child keeps its pipes open) to its
# executor's aclose(), as a launcher does: no asyncio transport may outlive the event loop. One
# still open when it is collected printed "RuntimeError: Event loop is closed" from
# BaseSubprocessTransport.__del__ at the program's exit.
PROGRAM = """
import gc, sys, anyio
from pathlib import Path
from harnesslab.tools.execution.executor import LocalExecutor

async def main():
    ex = LocalExecutor(Path(sys.argv[1]))
    proc = await ex.start(["sh", "-c", "setsid sleep 5 & read x; echo got $x"])
    await proc.send_line("a")
    assert (await proc.receive_line()).strip() == "got a"
    await ex.aclose()

anyio.run(main)
gc.collect()
print("exited")
"""


def test_an_executor_closed_with_a_process_still_open_exits_without_transport_noise(tmp_path):
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0 and run.stdout.strip() == "exited", run.stderr
    assert "Event loop is closed" not in run.stderr and "Exception ignored" not in run.stderr, (
        run.stderr
    )
