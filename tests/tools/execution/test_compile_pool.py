"""The sweeps' warm compile workers (execution/compile_pool.py), on the Triton interpreter."""

from __future__ import annotations

import os
import signal

import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_workspace
from harnesslab.tools.evaluation.request import kernel_request
from harnesslab.tools.evaluation.sweep import sweep

SMALL = "1024x1024_fp16"


@pytest.fixture
def anyio_backend():
    return "asyncio"


def request_for(ws, launcher):
    case = ws.task.dev_case(SMALL)
    return kernel_request(ws, launcher, ws.snapshot(), "sweep", cases=[case], seed=1)


def configs(ws, warps):
    return [{**ws.read_config(), "num_warps": w} for w in warps]


@pytest.mark.anyio
async def test_the_pool_starts_once_and_serves_a_second_sweep_with_the_same_workers(tmp_path):
    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path, interpret="always")
    pool = launcher.compile_pool
    try:
        first = await pool.compile(
            request_for(ws, launcher), configs(ws, [1, 2, 4]), task=ws.task, workers=2
        )
        assert [e["status"] for e in first] == ["passed"] * 3, first
        assert pool.started == 2 and len(pool.workers) == 2
        pids = {i: w.proc.pid for i, w in pool.workers.items()}
        second = await pool.compile(
            request_for(ws, launcher), configs(ws, [8, 16]), task=ws.task, workers=2
        )
        assert [e["config"]["num_warps"] for e in second] == [8, 16]
        assert all(e["status"] == "passed" for e in second), second
        assert pool.started == 2  # no new process: the sweep paid no start-up
        assert {i: w.proc.pid for i, w in pool.workers.items()} == pids
    finally:
        await launcher.aclose()
    assert not pool.workers


@pytest.mark.anyio
async def test_a_killed_worker_is_replaced_and_no_config_is_lost(tmp_path):
    ws = make_workspace(tmp_path)
    launcher = make_launcher(tmp_path, interpret="always")
    pool = launcher.compile_pool
    try:
        await pool.compile(request_for(ws, launcher), configs(ws, [1]), task=ws.task, workers=1)
        victim = pool.workers[0].proc.pid
        os.killpg(victim, signal.SIGKILL)  # the worker crashes between two sweeps
        again = await pool.compile(
            request_for(ws, launcher), configs(ws, [2, 4]), task=ws.task, workers=1
        )
        assert [e["status"] for e in again] == ["passed", "passed"], again
        assert pool.started == 2
        assert pool.workers[0].proc.pid != victim
    finally:
        await launcher.aclose()


@pytest.mark.anyio
async def test_a_config_that_fails_to_compile_is_reported_on_its_own(tmp_path):
    ws = make_workspace(tmp_path)
    kernel = ws.root / "kernel.py"
    kernel.write_text(
        kernel.read_text()
        + '\nif CONFIG["num_warps"] == 8:\n    raise ValueError("num_warps=8 does not compile")\n'
    )
    launcher = make_launcher(tmp_path, interpret="always")
    seen: list[tuple[float, float, str]] = []
    try:
        res = await sweep(
            ws,
            launcher,
            space={"num_warps": [4, 8]},
            cases=[SMALL],
            compile_workers=2,
            progress=lambda done, total, msg: seen.append((done, total, msg)),
        )
    finally:
        await launcher.aclose()
    done = [d for d, _, _ in seen]
    assert done == sorted(set(done))  # MCP progress only grows, whichever half steps
    assert [m.split(" (")[0] for _, _, m in seen if "compiled" in m] == [
        "compiled 1 of 2 configs",
        "compiled 2 of 2 configs",
    ]
    # One total for both halves (2 x 2 configs), reached and never passed: the config that
    # failed to compile takes its two steps at once (it is never timed).
    failed = next(i for i, (_, _, m) in enumerate(seen) if "config 2: failed" in m)
    assert done[failed] - (done[failed - 1] if failed else 0) == 2
    assert {t for _, t, _ in seen} == {4} and done[-1] == 4
    by_warps = {r.config["num_warps"]: r for r in res.results}
    assert by_warps[4].status == "ok" and by_warps[4].score_us is not None
    assert by_warps[8].status == "compile_error"
    assert "num_warps=8 does not compile" in by_warps[8].reason
    assert res.compile_s > 0 and res.tried == 2 and res.ok == 1 and res.compile_workers == 2


@pytest.mark.ssh
@pytest.mark.anyio
async def test_a_sweep_over_ssh_compiles_on_the_pool_and_times_only_what_compiled(tmp_path):
    import sys

    from harnesslab.tests.ssh_testserver import serve_loopback
    from harnesslab.tools.execution.launcher import Launcher
    from harnesslab.tools.execution.ssh import SSHExecutor
    from harnesslab.tools.settings import Settings

    settings = Settings(state_dir=tmp_path / "state", interpret="always",
                        remote_python=sys.executable)  # fmt: skip
    ws = make_workspace(tmp_path)
    kernel = ws.root / "kernel.py"
    kernel.write_text(
        kernel.read_text() + '\nif CONFIG["num_warps"] == 2:\n    raise ValueError("no 2")\n'
    )
    async with await serve_loopback(tmp_path / "remote") as remote:
        launcher = Launcher(settings, [SSHExecutor(remote.target(remote_root=str(tmp_path / "r")))])
        try:
            res = await sweep(
                ws, launcher, space={"num_warps": [1, 2, 4]}, cases=[SMALL], compile_workers=2
            )
            pool = launcher.compile_pool
            assert pool.started == 2 and len(pool.workers) == 2
        finally:
            await launcher.aclose()
    status = {r.config["num_warps"]: r.status for r in res.results}
    assert status == {1: "ok", 2: "compile_error", 4: "ok"}, res.results
    assert (tmp_path / "r" / "stage" / "tcache" / "dev").is_dir()  # made by the sandbox
