"""The trusted store's files (state/storage.py, trusted_store.py, secrets_store.py): atomic
writes, fsynced appends that survive a torn line, the candidate hash, the store's layout and
binding, and the hidden-case secret. Rules pinned through the public functions."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from harnesslab.tools.errors import DiskFull, UsageError
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import storage
from harnesslab.tools.state.secrets_store import adopt_secret, case_set_id, workspace_secret
from harnesslab.tools.state.trusted_store import (
    TrustedStore,
    ensure_outside_workspace,
    private_dir,
    workspace_key,
)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each fsync's file size at the time: the data was written before it was synced."""
    seen: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: seen.append(os.fstat(fd).st_size))
    return seen


# -- storage -------------------------------------------------------------------------------------
def test_an_atomic_write_makes_its_folders_syncs_its_data_and_leaves_no_temp_file(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    path = tmp_path / "a/b/doc.json"
    storage.atomic_write_json(path, {"b": 1, "a": [1]})
    assert path.read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'
    assert fsyncs == [path.stat().st_size]
    storage.atomic_write_text(path, "second")
    assert path.read_text() == "second" and os.listdir(path.parent) == ["doc.json"]


def test_the_temp_file_is_a_hidden_sibling_of_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(os, "fsync", lambda fd: seen.append(os.listdir(tmp_path)))
    storage.atomic_write_bytes(tmp_path / "doc.json", b"x")
    ((temp,),) = seen
    assert temp.startswith(".doc.json.") and temp.endswith(".tmp")


def test_a_failed_atomic_write_keeps_the_old_file_and_removes_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "doc.txt"
    storage.atomic_write_bytes(path, b"old")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(DiskFull, match="no space left in"):  # named, with the folder
        storage.atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["doc.txt"]


def test_the_candidate_hash_covers_names_and_contents_in_any_order() -> None:
    a = {"kernel.py": b"x", "cfg.json": b"{}"}
    digest = storage.hash_files(a)
    expected = hashlib.sha256(b"cfg.json\0{}\0kernel.py\0x\0").hexdigest()[:16]
    assert digest == expected
    assert storage.hash_files(dict(reversed(list(a.items())))) == digest
    assert storage.hash_files({"ab": b"c"}) != storage.hash_files({"a": b"bc"})
    assert storage.hash_files({"kernel.py": b"y", "cfg.json": b"{}"}) != digest


def test_appends_are_one_sorted_compact_line_each_and_fsynced(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    path = tmp_path / "new/log.jsonl"
    storage.append_jsonl(path, {"b": 1, "a": "x"})
    storage.append_jsonl(path, {"c": [1, 2]})
    assert path.read_text() == '{"a":"x","b":1}\n{"c":[1,2]}\n'
    assert fsyncs == [16, 28]


def test_an_append_after_a_one_byte_torn_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "a/b/log.jsonl"  # folders made as needed
    storage.append_jsonl(path, {"a": 1})
    path.write_text("{")
    storage.append_jsonl(path, {"b": 2})
    assert path.read_text() == '{\n{"b":2}\n'
    assert list(storage.read_jsonl(path)) == [{"b": 2}]


def test_an_append_after_a_torn_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n{"torn": ')
    storage.append_jsonl(path, {"b": 2})
    assert list(storage.read_jsonl(path)) == [{"a": 1}, {"b": 2}]
    assert path.read_text().endswith('{"torn": \n{"b":2}\n')


def test_reading_skips_blank_torn_and_non_object_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert list(storage.read_jsonl(path)) == []  # missing: nothing
    path.write_bytes(b'{"a": 1}\n\n   \n[1]\n"s"\n{"b": "\xff"}\n{"torn": ')
    assert list(storage.read_jsonl(path)) == [{"a": 1}, {"b": "\ufffd"}]


def test_an_append_that_does_not_fit_is_cut_back_and_named_disk_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    storage.append_jsonl(path, {"a": 1})
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))  # a short write, then no space
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(DiskFull) as info:
        storage.append_jsonl(path, {"b": 22})
    assert path.read_text() == '{"a":1}\n'  # no half a record
    assert (info.value.path, info.value.needed_bytes) == (str(tmp_path), len('{"b":22}\n') + 1)
    assert isinstance(info.value.__cause__, OSError)


def test_an_append_whose_sync_fails_is_cut_back_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log.jsonl"
    storage.append_jsonl(path, {"a": 1})

    def no_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", no_sync)
    with pytest.raises(OSError, match="Input/output") as info:
        storage.append_jsonl(path, {"b": 2})
    assert not isinstance(info.value, DiskFull)  # only no-space errors are renamed
    assert path.read_text() == '{"a":1}\n'


def test_short_writes_are_continued_until_the_line_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    path = tmp_path / "log.jsonl"
    storage.append_jsonl(path, {"key": "value"})
    storage.append_jsonl(path, {"k": 2})
    assert path.read_text() == '{"key":"value"}\n{"k":2}\n'


def test_an_appended_file_is_0644_and_its_descriptor_closed(tmp_path: Path) -> None:
    open_fds = len(os.listdir("/proc/self/fd"))
    old = os.umask(0)
    try:
        storage.append_jsonl(tmp_path / "log.jsonl", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "log.jsonl").stat().st_mode & 0o777 == 0o644
    assert len(os.listdir("/proc/self/fd")) == open_fds


# -- running out of space ------------------------------------------------------------------------
class FakeStatvfs:
    def __init__(self) -> None:
        self.asked: list[Path] = []

    def __call__(self, folder: Path) -> os.statvfs_result:
        self.asked.append(Path(folder))
        return os.statvfs_result((4096, 4096, 100, 50, 3, 10, 5, 5, 0, 255))  # f_bavail 3


def test_free_bytes_are_the_unprivileged_blocks_of_the_nearest_existing_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeStatvfs()
    monkeypatch.setattr(os, "statvfs", fake)
    assert storage.free_bytes(tmp_path / "a/b/c.json") == 3 * 4096
    assert storage.free_bytes(tmp_path) == 3 * 4096
    assert fake.asked == [tmp_path, tmp_path]


def test_free_bytes_walk_stops_at_the_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeStatvfs()
    monkeypatch.setattr(os, "statvfs", fake)
    seen: list[Path] = []

    def nothing_exists(self: Path) -> bool:
        seen.append(self)
        assert len(seen) < 100, "the walk did not stop at the root"
        return False

    monkeypatch.setattr(Path, "exists", nothing_exists)
    assert storage.free_bytes(tmp_path / "x") == 3 * 4096
    assert fake.asked == [Path("/")]


def test_free_bytes_are_unknown_when_the_filesystem_cannot_be_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(folder: Path) -> os.statvfs_result:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(os, "statvfs", refused)
    assert storage.free_bytes(tmp_path) is None


@pytest.mark.parametrize("code", [28, 122])  # ENOSPC, EDQUOT
def test_a_no_space_error_is_disk_full_naming_the_folder_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # A fake filesystem: the real one's free bytes change between two reads when other tests
    # write beside this one (make test-fast's workers), which failed this test once in a run.
    fake = FakeStatvfs()
    monkeypatch.setattr(os, "statvfs", fake)
    exc = OSError(code, "No space", str(tmp_path / "elsewhere/file"))
    full = storage.disk_full_of(exc, tmp_path, needed_bytes=7)
    assert full is not None
    assert (full.path, full.needed_bytes, full.free_bytes) == (str(tmp_path), 7, 3 * 4096)
    assert fake.asked == [tmp_path]


def test_without_a_folder_given_disk_full_names_the_files_folder_or_a_question_mark(
    tmp_path: Path,
) -> None:
    full = storage.disk_full_of(OSError(28, "No space", str(tmp_path / "doc.json")))
    assert full is not None and (full.path, full.needed_bytes) == (str(tmp_path), None)
    bare = storage.disk_full_of(OSError(28, "No space"))
    assert bare is not None and bare.path == "?"


@pytest.mark.parametrize("exc", [OSError(13, "Permission denied"), ValueError("x"), OSError()])
def test_other_errors_are_not_disk_full(tmp_path: Path, exc: BaseException) -> None:
    assert storage.disk_full_of(exc, tmp_path) is None


def test_named_disk_full_renames_only_no_space_errors(tmp_path: Path) -> None:
    with storage.named_disk_full(tmp_path, 5):
        pass  # nothing raised: nothing to rename
    no_space = OSError(28, "No space left on device")
    with pytest.raises(DiskFull) as info, storage.named_disk_full(tmp_path, 5):
        raise no_space
    assert info.value.__cause__ is no_space
    assert (info.value.path, info.value.needed_bytes) == (str(tmp_path), 5)
    denied = OSError(13, "Permission denied")
    with pytest.raises(OSError) as raw, storage.named_disk_full(tmp_path, 5):
        raise denied
    assert raw.value is denied


@pytest.mark.parametrize(
    ("free", "refused"), [(None, False), (1000 + 65536, False), (1000 + 65535, True), (0, True)]
)
def test_require_space_asks_for_the_write_plus_64_kib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int | None, refused: bool
) -> None:
    monkeypatch.setattr(storage, "free_bytes", lambda folder: free)
    if not refused:
        storage.require_space(tmp_path, 1000)
        return
    with pytest.raises(DiskFull) as info:
        storage.require_space(tmp_path, 1000)
    assert (info.value.path, info.value.needed_bytes, info.value.free_bytes) == (
        str(tmp_path),
        1000 + 65536,
        free,
    )


