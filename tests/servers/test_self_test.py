"""`serve --self-test` calls every tool of the task server: each tool that applies to the task's
kind must work, each that does not must be refused (servers/runtime.py), for every kind."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from harnesslab.servers.self_test import REFUSED, run_self_test, steps
from harnesslab.servers.task_server import TASK_TOOL_NAMES
from harnesslab.tests.tools.evaluation.test_command_tasks import make_task
from harnesslab.tools.settings import Settings
from harnesslab.tools.task.spec import load_task


def refused(task) -> set[str]:
    """The tools the self-test expects the server to refuse."""
    return {tool for tool, _, _, accepted in steps(task) if accepted == (REFUSED,)}


def test_every_tool_is_a_step_and_a_kernel_task_refuses_none():
    kernel = load_task("rmsnorm_gate")
    assert sorted(tool for tool, *_ in steps(kernel)) == sorted(TASK_TOOL_NAMES)
    assert refused(kernel) == set()


def test_a_command_task_refuses_the_kernel_tools_and_verifies_with_its_own_objective(tmp_path):
    command = load_task(str(make_task(tmp_path / "task")))
    assert refused(command) == {"sweep_kernel_config", "numerical_probe", "profile_kernel"}


def test_a_step_task_refuses_no_tool_and_names_a_dev_trace():
    step = load_task("decode_step")
    assert refused(step) == set()
    args = {tool: a for tool, a, *_ in steps(step)}
    assert args["run_objective"] == {"cases": ["fixed_fp16"]}
    assert args["sweep_kernel_config"]["cases"] == ["fixed_fp16"]
    assert args["sweep_kernel_config"]["space"] == {"block_n": [16, 32]}
    assert args["profile_kernel"] == {"case": "fixed_fp16"}


@pytest.mark.anyio
async def test_the_self_test_passes_on_a_command_task(tmp_path: Path):
    task = make_task(tmp_path / "task")
    with anyio.fail_after(120):
        assert await run_self_test(Settings(), str(task), "selftest-cmd") == 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
