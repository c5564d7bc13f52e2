"""`harnesslab serve --executor slurm` as a subprocess over stdio, on the test Slurm cluster
(tests/slurm_cluster.py): the task tools run in an allocation of two GPUs, remote_health_check
shows Slurm's view, and when the server exits its allocation is gone from squeue."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from harnesslab.tests.slurm_cluster import Cluster

from .support import SMALL, kernel_workspace, text_of
from .test_stdio_e2e import CLI, server_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_serve_on_slurm_runs_the_tools_in_an_allocation_and_exit_releases_it(
    tmp_path, slurm_cluster: Cluster
):
    ws = kernel_workspace(tmp_path)
    flags = ["--executor", "slurm", "--slurm-gpus", "2", "--slurm-time", "10:00"]
    env = {
        **server_env(tmp_path),
        "HARNESSLAB_SLURM_CONF": str(slurm_cluster.conf),
        "HARNESSLAB_SLURM_CPUS_PER_GPU": "1",  # the test node has two CPUs
    }
    params = StdioServerParameters(
        command=CLI[0], args=[*CLI[1:], "serve", "--workspace", str(ws.root), *flags], env=env
    )
    with anyio.fail_after(180):
        async with Client(params) as client:
            obj = await client.call_tool("run_objective", {"cases": [SMALL]})
            assert obj.structured_content["status"] == "passed", text_of(obj)
            assert obj.structured_content["host"] == slurm_cluster.node
            assert obj.structured_content["gpu_index"] in ("0", "1")
            (job,) = [j for j in slurm_cluster.jobs() if j.isdigit()]
            health = await client.call_tool("remote_health_check", {})
            (host,) = health.structured_content["hosts"]
            assert host["executor"] == "slurm"
            assert host["scheduler"]["job"] == {
                "id": job, "state": "RUNNING", "reason": "None", "nodes": slurm_cluster.node,
            }  # fmt: skip
            assert host["scheduler"]["partitions"][0]["gpus"] == 2
    slurm_cluster.wait_until(lambda: slurm_cluster.jobs() == [], "allocation released", 20)
