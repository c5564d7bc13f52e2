"""A workspace made before the trusted store still opens: its `.harnesslab/` is imported once,
as untrusted input. Ledger records are kept but marked untrusted and never a best until
re-scored; checkpoints are re-hashed; the old registry is not believed and the servers it had
projected into the clients' configs are taken out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harnesslab.servers.builtin import ServerState
from harnesslab.tools.state.workspace import hash_files
from harnesslab.tools.task.spec import tasks_root

from .support import TASK, settings_for, text_of, tool_calls

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def old_workspace(tmp: Path) -> tuple[Path, str]:
    """The pre-store layout, with what an agent could have left in it."""
    root = tmp / "old"
    shutil.copytree(tasks_root() / TASK / "workspace", root)
    state = root / ".harnesslab"
    state.mkdir()
    (state / "task.json").write_text(json.dumps({"task": TASK, "task_root": str(tmp / "x")}))
    files = {rel: (root / rel).read_bytes() for rel in ("kernel.py", "kernel_config.json")}
    digest = hash_files(files)
    for rel, data in files.items():
        (state / "checkpoints" / digest).mkdir(parents=True, exist_ok=True)
        (state / "checkpoints" / digest / rel).write_bytes(data)
    (state / "checkpoints" / digest / "manifest.json").write_text(
        json.dumps({"hash": digest, "files": sorted(files)})
    )
    records = [
        {"id": "old-dev", "mode": "dev", "candidate": digest, "status": "passed", "score": 50.0,
         "case_set": "all", "time": 1.0},
        {"id": "forged", "mode": "final", "candidate": digest, "status": "passed",
         "score": 0.001, "case_set": "final-000000000000", "time": 2.0},
    ]  # fmt: skip
    (state / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    evil = {"name": "evil", "status": "registered", "tools": ["x"]}
    (state / "registry.json").write_text(json.dumps({"servers": {"evil": evil}}))
    (root / ".mcp.json").write_text(
        json.dumps({"mcpServers": {"evil": {"command": "sh"}, "mine": {"command": "x"}}})
    )
    return root, digest


async def test_a_pre_store_workspace_opens_with_its_state_imported_as_untrusted(tmp_path):
    root, digest = old_workspace(tmp_path)
    state = ServerState.open(root, settings_for(tmp_path))
    ctx, final, dev, restore_final, restore_named = await tool_calls(
        state,
        ("inspect_context", {}),
        ("rank_history", {"mode": "final", "include_failed": True}),
        ("rank_history", {"include_failed": True}),
        ("restore_best_checkpoint", {"mode": "final"}),
        ("restore_best_checkpoint", {"candidate": digest}),
    )
    await state.aclose()
    assert ctx.structured_content["task"]["name"] == TASK
    assert ctx.structured_content["best_final"] is None
    assert ctx.structured_content["best_dev"] is None
    for page in (final.structured_content, dev.structured_content):
        assert page["best"] is None
        assert [(c["rank"], c["untrusted"]) for c in page["candidates"]] == [(None, True)]
    assert restore_final.is_error and "no passing final candidate" in text_of(restore_final)
    assert not restore_named.is_error  # the checkpoint was re-hashed and kept
    servers = json.loads((root / ".mcp.json").read_text())["mcpServers"]
    assert servers == {"mine": {"command": "x"}}


async def test_the_import_happens_once(tmp_path):
    root, _ = old_workspace(tmp_path)
    state = ServerState.open(root, settings_for(tmp_path))
    before = len(state.workspace.ledger().records())
    await state.aclose()
    with open(root / ".harnesslab/history.jsonl", "a") as fh:
        fh.write(json.dumps({"mode": "dev", "status": "passed", "score": 0.1}) + "\n")
    again = ServerState.open(root, settings_for(tmp_path))
    assert len(again.workspace.ledger().records()) == before == 2
    await again.aclose()
