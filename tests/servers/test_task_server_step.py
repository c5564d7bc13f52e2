"""The task server's kernel tools on a step task (decode_step, issue 32 item 4) through the SDK's
in-memory Client and the real launcher (the sandboxed runner, the Triton interpreter's tiny
sizes): numerical_probe runs the step probes (tools/gpu/step_probe.py) in the candidate's
sandboxed process and reports each probe's worst error against the reference's logits; a
candidate that breaks at long contexts is reported, naming the probe and the step."""

from __future__ import annotations

import re

import anyio
import pytest
from mcp import Client

from harnesslab.servers.task_server import build_task_server
from harnesslab.tools.gpu.step_probe import NAMES
from harnesslab.tools.state.workspace import init_workspace

from .support import settings, state_for, text_of

pytestmark = pytest.mark.anyio
MASK = "visible = (torch.arange(c.max_seq, device=pos.device)[None, :] <= pos[:, None])"
# Attends to the last 48 slots at most: right on short contexts, wrong past 48.
WINDOW = f"{MASK} & (torch.arange(c.max_seq, device=pos.device)[None, :] > pos[:, None] - 48)"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _probe(tmp_path, args: dict, kernel_edit=None):
    ws = init_workspace("decode_step", tmp_path / "ws", settings(tmp_path))
    if kernel_edit is not None:
        source = (ws.root / "kernel.py").read_text()
        (ws.root / "kernel.py").write_text(kernel_edit(source))
    state = state_for(ws.root, tmp_path)
    try:
        async with Client(build_task_server(state)) as client:
            with anyio.fail_after(180):
                return await client.call_tool("numerical_probe", args)
    finally:
        await state.aclose()


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
