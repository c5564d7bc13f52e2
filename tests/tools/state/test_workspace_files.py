"""workspace_files: the gate every workspace file passes. Links, FIFOs, sizes, JSON depth and
integer digits are refused with a UsageError naming the file; writes never leave the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.state import workspace_files as wf


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub/ok.txt").write_text("fine")
    return ws


@pytest.mark.parametrize("rel", ["/etc/passwd", "../x", "a/../b", "", "a//b", "a\\b", "./a"])
def test_paths_that_leave_the_workspace_are_refused(root: Path, rel: str) -> None:
    with pytest.raises(UsageError):
        wf.check_relative(rel)


def test_a_symlink_anywhere_on_the_path_is_refused(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ok.txt").write_text("secret")
    (root / "link.txt").symlink_to(outside / "ok.txt")
    (root / "linkdir").symlink_to(outside)
    assert wf.read_text(root, "sub/ok.txt") == "fine"
    for rel in ("link.txt", "linkdir/ok.txt"):
        with pytest.raises(UsageError, match="symlink") as err:
            wf.read_bytes(root, rel)
        assert rel in err.value.message
        assert not wf.is_file(root, rel)


def test_a_hard_link_and_a_fifo_are_refused_without_blocking(root: Path, tmp_path: Path) -> None:
    (tmp_path / "key").write_text("secret")
    os.link(tmp_path / "key", root / "hard.txt")
    os.mkfifo(root / "pipe.json")
    with pytest.raises(UsageError, match="hard links"):
        wf.read_bytes(root, "hard.txt")
    with pytest.raises(UsageError, match="not a regular file"):
        wf.read_bytes(root, "pipe.json")


def test_size_depth_digits_and_constants_are_bounded(root: Path) -> None:
    (root / "big").write_bytes(b"x" * 11)
    with pytest.raises(UsageError, match="limit is 10"):
        wf.read_bytes(root, "big", max_bytes=10)
    assert wf.parse_json('{"a": [[1]], "s": "[[[["}', source="f", max_depth=3)["a"] == [[1]]
    with pytest.raises(UsageError, match="nested deeper than 3"):
        wf.parse_json("[[[[1]]]]", source="f", max_depth=3)
    with pytest.raises(UsageError, match="digits"):
        wf.parse_json("1" * 41, source="f")
    with pytest.raises(UsageError, match="NaN"):
        wf.parse_json('{"x": NaN}', source="f")


def test_writes_replace_a_planted_symlink_and_never_follow_a_folder_link(
    root: Path, tmp_path: Path
) -> None:
    target = tmp_path / "rc"
    target.write_text("original")
    (root / "view.json").symlink_to(target)
    wf.write_json(root, "view.json", {"a": 1})
    assert target.read_text() == "original" and not (root / "view.json").is_symlink()
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="symlink"):
        wf.write_text(root, "out/rc", "owned")
    with pytest.raises(UsageError, match="symlink"):
        wf.append_line(root, "out/rc", "owned\n")
    (root / "log").symlink_to(target)
    with pytest.raises(UsageError, match="symlink"):
        wf.append_line(root, "log", "owned\n")
    assert target.read_text() == "original"


def test_a_walk_refuses_a_symlink_in_the_tree(root: Path, tmp_path: Path) -> None:
    assert wf.walk_files(root, "sub") == [("sub/ok.txt", b"fine")]
    (root / "sub/leak").symlink_to(tmp_path)
    with pytest.raises(UsageError, match="sub/leak"):
        wf.walk_files(root, "sub")
