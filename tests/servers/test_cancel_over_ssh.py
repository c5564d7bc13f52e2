"""Cancel from the MCP client: the task server's run on an SSH executor is killed with its whole
remote process group (the in-process asyncssh server runs real local processes)."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest
from mcp import Client

from harnesslab.servers.builtin import ServerState
from harnesslab.servers.task_server import build_task_server
from harnesslab.tests.ssh_testserver import serve_loopback
from harnesslab.tools.execution.launcher import Launcher
from harnesslab.tools.execution.ssh import SSHExecutor
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.telemetry import Telemetry
from harnesslab.tools.state.workspace import init_workspace

MARKER = "411.25"  # `sleep 411.25` identifies the candidate's child process

HANGING_KERNEL = f"""
import subprocess, time
subprocess.Popen(["sleep", "{MARKER}"])
def rmsnorm_gate(x, gate, weight, eps=1e-5):
    time.sleep(600)
"""


@pytest.fixture
def anyio_backend():
    return "asyncio"


def leftovers() -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"sleep {MARKER}"], capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.ssh
@pytest.mark.anyio
@pytest.mark.parametrize("warm", [True, False], ids=["warm_worker", "fresh_process"])
async def test_cancelling_run_objective_from_the_client_kills_the_remote_group(tmp_path, warm):
    settings = Settings(
        state_dir=tmp_path / "state",
        warm_workers=warm,
        case_timeout_s=500,
        remote_python=sys.executable,  # the "remote" is this machine: use this interpreter
    )
    ws = init_workspace("rmsnorm_gate", tmp_path / "ws", settings)
    (ws.root / "kernel.py").write_text(HANGING_KERNEL)
    async with await serve_loopback(tmp_path / "remote") as remote:
        executor = SSHExecutor(remote.target(remote_root=str(tmp_path / "remote_root")))
        launcher = Launcher(settings, [executor])
        state = ServerState(
            workspace=ws,
            launcher=launcher,
            settings=settings,
            telemetry=Telemetry(ws.telemetry_path, "cancel-test", guard=ws.root),
            name="cancel-test",
        )
        try:
            async with Client(build_task_server(state), mode="legacy") as client:
                with anyio.fail_after(60):
                    # Started: the candidate's child exists on the "remote" side.
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(
                            client.call_tool, "run_objective", {"cases": ["1024x1024_fp16"]}
                        )
                        while not leftovers():
                            await anyio.sleep(0.2)
                        tg.cancel_scope.cancel()
                with anyio.fail_after(20):
                    while leftovers():
                        await anyio.sleep(0.2)
                # The server keeps serving after a cancelled call.
                with anyio.fail_after(20):
                    res = await client.call_tool("inspect_context", {})
                assert not res.is_error
        finally:
            await launcher.aclose()
    assert not leftovers()
