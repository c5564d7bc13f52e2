"""The untrusted-file gate's other operations (state/workspace_files.py): a log's tail, a
file's size, a rename within one folder, a lock file, an append's answer, and a full disk named
as such. Each goes through the same gate as read_bytes: no symlink on any component, regular
files only."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from harnesslab.tools.errors import DiskFull, UsageError
from harnesslab.tools.state import workspace_files as wf


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub/log.txt").write_bytes(b"0123456789")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_bytes(b"secret")
    (ws / "link").symlink_to(tmp_path / "outside")
    (ws / "link.txt").symlink_to(tmp_path / "outside/secret")
    return ws


# -- read_tail -----------------------------------------------------------------------------------
def test_the_tail_is_the_last_bytes_or_the_whole_of_a_short_file(root: Path) -> None:
    assert wf.read_tail(root, "sub/log.txt", 4) == b"6789"
    assert wf.read_tail(root, "sub/log.txt", 10) == b"0123456789"
    assert wf.read_tail(root, "sub/log.txt", 50) == b"0123456789"


def test_the_tail_goes_through_the_gate(root: Path) -> None:
    for rel in ("link.txt", "link/secret"):
        with pytest.raises(UsageError, match="symlink"):
            wf.read_tail(root, rel, 4)


# -- file_size -----------------------------------------------------------------------------------
def test_a_files_size_is_its_bytes_and_none_for_anything_but_a_regular_file(root: Path) -> None:
    assert wf.file_size(root, "sub/log.txt") == 10
    (root / "empty").write_bytes(b"")
    assert wf.file_size(root, "empty") == 0
    for rel in ("sub", "missing", "sub/missing", "link.txt", "link/secret", "../x", "/etc/passwd"):
        assert wf.file_size(root, rel) is None, rel


def test_a_file_size_is_of_the_file_under_the_root_not_the_working_folder(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "log.txt").write_bytes(b"x" * 99)
    monkeypatch.chdir(tmp_path)
    (root / "log.txt").write_bytes(b"abc")
    assert wf.file_size(root, "log.txt") == 3
    assert wf.file_size(root, "sub/none") is None
    assert wf.file_size(root, "made/log.txt") is None
    assert not (root / "made").exists()  # no folder is made to answer


# -- rename --------------------------------------------------------------------------------------
def test_a_rename_moves_the_entry_within_its_folder(root: Path) -> None:
    wf.rename(root, "sub/log.txt", "sub/old.txt")
    assert (root / "sub/old.txt").read_bytes() == b"0123456789"
    assert not (root / "sub/log.txt").exists()
    wf.rename(root, "sub/missing", "sub/other")  # a missing source is no error
    assert not (root / "sub/other").exists()


def test_a_rename_moves_a_link_itself_never_its_target(root: Path, tmp_path: Path) -> None:
    wf.rename(root, "link.txt", "moved.txt")
    assert (root / "moved.txt").is_symlink()
    assert (tmp_path / "outside/secret").read_bytes() == b"secret"


def test_a_rename_across_folders_or_through_a_link_is_refused(root: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not in one folder"):
        wf.rename(root, "sub/log.txt", "log.txt")
    assert (root / "sub/log.txt").exists()
    with pytest.raises(UsageError, match="symlink"):
        wf.rename(root, "link/secret", "link/taken")
    assert (tmp_path / "outside/secret").exists() and not (tmp_path / "outside/taken").exists()
    wf.rename(root, "nope/a", "nope/b")  # a missing folder: nothing to move, none made
    assert not (root / "nope").exists()


def test_a_rename_that_fails_otherwise_is_named(root: Path) -> None:
    (root / "sub/full").mkdir()
    (root / "sub/full/x").write_text("")
    with pytest.raises(UsageError, match="sub/log.txt .* cannot be read"):
        wf.rename(root, "sub/log.txt", "sub/full")  # a file over a non-empty folder


# -- locked --------------------------------------------------------------------------------------
def test_a_lock_file_is_made_0644_in_its_folders_and_held_exclusively(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0)
    try:
        with wf.locked(root, "locks/a/run.lock"):
            path = root / "locks/a/run.lock"
            assert path.stat().st_mode & 0o777 == 0o644
            other = os.open(path, os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
    finally:
        os.umask(old)
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit
    finally:
        os.close(other)
    with wf.locked(root, "locks/a/run.lock"):  # an existing lock file is reused
        pass


def test_a_lock_file_is_under_the_root_not_the_working_folder(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with wf.locked(root, "x.lock"):
        pass
    assert (root / "x.lock").is_file() and not (tmp_path / "x.lock").exists()


def test_a_lock_file_through_a_link_or_of_the_wrong_kind_is_refused(
    root: Path, tmp_path: Path
) -> None:
    for rel in ("link.txt", "link/x.lock"):
        with pytest.raises(UsageError, match="symlink"), wf.locked(root, rel):
            pytest.fail("locked through a link")
    assert not (tmp_path / "outside/x.lock").exists()
    os.mkfifo(root / "fifo")
    with pytest.raises(UsageError, match="not a regular file"), wf.locked(root, "fifo"):
        pytest.fail("locked a fifo")
    os.link(root / "sub/log.txt", root / "hard.lock")
    with pytest.raises(UsageError, match="hard links"), wf.locked(root, "hard.lock"):
        pytest.fail("locked a hard link")


def test_a_lock_leaves_no_descriptor_open(root: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with wf.locked(root, "x.lock"):
        pass
    with pytest.raises(UsageError), wf.locked(root, "sub"):
        pass
    assert len(os.listdir("/proc/self/fd")) == before


# -- what the gate says --------------------------------------------------------------------------
def test_a_folder_is_named_a_folder(root: Path) -> None:
    with pytest.raises(UsageError, match="sub .* is a folder, not a regular file"):
        wf.read_bytes(root, "sub")


def test_an_append_answers_the_files_size_after_it(root: Path) -> None:
    assert wf.append_line(root, "sub/log.txt", "ab\n") == 13
    assert wf.append_line(root, "new.log", "x\n") == 2
    assert (root / "new.log").read_bytes() == b"x\n"


def test_a_refused_read_leaves_no_descriptor_open(root: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(UsageError):
            wf.read_bytes(root, "sub")
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_no_space_is_a_disk_full_naming_the_folder(
    root: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(wf, "free_bytes", lambda folder: 1234)
    full = wf._refusal(root, "sub/x.json", OSError(code, "no space"))
    assert isinstance(full, DiskFull)
    assert (full.path, full.free_bytes) == (str(root / "sub"), 1234)
