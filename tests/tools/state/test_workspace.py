"""Workspace.snapshot(): the candidate as one value (the editable files and their hash), and
the launch config of that snapshot, not of the folder as it is by the time a run reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.storage import hash_files
from harnesslab.tools.state.workspace import Candidate, Workspace, init_workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace("rmsnorm_gate", tmp_path / "ws", Settings(state_dir=tmp_path / "s"))


def test_a_snapshot_holds_the_editable_files_and_their_hash(ws):
    snap = ws.snapshot()
    assert snap.files == ws.editable_files() and set(snap.files) == set(ws.task.editable)
    assert snap.digest == ws.candidate_hash() == hash_files(snap.files)
    assert Candidate.of(snap.files) == snap


def test_the_config_of_a_snapshot_is_the_snapshots_not_the_folders_of_later(ws):
    snap = ws.snapshot()
    before = json.loads(snap.files["kernel_config.json"])
    changed = {**before, "num_warps": 8 if before.get("num_warps") != 8 else 4}
    (ws.root / "kernel_config.json").write_text(json.dumps(changed))
    assert ws.read_config(snap) == before
    assert ws.read_config() == changed


def test_a_snapshots_config_is_checked_like_the_folders(ws):
    files = {**ws.snapshot().files, "kernel_config.json": b'{"num_warps": 3}'}
    with pytest.raises(UsageError, match="num_warps"):
        ws.read_config(Candidate.of(files))
    files["kernel_config.json"] = b"[1, 2]"
    with pytest.raises(UsageError, match="expected a JSON object"):
        ws.read_config(Candidate.of(files))
    files["kernel_config.json"] = b" " * (2 << 20)
    with pytest.raises(UsageError, match="the limit is"):
        ws.read_config(Candidate.of(files))
