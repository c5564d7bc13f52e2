"""What sweep_kernel_config asks the runner on a step task (tools/evaluation/sweep.py), with the
runner's answer canned: the step table of the traces the call names instead of kernel cases, no
compile pool, each config scored by its traces' p50 sum (per_case_us per trace), and a timing
call's limit that grows with its configs (each is a whole step objective)."""

from __future__ import annotations

from typing import Any

import pytest

from harnesslab.tests.conftest_shared import make_launcher, make_workspace
from harnesslab.tools.evaluation.sweep import sweep
from harnesslab.tools.execution import RunnerCall


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_a_step_sweep_sends_the_named_traces_and_scales_its_time_limit(tmp_path):
    ws = make_workspace(tmp_path, "decode_step")
    launcher = make_launcher(tmp_path)
    calls: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def call(request: dict[str, Any], **kw: Any) -> RunnerCall:
        calls.append((request, kw))
        configs = [{"config": c, "status": "passed", "score_us": 5.0 + c["block_n"], "reason": "",
                    "cases": [{"name": "dynamic_fp16", "passed": True, "status": "passed",
                               "median_us": 5.0 + c["block_n"]}]}
                   for c in request["configs"]]  # fmt: skip
        return RunnerCall(result={"status": "passed", "configs": configs, "env": {}}, events=[],
                          exit_code=0, timed_out=False, stderr_tail="", host="h", gpu_index=0,
                          wall_s=0.0)  # fmt: skip

    launcher.call = call  # type: ignore[method-assign]
    try:
        res = await sweep(ws, launcher, space={"block_n": [16, 32, 64]}, cases=["dynamic_fp16"],
                          compile_workers=2)  # fmt: skip
    finally:
        await launcher.aclose()
    ((request, kw),) = calls  # one timing call, no compile phase even with workers asked for
    assert request["mode"] == "sweep" and "cases" not in request
    assert [t["name"] for t in request["step"]["traces"]] == ["dynamic_fp16"]
    assert request["step"]["interpreter"]["hidden"] == 64
    assert len(request["configs"]) == 3 and res.compile_workers == 0
    assert kw["timeout_s"] == launcher.settings.eval_timeout_s * 4  # at least 4 objectives
    assert res.cases == ["dynamic_fp16"] and res.best is not None
    assert res.best.config["block_n"] == 16 and res.best.per_case_us == {"dynamic_fp16": 21.0}
    calls.clear()
    launcher = make_launcher(tmp_path)
    launcher.call = call  # type: ignore[method-assign]
    try:
        await sweep(ws, launcher, space={"block_n": [16, 32, 64], "num_warps": [1, 2]})
    finally:
        await launcher.aclose()
    ((request, kw),) = calls
    assert len(request["step"]["traces"]) == 3  # all the dev traces by default
    assert kw["timeout_s"] == launcher.settings.eval_timeout_s * 6  # one objective a config
