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