# -- the trusted store ---------------------------------------------------------------------------
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state", interpret="always")


def test_a_workspace_key_is_its_resolved_path_hashed(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "ws")
    key = workspace_key(tmp_path / "ws")
    assert key == hashlib.sha256(str((tmp_path / "ws").resolve()).encode()).hexdigest()[:24]
    assert workspace_key(tmp_path / "alias") == key
    assert workspace_key(tmp_path / "ws/../ws") == key
    assert workspace_key(tmp_path / "other") != key


@pytest.mark.parametrize("state", ["ws", "ws/state", "ws/a/b/state"])
def test_a_state_dir_in_or_at_the_workspace_is_refused(tmp_path: Path, state: str) -> None:
    (tmp_path / "ws").mkdir()
    cfg = Settings(state_dir=tmp_path / state)
    with pytest.raises(UsageError, match="inside the workspace"):
        ensure_outside_workspace(cfg, tmp_path / "ws")
    with pytest.raises(UsageError, match="inside the workspace"):
        TrustedStore(cfg, tmp_path / "ws")


@pytest.mark.parametrize("state", ["state", "wss", "ws-state"])
def test_a_state_dir_beside_the_workspace_is_fine(tmp_path: Path, state: str) -> None:
    (tmp_path / "ws").mkdir()
    ensure_outside_workspace(Settings(state_dir=tmp_path / state), tmp_path / "ws")


