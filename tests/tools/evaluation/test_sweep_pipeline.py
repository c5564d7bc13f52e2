"""A sweep's compiles and timing overlap (tools/evaluation/sweep_pipeline.py), on the Triton
interpreter with the real compile pool (compile workers asked for, as on a GPU host)."""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_workspace
from harnesslab.tools.errors import ExecutorError
from harnesslab.tools.evaluation.sweep import sweep

SMALL = "1024x1024_fp16"

# Appended to the kernel. Each import of a config leaves a mark in the candidate's dev Triton
# cache (shared by the compile workers and the timing runner, granted to both sandboxes): a
# config's second import is the timing runner's, and says "timing-started". The compile of
# num_warps=SLOW waits for the file UNTIL (at most WAIT_S): with "timing-started" it ends early
# only where the timing of another config began while it was still compiling. The timing of
# num_warps=HOLD takes HOLD_S more (a runner busy mid-request). num_warps=BROKEN does not
# compile.
GATE = """
import os as _os
import time as _time

_cache = _os.environ["TRITON_CACHE_DIR"]
_seen = _os.path.join(_cache, "seen-%d" % CONFIG["num_warps"])
if _os.path.exists(_seen):
    open(_os.path.join(_cache, "timing-started"), "w").close()
    if CONFIG["num_warps"] == {hold}:
        _time.sleep({hold_s})
elif CONFIG["num_warps"] == {slow}:
    _end = _time.monotonic() + {wait_s}
    while not _os.path.exists(_os.path.join(_cache, "{until}")) and _time.monotonic() < _end:
        _time.sleep(0.05)
open(_seen, "w").close()
if CONFIG["num_warps"] == {broken}:
    raise ValueError("num_warps={broken} does not compile")
"""
WAIT_S = 90


@pytest.fixture
def anyio_backend():
    return "asyncio"


def gated(
    ws, *, slow: int = 2, until: str = "timing-started", hold: int = 0, broken: int = 8
) -> None:
    gate = GATE.format(slow=slow, until=until, hold=hold, hold_s=60, broken=broken, wait_s=WAIT_S)
    (ws.root / "kernel.py").write_text((ws.root / "kernel.py").read_text() + gate)


async def timing_started(tmp_path) -> None:
    """Until a timing runner imported a config (the gate's mark, on this machine's stage)."""
    while not list((tmp_path / "state").rglob("timing-started")):
        await anyio.sleep(0.05)


def spy_on_calls(launcher) -> list[tuple[float, list[int], str]]:
    """Every timing request the sweep sends: (when, its configs' num_warps, the slot's label)."""
    sent: list[tuple[float, list[int], str]] = []
    real = launcher.call

    async def call(request: dict[str, Any], **kw: Any):
        slot = kw.get("slot") or launcher.slots[0]
        sent.append(
            (anyio.current_time(), [c["num_warps"] for c in request["configs"]], slot.label)
        )
        return await real(request, **kw)

    launcher.call = call
    return sent


def monotone_to_the_end(seen: list[tuple[float, float, str]], total: int) -> None:
    done = [d for d, _, _ in seen]
    assert done == sorted(done), seen  # MCP: progress only grows
    assert {t for _, t, _ in seen} == {total} and done[-1] == total, seen


@pytest.mark.anyio
async def test_timing_starts_while_a_slow_config_still_compiles_and_skips_what_failed(tmp_path):
    ws = make_workspace(tmp_path)
    gated(ws)
    launcher = make_launcher(tmp_path, interpret="always")
    sent = spy_on_calls(launcher)
    seen: list[tuple[float, float, str]] = []
    when: list[float] = []

    def progress(done: float, total: float, message: str) -> None:
        seen.append((done, total, message))
        when.append(anyio.current_time())

    try:
        with anyio.fail_after(WAIT_S + 120):
            res = await sweep(
                ws, launcher, space={"num_warps": [1, 2, 4, 8]}, cases=[SMALL], compile_workers=2,
                progress=progress,
            )  # fmt: skip
    finally:
        await launcher.aclose()
    said = [m for _, _, m in seen]
    slow_compiled = when[said.index(next(m for m in said if "(config 2: passed)" in m))]
    # The first timing request went out while num_warps=2 still compiled; its compile ended
    # because that request's runner imported a config (it would have waited WAIT_S otherwise).
    assert sent[0][0] < slow_compiled, (sent, seen)
    assert 2 not in sent[0][1], sent
    timed = sorted(w for _, warps, _ in sent for w in warps)
    assert timed == [1, 2, 4], sent  # each config that compiled, once; never the broken one
    monotone_to_the_end(seen, 8)
    by_warps = {r.config["num_warps"]: r for r in res.results}
    assert {w: r.status for w, r in by_warps.items()} == {
        1: "ok", 2: "ok", 4: "ok", 8: "compile_error"
    }  # fmt: skip
    assert "num_warps=8 does not compile" in by_warps[8].reason
    assert by_warps[8].host is None and by_warps[8].reason.startswith("import failed")
    assert by_warps[1].host and by_warps[1].gpu_index == "0"  # named where it was timed
    assert res.compile_workers == 2 and res.tried == 4 and res.ok == 3
    assert res.timing_requests == len(sent) >= 2  # the early config went alone
    assert 0 < res.compile_s < WAIT_S and res.timing_s > 0
    # The halves overlapped: the wall time is less than their sum.
    assert res.wall_s < res.compile_s + res.timing_s


