"""The task server's kernel tools on a step task (decode_step, issue 32 item 4) through the SDK's
in-memory Client and the real launcher (the sandboxed runner, the Triton interpreter's tiny
sizes): numerical_probe runs the step probes (tools/gpu/step_probe.py) in the candidate's
sandboxed process and reports each probe's worst error against the reference's logits; a
candidate that breaks at long contexts is reported, naming the probe and the step.
sweep_kernel_config scores each launch config with the step objective over the dev traces it
names (the runner's sweep mode in step mode), every step checked: a config under which the
step reads past its context is wrong_result, and apply writes the best correct one."""

from __future__ import annotations

import json
import re

import anyio
import pytest
from mcp import Client

from harnesslab.servers.task_server import build_task_server
from harnesslab.tests.conftest_shared import ESCAPE_AT_IMPORT
from harnesslab.tools.gpu.step_probe import NAMES
from harnesslab.tools.state.workspace import init_workspace
from harnesslab.tools.task import load_task

from .support import settings, state_for, text_of

pytestmark = pytest.mark.anyio
MASK = "visible = (torch.arange(c.max_seq, device=pos.device)[None, :] <= pos[:, None])"
# Attends to the last 48 slots at most: right on short contexts, wrong past 48.
WINDOW = f"{MASK} & (torch.arange(c.max_seq, device=pos.device)[None, :] > pos[:, None] - 48)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _call(tmp_path, tool: str, args: dict, kernel_edit=None, timeout: float = 180):
    ws = init_workspace("decode_step", tmp_path / "ws", settings(tmp_path))
    if kernel_edit is not None:
        source = (ws.root / "kernel.py").read_text()
        (ws.root / "kernel.py").write_text(kernel_edit(source))
    state = state_for(ws.root, tmp_path)
    try:
        async with Client(build_task_server(state)) as client:
            with anyio.fail_after(timeout):
                return await client.call_tool(tool, args), ws
    finally:
        await state.aclose()


async def _probe(tmp_path, args: dict, kernel_edit=None):
    res, _ = await _call(tmp_path, "numerical_probe", args, kernel_edit)
    return res


async def test_the_probe_runs_every_step_probe_on_the_baseline_with_its_errors(tmp_path):
    res = await _probe(tmp_path, {"show_passed": True})
    assert not res.is_error, text_of(res)
    out = res.structured_content
    assert out["status"] == "passed" and out["failed"] == 0 and out["failing"] == []
    rows = {(r["probe"], r["dtype"]): r for r in out["results"]}
    assert set(rows) == {(p, d) for p in NAMES for d in ("float16", "bfloat16")}
    for r in rows.values():
        assert r["passed"] and 0 < r["tolerance_ratio"] <= 1 and r["max_abs_err"] is not None
    assert rows["long_context", "float16"]["context"] == 64  # the interpreter's max_seq
    assert "sweep_kernel_config" in out["next_step"]


async def test_a_step_that_breaks_at_long_contexts_is_reported(tmp_path):
    def windowed(source: str) -> str:
        assert MASK in source
        return source.replace(MASK, f"visible = ({WINDOW[len('visible = ') :]})")

    res = await _probe(tmp_path, {"dtypes": ["float16"]}, windowed)
    assert not res.is_error, text_of(res)
    out = res.structured_content
    assert out["status"] == "failed"
    assert "long_context/float16" in out["failing"] and "ragged_contexts/float16" in out["failing"]
    bad = {r["probe"]: r for r in out["results"]}["long_context"]
    assert re.match(r"logits at step \d+ of the check pass", bad["reason"]), bad["reason"]
    assert bad["tolerance_ratio"] > 1 and bad["context"] == 64
    assert "attend over all max_seq slots" in bad["why_it_matters"]
    assert out["next_step"].startswith("fix long_context first")


async def test_an_unknown_probe_is_refused_with_the_step_probes(tmp_path):
    res = await _probe(tmp_path, {"probes": ["odd_dims"]})
    assert res.is_error and "unknown probe 'odd_dims'" in text_of(res)
    assert ", ".join(NAMES) in text_of(res)


# A step whose attention reads one slot past its context when kernel_config.json says block_n 64:
# a launch config that breaks the step.
BREAKS_AT_64 = """
import json
from pathlib import Path

CONFIG = json.loads(Path(__file__).with_name("kernel_config.json").read_text())
PAST = 1 if CONFIG["block_n"] == 64 else 0
"""


