"""The host reads the JSON lines of processes that run agent code (the runner, the compile
workers) with one depth-checked reader (gpu/wire.json_object). A kernel that writes, at import,
a line nested past the parser's recursion limit onto the runner's protocol stream costs that
line (an event), or its own config (a forged result), never the call. Before, json.loads raised
RecursionError out of the launcher and the pool."""

from __future__ import annotations

import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_workspace
from harnesslab.tools.evaluation.objective import run_objective
from harnesslab.tools.evaluation.request import kernel_request

SMALL = "1024x1024_fp16"
# The runner's own stream (runner.py keeps it in _OUT), reached from the candidate's import.
HOSTILE = (
    "import sys as _sys\n"
    "_OUT = _sys.modules['__main__']._OUT\n"
    "_OUT.write('{\"event\": \"EVENT\", \"x\": ' + '[' * 100000 + ']' * 100000 + '}\\n')\n"
    "_OUT.flush()\n"
)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def hostile_workspace(tmp_path, event: str):
    ws = make_workspace(tmp_path)
    kernel = ws.root / "kernel.py"
    kernel.write_text(HOSTILE.replace("EVENT", event) + kernel.read_text())
    return ws


@pytest.mark.anyio
async def test_a_runner_line_nested_past_the_recursion_limit_is_dropped(tmp_path):
    ws = hostile_workspace(tmp_path, "case")
    launcher = make_launcher(tmp_path, interpret="always")
    try:
        res = await run_objective(ws, launcher, cases=[SMALL], repeats=2)
    finally:
        await launcher.aclose()
    assert res.status == "passed", res.reason


@pytest.mark.anyio
async def test_a_compile_worker_line_nested_past_the_recursion_limit_is_dropped(tmp_path):
    ws = hostile_workspace(tmp_path, "result")
    launcher = make_launcher(tmp_path, interpret="always")
    request = kernel_request(ws, launcher, ws.snapshot(), "sweep", cases=[ws.task.dev_case(SMALL)])
    try:
        done = await launcher.compile_pool.compile(
            request, [ws.read_config()], task=ws.task, workers=1
        )
    finally:
        await launcher.aclose()
    assert done is not None and [e["status"] for e in done] == ["failed"], done
    assert "no result" in done[0]["reason"]