@pytest.mark.anyio
async def test_the_overlapped_sweep_finds_what_the_one_request_sweep_finds(tmp_path):
    ws = make_workspace(tmp_path)
    gated(ws, slow=0)  # no config waits: only the broken one differs
    space = {"num_warps": [2, 4, 8]}
    launcher = make_launcher(tmp_path, interpret="always")
    try:
        with anyio.fail_after(300):
            piped = await sweep(ws, launcher, space=space, cases=[SMALL], compile_workers=2)
            sent = spy_on_calls(launcher)
            whole = await sweep(ws, launcher, space=space, cases=[SMALL])  # no compile pool
    finally:
        await launcher.aclose()
    assert [warps for _, warps, _ in sent] == [[2, 4, 8]]  # the one request, every config

    def summary(res) -> dict[int, tuple[str, list[str], bool]]:
        return {
            r.config["num_warps"]: (r.status, sorted(r.per_case_us), "does not compile" in r.reason)
            for r in res.results
        }

    assert summary(piped) == summary(whole)
    assert summary(piped)[8] == ("compile_error", [], True)
    assert summary(piped)[2][1] == [SMALL]
    assert piped.compile_workers == 2 and whole.compile_workers == 0 and whole.compile_s == 0
    assert [r.config for r in piped.results if r.status == "ok"] and piped.best is not None


@pytest.mark.anyio
async def test_configs_that_compile_are_dealt_over_every_idle_slot(tmp_path):
    ws = make_workspace(tmp_path)
    gated(ws, slow=0)
    launcher = make_launcher(tmp_path, interpret="always", gpus="0,1")
    sent = spy_on_calls(launcher)
    seen: list[tuple[float, float, str]] = []
    try:
        with anyio.fail_after(300):
            res = await sweep(
                ws, launcher, space={"num_warps": [1, 2, 4, 8]}, cases=[SMALL], compile_workers=2,
                progress=lambda done, total, msg: seen.append((done, total, msg)),
            )  # fmt: skip
    finally:
        await launcher.aclose()
    assert {label for _, _, label in sent} == {"local:gpu0", "local:gpu1"}, sent
    assert sorted(w for _, warps, _ in sent for w in warps) == [1, 2, 4]
    by_warps = {r.config["num_warps"]: r for r in res.results}
    assert {by_warps[w].gpu_index for w in (1, 2, 4)} == {"0", "1"}
    assert all(by_warps[w].status == "ok" and by_warps[w].host for w in (1, 2, 4))
    monotone_to_the_end(seen, 8)


@pytest.mark.anyio
async def test_a_cancelled_sweep_stops_both_halves_and_leaves_no_busy_worker_running(tmp_path):
    ws = make_workspace(tmp_path)
    # num_warps=2 compiles until cancelled; the timing of num_warps=1 is mid-request then.
    gated(ws, slow=2, until="never", hold=1)
    launcher = make_launcher(tmp_path, interpret="always")
    pool = launcher.compile_pool
    try:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:

                async def go() -> None:
                    await sweep(ws, launcher, space={"num_warps": [1, 2, 4]}, cases=[SMALL],
                                compile_workers=2)  # fmt: skip
                    raise AssertionError("the sweep ended before it was cancelled")

                tg.start_soon(go)
                await timing_started(tmp_path)
                compiling = pool.workers[1].proc  # took the second config: num_warps=2
                worker = launcher.slots[0].worker
                assert worker is not None and compiling.alive()
                timing = worker.proc
                tg.cancel_scope.cancel()
            assert not compiling.alive() and not timing.alive()
            assert launcher.slots[0].worker is None
            # The launcher still works: a sweep after the cancelled one runs to its end.
            again = await sweep(ws, launcher, space={"num_warps": [4, 16]}, cases=[SMALL],
                                compile_workers=2)  # fmt: skip
    finally:
        await launcher.aclose()
    assert [r.status for r in again.results] == ["ok", "ok"], again.results
    assert ws.ledger().records()[-1]["tried"] == 2  # the cancelled sweep recorded nothing


@pytest.mark.anyio
async def test_a_timing_runner_killed_from_outside_stops_the_compiles_and_blames_no_config(
    tmp_path,
):
    ws = make_workspace(tmp_path)
    gated(ws, slow=2, until="never", hold=1)
    launcher = make_launcher(tmp_path, interpret="always")
    pool = launcher.compile_pool
    errors: list[ExecutorError] = []
    try:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:

                async def go() -> None:
                    try:
                        await sweep(ws, launcher, space={"num_warps": [1, 2, 4]}, cases=[SMALL],
                                    compile_workers=2)  # fmt: skip
                    except ExecutorError as exc:
                        errors.append(exc)

                tg.start_soon(go)
                await timing_started(tmp_path)
                compiling = pool.workers[1].proc
                worker = launcher.slots[0].worker
                assert worker is not None
                os.killpg(worker.proc.pid, signal.SIGKILL)  # as the out-of-memory killer would
        assert not compiling.alive()  # the compile half stopped with it
    finally:
        await launcher.aclose()
    assert [e.kind for e in errors] == ["killed"], errors
    assert "kernel" not in errors[0].next_step
    assert ws.ledger().records() == []