async def test_the_sweep_scores_each_config_by_the_step_objective_and_checks_every_step(tmp_path):
    def knob_reader(source: str) -> str:
        assert "<= pos[:, None])" in source
        return source.replace("<= pos[:, None])", "<= pos[:, None] + PAST)") + BREAKS_AT_64

    res, ws = await _call(
        tmp_path, "sweep_kernel_config",
        {"space": {"block_n": [16, 64]}, "cases": ["fixed_fp16"], "apply": True, "show": 10},
        knob_reader,
    )  # fmt: skip
    assert not res.is_error, text_of(res)
    out = res.structured_content
    assert out["status"] == "passed" and out["tried"] == 2 and out["ok"] == 1
    assert out["cases"] == ["fixed_fp16"] and out["meaningful"] is False
    good, bad = out["results"]
    assert good["config"]["block_n"] == 16 and good["status"] == "ok"
    assert set(good["per_case_us"]) == {"fixed_fp16"}
    assert good["score_us"] == pytest.approx(good["per_case_us"]["fixed_fp16"])
    assert bad["config"]["block_n"] == 64 and bad["status"] == "wrong_result"
    assert bad["score_us"] is None and "logits at step 0 of the check pass" in bad["reason"]
    assert out["best"]["config"] == good["config"] and out["applied"]
    written = json.loads((ws.root / "kernel_config.json").read_text())
    assert written == {"block_n": 16, "num_warps": 4, "splits": 8}


async def test_the_sweep_refuses_an_unknown_trace_and_knob_with_the_known_ones(tmp_path):
    res, _ = await _call(tmp_path, "sweep_kernel_config", {"cases": ["nope"]})
    assert res.is_error and "unknown trace 'nope'" in text_of(res)
    assert "fixed_fp16, dynamic_fp16, dynamic_bf16" in text_of(res)
    res, _ = await _call(tmp_path / "2", "sweep_kernel_config", {"space": {"BLOCK": [1]}})
    assert res.is_error and "unknown knob 'BLOCK'" in text_of(res)
    assert "block_n, num_warps, splits" in text_of(res)


@pytest.mark.slow  # the shipped solution in the Triton interpreter: ~20 s on a loaded machine
async def test_the_sweep_runs_the_shipped_solutions_knobs_in_the_interpreter(tmp_path):
    solution = load_task("decode_step").solutions()["triton"].read_text()
    res, _ = await _call(
        tmp_path, "sweep_kernel_config",
        {"space": {"block_n": [16, 64]}, "cases": ["fixed_fp16"], "show": 10},
        lambda _: solution, timeout=600,
    )  # fmt: skip
    assert not res.is_error, text_of(res)
    out = res.structured_content
    assert out["ok"] == 2, out["results"]
    assert {r["config"]["block_n"] for r in out["results"]} == {16, 64}


@pytest.mark.slow  # ~7 s on a loaded 2-core machine (the profiler's start per step)
async def test_the_profile_breaks_a_step_down_per_kernel_and_says_it_is_not_meaningful_here(
    tmp_path,
):
    res, _ = await _call(tmp_path, "profile_kernel", {"case": "dynamic_fp16", "repeats": 2})
    assert not res.is_error, text_of(res)
    out = res.structured_content
    assert out["profiler"] == "torch.profiler" and out["meaningful"] is False
    assert out["case"] == "dynamic_fp16" and 0 < out["context"] <= 64 and out["metrics"] == []
    main, others = out["main"], out["others"]
    assert main["share_pct"] >= max((k["share_pct"] for k in others), default=0) > 0
    assert sum(k["share_pct"] for k in [main, *others]) <= 100.0 + 1e-6
    assert out["step_us"] >= main["total_us"] > 0
    assert out["bottleneck"].startswith(f"{main['kernel']} dominates the step")
    assert "CPU interpreter" in out["bottleneck"]


async def test_the_profile_refuses_a_failing_step_and_an_unknown_trace(tmp_path):
    res, _ = await _call(
        tmp_path,
        "profile_kernel",
        {},
        lambda s: s.replace(MASK, "raise RuntimeError('boom')\n    " + MASK),
    )
    assert res.is_error and "the step failed under the profiler on fixed_fp16" in text_of(res)
    assert "boom" in text_of(res)
    res, _ = await _call(tmp_path / "2", "profile_kernel", {"case": "nope"})
    assert res.is_error and "unknown trace 'nope'" in text_of(res)


@pytest.mark.parametrize(
    ("tool", "args"),
    [("numerical_probe", {"probes": ["long_context"], "dtypes": ["float16"]}),
     ("sweep_kernel_config", {"space": {"block_n": [16]}, "cases": ["fixed_fp16"]}),
     ("profile_kernel", {"repeats": 1})],
)  # fmt: skip
async def test_each_step_tool_runs_the_candidate_inside_the_sandbox(tmp_path, tool, args):
    """The step tools import agent code: each starts it inside the sandbox like every dev mode,
    so a candidate that writes outside its folder at import leaves nothing behind (and the tool
    still answers)."""
    outside = tmp_path / "escaped.txt"
    res, _ = await _call(
        tmp_path, tool, args, lambda s: s + ESCAPE_AT_IMPORT.format(outside=str(outside))
    )
    assert not res.is_error, text_of(res)
    assert not outside.exists(), f"{tool} ran the candidate outside the sandbox"
