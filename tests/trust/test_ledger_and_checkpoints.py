"""Attack: the agent forges ledger lines, best pointers and checkpoint manifests in its
workspace, or alters a checkpoint's files, to choose the best score, the restore target, or to
make a restore write outside the workspace. The ledger, checkpoints and best pointers live in
the trusted store; restore writes only the task's editable files, from re-hashed checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnesslab.tools.state.workspace import hash_files

from .support import SMALL, canned_state, init_ws, text_of, tool_calls

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def forge_checkpoint(root: Path, files: dict[str, bytes]) -> str:
    """A checkpoint folder and a best pointer as the pre-store layout had them."""
    digest = hash_files(files)
    folder = root / ".harnesslab/checkpoints" / digest
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    (folder / "manifest.json").write_text(json.dumps({"hash": digest, "files": sorted(files)}))
    for mode in ("dev", "final"):
        (root / f".harnesslab/checkpoints/best-{mode}.json").write_text(
            json.dumps({"hash": digest, "score": 0.001, "record": "forged"})
        )
    return digest


async def test_a_forged_ledger_line_and_manifest_are_never_the_best_nor_restored_outside(
    tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys)
    state = canned_state(root, tmp_path)
    (first,) = await tool_calls(state, ("run_objective", {}))
    assert first.structured_content["status"] == "passed"
    honest = first.structured_content["candidate"]

    # The agent's forgery: a manifest that escapes the workspace, a best pointer to it, and
    # ledger lines with impossible scores on every case set it can name.
    outside = tmp_path / "outside.txt"
    digest = forge_checkpoint(root, {"../outside.txt": b"owned\n", "kernel.py": b"pass\n"})
    (root / ".harnesslab").mkdir(exist_ok=True)
    with open(root / ".harnesslab/history.jsonl", "a") as fh:
        for mode, case_set in (("dev", "all"), ("final", "anything")):
            fh.write(
                json.dumps(
                    {"id": f"forged-{mode}", "mode": mode, "candidate": digest, "status": "passed",
                     "score": 0.001, "case_set": case_set, "time": 1e10}
                ) + "\n"
            )  # fmt: skip

    rank, best_restore, named_restore, ctx = await tool_calls(
        state,
        ("rank_history", {"include_failed": True}),
        ("restore_best_checkpoint", {}),
        ("restore_best_checkpoint", {"candidate": digest}),
        ("inspect_context", {}),
    )
    await state.aclose()
    page = rank.structured_content
    assert page["best"]["candidate"] == honest and page["best"]["score"] > 1.0
    assert digest not in text_of(rank)
    assert not best_restore.is_error and best_restore.structured_content["restored"] == honest
    assert named_restore.is_error and "matches 0 checkpoints" in text_of(named_restore)
    assert ctx.structured_content["best_dev"]["candidate"] == honest
    assert ctx.structured_content["best_final"] is None
    assert not outside.exists()


async def test_an_altered_checkpoint_is_refused_before_it_is_restored(
    tmp_path, monkeypatch, capsys
):
    root = init_ws(tmp_path, monkeypatch, capsys)
    state = canned_state(root, tmp_path)
    (first,) = await tool_calls(state, ("run_objective", {"cases": [SMALL]}))
    digest = first.structured_content["candidate"]
    (root / "kernel.py").write_text("# the agent's next idea\n")

    stored = state.workspace.checkpoints_dir / digest / "kernel.py"
    stored.write_text(stored.read_text() + "\nimport os  # slipped into the checkpoint\n")
    (restore,) = await tool_calls(state, ("restore_best_checkpoint", {"candidate": digest}))
    await state.aclose()
    assert restore.is_error and "altered" in text_of(restore)
    assert (root / "kernel.py").read_text() == "# the agent's next idea\n"
