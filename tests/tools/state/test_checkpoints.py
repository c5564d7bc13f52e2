"""Checkpoints and best pointers (state/checkpoints.py): a manifest lists exactly the task's
editable files; what is staged or restored re-hashes to its name; a best pointer is per mode
and case set; a restore saves the current files first and writes only the editable files,
never through a symlink."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings
from harnesslab.tools.state.checkpoints import Checkpoints
from harnesslab.tools.state.storage import hash_files
from harnesslab.tools.state.workspace import Workspace, init_workspace

ONE = {"kernel.py": b"# one\n", "kernel_config.json": b"{}\n"}
TWO = {"kernel.py": b"# two\n", "kernel_config.json": b"{}\n"}


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    cfg = Settings(state_dir=tmp_path / "state", interpret="always")
    return init_workspace("rmsnorm_gate", tmp_path / "ws", cfg)


# -- manifests ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rels",
    [
        None,
        "kernel.py",
        ["kernel.py", 3],
        ["kernel.py"],
        ["kernel.py", "kernel_config.json", "extra.py"],
        ["../kernel.py", "kernel_config.json"],
        ["/abs/kernel.py", "kernel_config.json"],
    ],
    ids=["none", "string", "non-str", "missing", "extra", "dotdot", "absolute"],
)
def test_a_manifest_lists_exactly_the_editable_files_as_safe_paths(ws: Workspace, rels) -> None:
    with pytest.raises(UsageError):
        Checkpoints(ws).check_files(rels)


def test_a_manifest_entry_is_refused_for_what_it_is(ws: Workspace) -> None:
    with pytest.raises(UsageError, match="not a list of paths"):
        Checkpoints(ws).check_files(["kernel.py", 3])
    with pytest.raises(UsageError, match="checkpoint file '../kernel.py'"):
        Checkpoints(ws).check_files(["../kernel.py", "kernel_config.json"])


def test_the_editable_files_in_any_order_are_a_valid_manifest(ws: Workspace) -> None:
    rels = ["kernel_config.json", "kernel.py"]
    assert Checkpoints(ws).check_files(rels) == rels


def test_save_stores_the_files_under_their_hash_once(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    digest = ckpt.save(ONE)
    assert digest == hash_files(ONE)
    folder = ckpt.root / digest
    assert json.loads((folder / "manifest.json").read_text()) == {
        "hash": digest,
        "files": ["kernel.py", "kernel_config.json"],
    }
    assert (folder / "kernel.py").read_bytes() == ONE["kernel.py"]
    (folder / "kernel.py").write_bytes(b"# altered\n")
    assert ckpt.save(ONE) == digest  # an existing checkpoint is not rewritten
    assert (folder / "kernel.py").read_bytes() == b"# altered\n"


def test_save_without_files_checkpoints_the_workspace_as_it_is(ws: Workspace) -> None:
    assert Checkpoints(ws).save() == ws.candidate_hash()


def test_save_refuses_files_other_than_the_editable_ones(ws: Workspace) -> None:
    with pytest.raises(UsageError):
        Checkpoints(ws).save({"kernel.py": b"x"})
    assert not Checkpoints(ws).root.exists() or not any(Checkpoints(ws).root.iterdir())


@pytest.mark.parametrize("name", ["", "abc12", "ABCDEF12", "../../x", "g" * 16, "a" * 65])
def test_only_a_hex_hash_of_a_saved_checkpoint_exists(ws: Workspace, name: str) -> None:
    assert Checkpoints(ws).exists(name) is False


def test_a_name_that_is_not_a_hash_never_reaches_the_filesystem(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    ckpt.root.mkdir(parents=True, exist_ok=True)
    (ckpt.root.parent / "planted").mkdir()
    (ckpt.root.parent / "planted/manifest.json").write_text("{}")
    (ckpt.root / "ABCDEF12").mkdir()
    (ckpt.root / "ABCDEF12/manifest.json").write_text("{}")
    assert ckpt.exists("../planted") is False
    assert ckpt.exists("ABCDEF12") is False
    assert ckpt.exists(None) is False  # type: ignore[arg-type]


def test_a_saved_checkpoint_exists_and_reads_back(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    digest = ckpt.save(ONE)
    assert ckpt.exists(digest) and ckpt.exists(digest[:16])
    assert ckpt.files(digest) == ONE
    assert not ckpt.exists("abcdef")


# -- re-hashing ----------------------------------------------------------------------------------
def test_an_altered_checkpoint_is_refused(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    digest = ckpt.save(ONE)
    (ckpt.root / digest / "kernel.py").write_bytes(b"# slipped in\n")
    with pytest.raises(UsageError, match="altered"):
        ckpt.files(digest)


def test_a_missing_or_damaged_checkpoint_is_refused(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    with pytest.raises(UsageError, match="no checkpoint"):
        ckpt.files("abcdef12")
    digest = ckpt.save(ONE)
    (ckpt.root / digest / "kernel_config.json").unlink()
    with pytest.raises(UsageError, match="damaged"):
        ckpt.files(digest)
    other = ckpt.save(TWO)
    (ckpt.root / other / "manifest.json").write_text("{not json")
    with pytest.raises(UsageError, match="damaged"):
        ckpt.files(other)


@pytest.mark.parametrize("manifest", [[1, 2], {"files": ["../../escape.py", "kernel.py"]}])
def test_a_manifest_naming_other_files_is_refused(ws: Workspace, manifest) -> None:
    ckpt = Checkpoints(ws)
    digest = ckpt.save(ONE)
    (ckpt.root / digest / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError):
        ckpt.files(digest)


# -- best pointers -------------------------------------------------------------------------------
def test_best_pointers_are_per_mode_and_case_set(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    ckpt.set_best("dev", "aaaa1111", 10.0, "r1", case_set="all")
    ckpt.set_best("dev", "bbbb2222", 20.0, "r2", case_set="one")
    ckpt.set_best("final", "cccc3333", 30.0, "r3", case_set="all")
    assert ckpt.best("dev", case_set="all") == {
        "mode": "dev",
        "case_set": "all",
        "hash": "aaaa1111",
        "score": 10.0,
        "record": "r1",
    }
    assert ckpt.best("dev", case_set="one")["hash"] == "bbbb2222"
    assert ckpt.best("final", case_set="all")["hash"] == "cccc3333"
    assert ckpt.best("final", case_set="one") is None
    ckpt.set_best("dev", "dddd4444", 5.0, "r4", case_set="all")
    assert ckpt.best("dev", case_set="all")["hash"] == "dddd4444"


def test_best_pointers_keep_their_file_names_across_versions(ws: Workspace) -> None:
    # The pointer's name is part of the store's layout: a store written by an earlier
    # version must keep its best pointers.
    ckpt = Checkpoints(ws)
    ckpt.set_best("final", "aaaa1111", 1.0, "r1", case_set="final-0123456789ab")
    key = hashlib.sha256(b"final\0final-0123456789ab").hexdigest()[:20]
    assert [p.name for p in (ckpt.root / "best").iterdir()] == [f"{key}.json"]


def test_a_damaged_best_pointer_reads_as_none(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    ckpt.set_best("dev", "aaaa1111", 10.0, "r1", case_set="all")
    (path,) = (ckpt.root / "best").glob("*.json")
    path.write_text("{torn")
    assert ckpt.best("dev", case_set="all") is None
    path.write_text("[1, 2]")
    assert ckpt.best("dev", case_set="all") is None


def test_the_latest_best_is_the_most_recently_set_pointer_of_the_mode(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    assert ckpt.latest_best("final") is None
    for i in range(4):
        ckpt.set_best("final", f"aaaa111{i}", 1.0, f"r{i}", case_set=f"s{i}")
    ckpt.set_best("dev", "cccc3333", 1.0, "rd", case_set="all")
    # Newest by time is the first by name, so neither name order nor creation order works.
    finals = sorted(p for p in (ckpt.root / "best").glob("*.json") if '"final"' in p.read_text())
    for t, path in enumerate(reversed(finals)):
        os.utime(path, (100 + t, 100 + t))
    newest = json.loads(finals[0].read_text())["hash"]
    assert ckpt.latest_best("final")["hash"] == newest
    assert ckpt.latest_best("dev")["hash"] == "cccc3333"
    assert ckpt.latest_best("other") is None
    finals[0].write_text("[1, 2]")  # not a pointer: the next newest answers
    assert ckpt.latest_best("final")["hash"] == json.loads(finals[1].read_text())["hash"]


def test_an_unreadable_pointer_is_skipped_for_the_next_latest(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    ckpt.set_best("final", "aaaa1111", 1.0, "r1", case_set="s1")
    ckpt.set_best("final", "bbbb2222", 1.0, "r2", case_set="s2")
    for path in (ckpt.root / "best").glob("*.json"):
        data = json.loads(path.read_text())
        t = 100 if data["case_set"] == "s1" else 200
        if data["case_set"] == "s2":
            path.write_text("{torn")
        os.utime(path, (t, t))
    assert ckpt.latest_best("final")["hash"] == "aaaa1111"


# -- restore -------------------------------------------------------------------------------------
def test_a_restore_saves_the_current_files_first_and_writes_only_what_changed(
    ws: Workspace,
) -> None:
    ckpt = Checkpoints(ws)
    target = ckpt.save(TWO)
    (ws.root / "kernel.py").write_bytes(ONE["kernel.py"])
    (ws.root / "kernel_config.json").write_bytes(ONE["kernel_config.json"])
    done = ckpt.restore(target)
    assert done == {"previous": hash_files(ONE), "restored": target, "changed": ["kernel.py"]}
    assert ckpt.files(hash_files(ONE)) == ONE  # the current files were kept
    assert ws.editable_files() == TWO


def test_a_restore_repairs_a_missing_file_and_has_no_previous(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    target = ckpt.save(TWO)
    (ws.root / "kernel_config.json").write_bytes(TWO["kernel_config.json"])
    (ws.root / "kernel.py").unlink()
    done = ckpt.restore(target)
    assert done == {"previous": None, "restored": target, "changed": ["kernel.py"]}
    assert ws.editable_files() == TWO


def test_a_restore_replaces_a_planted_symlink_and_never_writes_through_it(
    ws: Workspace, tmp_path: Path
) -> None:
    ckpt = Checkpoints(ws)
    target = ckpt.save(TWO)
    outside = tmp_path / "outside.py"
    outside.write_text("untouched\n")
    (ws.root / "kernel.py").unlink()
    (ws.root / "kernel.py").symlink_to(outside)
    done = ckpt.restore(target)
    assert done["previous"] is None and "kernel.py" in done["changed"]
    assert outside.read_text() == "untouched\n"
    assert not (ws.root / "kernel.py").is_symlink()
    assert (ws.root / "kernel.py").read_bytes() == TWO["kernel.py"]


def test_an_altered_checkpoint_is_never_restored(ws: Workspace) -> None:
    ckpt = Checkpoints(ws)
    target = ckpt.save(TWO)
    (ckpt.root / target / "kernel.py").write_bytes(b"import os\n")
    before = ws.editable_files()
    with pytest.raises(UsageError, match="altered"):
        ckpt.restore(target)
    assert ws.editable_files() == before
