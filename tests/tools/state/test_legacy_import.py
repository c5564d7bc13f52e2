"""Each rule of the one-time import of a pre-store workspace (tools/state/legacy_import.py),
called directly on a fresh workspace: what is copied, what is marked, what is skipped and
said, what is never believed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnesslab.tools.settings import Settings
from harnesslab.tools.state import legacy_import as li
from harnesslab.tools.state.storage import hash_files
from harnesslab.tools.state.workspace import Workspace, init_workspace

FILES = {"kernel.py": b"# old\n", "kernel_config.json": b"{}\n"}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    cfg = Settings(state_dir=tmp_path / "state", interpret="always")
    return init_workspace("rmsnorm_gate", tmp_path / "ws", cfg)


def ledger(ws: Workspace) -> list[dict]:
    path = ws.store.ledger_path
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def checkpoint(ws: Workspace, name: str, files: dict[str, bytes], listed: object) -> None:
    folder = ws.root / ".harnesslab" / "checkpoints" / name
    folder.mkdir(parents=True)
    for rel, data in files.items():
        (folder / rel).write_bytes(data)
    (folder / "manifest.json").write_text(json.dumps({"files": listed}))


def test_ledger_records_are_copied_marked_untrusted_and_the_rest_said(ws: Workspace) -> None:
    (ws.root / ".harnesslab" / "history.json").unlink(missing_ok=True)
    (ws.root / ".harnesslab" / "history.jsonl").write_text(
        '{"id": "a", "untrusted": false, "score": 1.0}\n\n  \n{not json\n[1, 2]\n{"id": "b"}\n'
    )
    info = li.import_legacy(ws)
    assert [(r["id"], r["untrusted"], r["imported"]) for r in ledger(ws)] == [
        ("a", True, True), ("b", True, True)]  # fmt: skip
    assert info["ledger_records"] == 2
    assert info["skipped"] == [".harnesslab/history.jsonl line 4: not a JSON record"]
    assert (ws.root / ".harnesslab" / "history.json").is_file()  # the view, refreshed
    saved = json.loads(ws.store.imported_path.read_text())
    assert saved["ledger_records"] == 2 and saved["skipped"] == info["skipped"] and saved["time"]


def test_an_empty_import_writes_no_history_view(ws: Workspace) -> None:
    view = ws.root / ".harnesslab" / "history.json"
    view.unlink(missing_ok=True)
    info = li.import_legacy(ws)
    assert info == {"ledger_records": 0, "checkpoints": 0, "skipped": [], "unprojected": []}
    assert not view.exists() and ledger(ws) == []


def test_a_ledger_too_large_or_linked_is_skipped_and_said(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel = ws.root / ".harnesslab" / "history.jsonl"
    rel.write_text('{"id": "a"}\n' * 10)
    monkeypatch.setattr(li, "MAX_LEGACY_LEDGER_BYTES", 100)
    info = li.import_legacy(ws)
    assert info["ledger_records"] == 0 and ledger(ws) == []
    assert len(info["skipped"]) == 1 and info["skipped"][0].startswith(".harnesslab/history.jsonl:")
    monkeypatch.setattr(li, "MAX_LEGACY_LEDGER_BYTES", 1 << 20)
    (tmp_path / "elsewhere.jsonl").write_text('{"id": "a"}\n')
    rel.unlink()
    rel.symlink_to(tmp_path / "elsewhere.jsonl")
    info = li.import_legacy(ws)
    assert info["ledger_records"] == 0 and ledger(ws) == []
    assert len(info["skipped"]) == 1 and info["skipped"][0].startswith(".harnesslab/history.jsonl:")


def test_a_ledger_of_64_mib_is_read_and_one_byte_more_is_skipped(ws: Workspace) -> None:
    """The bound itself (the test above moves it): a record, then blank padding to the size."""
    rel = ws.root / ".harnesslab" / "history.jsonl"
    record = b'{"id": "a"}\n'
    rel.write_bytes(record + b" " * ((64 << 20) - len(record)))
    assert rel.stat().st_size == 64 << 20
    assert li.import_legacy(ws)["ledger_records"] == 1
    with rel.open("ab") as fh:
        fh.write(b" ")
    info = li.import_legacy(ws)
    assert info["ledger_records"] == 0
    assert len(info["skipped"]) == 1 and info["skipped"][0].startswith(".harnesslab/history.jsonl:")


def test_checkpoints_are_rehashed_and_a_wrong_one_is_skipped_and_said(ws: Workspace) -> None:
    checkpoint(ws, "forged-name", FILES, sorted(FILES))
    checkpoint(ws, "x" * 80, FILES, ["kernel.py"])
    checkpoint(ws, "no-manifest", FILES, [])
    (ws.root / ".harnesslab" / "checkpoints" / "no-manifest" / "manifest.json").unlink()
    info = li.import_legacy(ws)
    assert info["checkpoints"] == 1
    digest = hash_files(FILES)
    assert (ws.checkpoints_dir / digest / "manifest.json").is_file()
    assert not (ws.checkpoints_dir / "forged-name").exists()
    assert [s.split(":")[0] for s in info["skipped"]] == [f"checkpoint {'x' * 64}"]


def test_servers_named_by_the_old_state_are_taken_out_of_the_clients_configs(ws: Workspace) -> None:
    state = ws.root / ".harnesslab"
    (state / "mcp" / "from-dir").mkdir(parents=True)
    (state / "mcp" / "Not_A_Name").mkdir()
    servers = {"evil": {}, "Bad Name": {}, "kept-too": {}}
    (state / "registry.json").write_text(json.dumps({"servers": servers}))
    entries = {n: {"command": "sh"} for n in ("evil", "from-dir", "mine", "Not_A_Name")}
    (ws.root / ".mcp.json").write_text(json.dumps({"mcpServers": entries}))
    info = li.import_legacy(ws)
    assert info["unprojected"] == ["evil", "from-dir"]  # sorted; only those it was in
    left = json.loads((ws.root / ".mcp.json").read_text())["mcpServers"]
    assert sorted(left) == ["Not_A_Name", "mine"]
    assert info["skipped"] == []


def test_a_registry_that_is_not_json_is_skipped_and_said_and_the_folder_names_still_count(
    ws: Workspace,
) -> None:
    state = ws.root / ".harnesslab"
    (state / "mcp" / "from-dir").mkdir(parents=True)
    (state / "registry.json").write_text("{not json")
    (ws.root / ".mcp.json").write_text(json.dumps({"mcpServers": {"from-dir": {"command": "x"}}}))
    info = li.import_legacy(ws)
    assert [s.split(":")[0] for s in info["skipped"]] == ["registry.json"]
    assert info["unprojected"] == ["from-dir"]


def test_at_most_fifty_skips_are_kept(ws: Workspace) -> None:
    (ws.root / ".harnesslab" / "history.jsonl").write_text("{bad\n" * 60)
    info = li.import_legacy(ws)
    assert len(info["skipped"]) == 50 and info["skipped"][-1].endswith("line 50: not a JSON record")


@pytest.mark.parametrize("servers", [None, [1, "evil"]])
def test_a_registry_whose_servers_are_no_table_breaks_nothing(ws: Workspace, servers) -> None:
    (ws.root / ".harnesslab" / "registry.json").write_text(json.dumps({"servers": servers}))
    (ws.root / ".mcp.json").write_text(json.dumps({"mcpServers": {"evil": {"command": "sh"}}}))
    info = li.import_legacy(ws)
    assert info["unprojected"] == ([] if servers is None else ["evil"])


def test_a_client_config_that_cannot_be_edited_is_skipped_and_said(ws: Workspace) -> None:
    (ws.root / ".harnesslab" / "mcp" / "from-dir").mkdir(parents=True)
    (ws.root / ".mcp.json").write_text("{not json")
    info = li.import_legacy(ws)
    assert info["unprojected"] == []
    assert [s.split(":")[0] for s in info["skipped"]] == ["projection of from-dir"]