def test_the_store_is_private_and_laid_out_by_workspace_key(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    store = TrustedStore(settings(tmp_path), tmp_path / "ws")
    key = workspace_key(tmp_path / "ws")
    assert store.root == (tmp_path / "state/workspaces" / key).resolve()
    assert TrustedStore.location(settings(tmp_path), tmp_path / "ws") == store.root
    for folder in (store.root, store.root.parent, store.root.parent.parent):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    names = {
        "ledger_path": "history.jsonl",
        "hidden_results_path": "hidden-results.jsonl",
        "checkpoints_dir": "checkpoints",
        "runs_dir": "runs",
        "registry_path": "registry.json",
        "registry_lock": "registry.lock",
        "qualifications_dir": "qualifications",
        "servers_dir": "servers",
        "binding_path": "binding.json",
        "imported_path": "imported.json",
    }
    assert {k: getattr(store, k) for k in names} == {k: store.root / v for k, v in names.items()}


def test_private_dir_makes_parents_and_tightens_an_existing_folder(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir(mode=0o755)
    assert private_dir(tmp_path / "open") == tmp_path / "open"
    assert (tmp_path / "open").stat().st_mode & 0o777 == 0o700
    private_dir(tmp_path / "a/b/c")
    assert (tmp_path / "a/b/c").stat().st_mode & 0o777 == 0o700


def test_a_binding_records_the_task_and_a_folder_tasks_text_with_its_hash(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    store = TrustedStore(settings(tmp_path), tmp_path / "ws")
    assert store.binding() is None
    store.bind(task="t", task_root=tmp_path / "task", task_toml='name = "t"\n', how="init")
    bound = store.binding()
    assert bound is not None
    assert {k: bound[k] for k in ("task", "task_root", "task_toml", "how", "workspace")} == {
        "task": "t",
        "task_root": str(tmp_path / "task"),
        "task_toml": 'name = "t"\n',
        "how": "init",
        "workspace": str((tmp_path / "ws").resolve()),
    }
    assert bound["task_toml_sha256"] == hashlib.sha256(b'name = "t"\n').hexdigest()
    assert isinstance(bound["bound_at"], float)
    store.bind(task="rmsnorm_gate", task_root=None, task_toml=None, how="first open")
    bound = store.binding()
    assert bound is not None
    assert (bound["task_root"], bound["task_toml"], bound["task_toml_sha256"]) == (None,) * 3


def test_a_damaged_binding_is_an_error_and_a_non_object_none(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    store = TrustedStore(settings(tmp_path), tmp_path / "ws")
    store.binding_path.write_text("{torn")
    with pytest.raises(UsageError, match="damaged"):
        store.binding()
    store.binding_path.write_text("[1]")
    assert store.binding() is None


# -- the hidden-case secret ----------------------------------------------------------------------
def test_the_secret_is_made_once_kept_private_and_replaced_on_rotate(tmp_path: Path) -> None:
    cfg, ws = settings(tmp_path), tmp_path / "ws"
    first = workspace_secret(cfg, ws)
    assert len(first["seed"]) == 64 and first["generation"] == 1
    assert int(first["seed"], 16) >= 0 and isinstance(first["created"], float)
    assert workspace_secret(cfg, ws) == first
    path = cfg.secrets_dir() / f"{workspace_key(ws)}.json"
    assert json.loads(path.read_text()) == first
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    rotated = workspace_secret(cfg, ws, rotate=True)
    assert rotated["seed"] != first["seed"] and rotated["generation"] == 2
    assert workspace_secret(cfg, ws) == rotated
    assert workspace_secret(cfg, tmp_path / "other")["seed"] != rotated["seed"]


def test_a_damaged_secret_is_replaced(tmp_path: Path) -> None:
    cfg, ws = settings(tmp_path), tmp_path / "ws"
    workspace_secret(cfg, ws)
    path = cfg.secrets_dir() / f"{workspace_key(ws)}.json"
    path.write_text("{torn")
    fresh = workspace_secret(cfg, ws)
    assert fresh["generation"] == 1 and json.loads(path.read_text()) == fresh


def test_an_adopted_secret_is_the_workspaces_secret(tmp_path: Path) -> None:
    cfg = settings(tmp_path)
    theirs = workspace_secret(cfg, tmp_path / "a")
    adopt_secret(cfg, tmp_path / "b", theirs)
    assert workspace_secret(cfg, tmp_path / "b") == theirs
    path = cfg.secrets_dir() / f"{workspace_key(tmp_path / 'b')}.json"
    assert path.stat().st_mode & 0o777 == 0o600


def test_adopting_a_secret_into_a_new_state_dir_makes_it_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        cfg = Settings(state_dir=tmp_path / "fresh/state")
        adopt_secret(cfg, tmp_path / "b", {"seed": "ab" * 32, "created": 1.0, "generation": 3})
    finally:
        os.umask(old)
    assert cfg.secrets_dir().stat().st_mode & 0o777 == 0o700
    assert workspace_secret(cfg, tmp_path / "b")["generation"] == 3


def test_a_case_set_id_names_the_seed_without_revealing_it() -> None:
    seed = "ab" * 32
    cid = case_set_id(seed)
    assert cid == "final-" + hashlib.sha256(("case-set:" + seed).encode()).hexdigest()[:12]
    assert seed[:12] not in cid and case_set_id("cd" * 32) != cid
