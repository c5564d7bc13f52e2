"""Scores compare only within a case set (issue 14, ledger side): a run on one dev case sums one
median, a run on all of them sums nine, so a one-case run is never "best" against a full run,
in the ranking, the best pointer, inspect_context or a restore; every ranked score says which
case set it is on."""

from __future__ import annotations

import json

import pytest

from .support import SMALL, canned_state, init_ws, tool_calls

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_one_case_run_is_never_best_against_a_full_run(tmp_path, monkeypatch, capsys):
    root = init_ws(tmp_path, monkeypatch, capsys)
    state = canned_state(root, tmp_path)
    (full,) = await tool_calls(state, ("run_objective", {}))
    config = json.loads((root / "kernel_config.json").read_text())
    (root / "kernel_config.json").write_text(json.dumps({**config, "num_warps": 8}))
    one, rank, rank_one, restore, ctx = await tool_calls(
        state,
        ("run_objective", {"cases": [SMALL]}),
        ("rank_history", {}),
        ("rank_history", {"case_set": SMALL}),
        ("restore_best_checkpoint", {}),
        ("inspect_context", {}),
    )
    await state.aclose()
    full_c, one_c = full.structured_content, one.structured_content
    assert one_c["score"] < full_c["score"]  # fewer cases, smaller sum
    assert one_c["best_score"] is None  # nothing to compare with on its own case set

    page = rank.structured_content
    assert [c["candidate"] for c in page["candidates"]] == [full_c["candidate"]]
    assert page["case_set"] == "all" and set(page["case_sets"]) == {"all", SMALL}
    assert page["best"]["case_set"] == "all"
    assert rank_one.structured_content["best"]["candidate"] == one_c["candidate"]
    assert restore.structured_content["restored"] == full_c["candidate"]
    assert restore.structured_content["case_set"] == "all"
    assert ctx.structured_content["best_dev"]["candidate"] == full_c["candidate"]
