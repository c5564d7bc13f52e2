"""workspace_files: the gate every workspace file passes. Links, FIFOs, sizes, JSON depth and
integer digits are refused with a UsageError naming the file; writes never leave the root."""

from __future__ import annotations

import inspect
import os
from pathlib import Path, PurePosixPath

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


# -- every rule of the gate, one at a time -------------------------------------------------------
@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("rel", [None, 3, "a\0b", "a/", "a/./b", "a/.."])
def test_more_paths_that_are_not_plain_relative_paths_are_refused(rel) -> None:
    with pytest.raises(UsageError):
        wf.check_relative(rel)  # type: ignore[arg-type]


def test_every_descriptor_the_gate_opens_refuses_links_and_is_close_on_exec(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    wf.read_bytes(root, "sub/ok.txt")
    wf.list_dir(root, "sub")
    wf.walk_files(root, "sub")
    wf.write_bytes(root, "sub/new/w.txt", b"x")
    wf.append_line(root, "sub/log", "x\n")
    wf.real_dir(root, "sub/made")
    below_root = [(p, f) for p, f in opened if p != str(root)]
    assert below_root and all(f & os.O_CLOEXEC for _, f in opened)
    assert all(f & os.O_NOFOLLOW for _, f in below_root)
    temps = [f for p, f in opened if p.endswith(".tmp")]
    assert temps and all(f & os.O_EXCL and f & os.O_CREAT for f in temps)
    (log,) = [f for p, f in opened if p == "log"]
    assert log & os.O_APPEND  # concurrent appends never overwrite each other
    assert all(f & os.O_DIRECTORY for p, f in opened if p in ("sub", "new", "made"))


def test_a_relative_path_comes_back_as_a_pure_path_and_errors_name_what_it_is() -> None:
    assert wf.check_relative("a/b.py") == PurePosixPath("a/b.py")
    with pytest.raises(UsageError, match="is not a relative path"):
        wf.check_relative("")
    with pytest.raises(UsageError, match="^editable file '../x' leaves the workspace"):
        wf.check_relative("../x", what="editable file")
    with pytest.raises(UsageError, match="^editable file '../x'"):
        wf.read_bytes(Path("/"), "../x", what="editable file")
    with pytest.raises(UsageError, match="^path '../x'"):
        wf.read_bytes(Path("/"), "../x")


def test_the_root_itself_may_be_reached_through_a_symlink(root: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(root)
    assert wf.read_text(tmp_path / "alias", "sub/ok.txt") == "fine"


def test_nested_files_are_read_through_every_folder(root: Path) -> None:
    (root / "a/b/c").mkdir(parents=True)
    (root / "a/b/c/deep.txt").write_text("deep")
    (root / "a/b/deep.txt").write_text("middle")
    assert wf.read_text(root, "a/b/c/deep.txt") == "deep"
    assert wf.read_text(root, "a/b/deep.txt") == "middle"


def test_a_read_never_creates_the_folders_it_looks_in(root: Path) -> None:
    with pytest.raises(UsageError, match="is missing"):
        wf.read_bytes(root, "newdir/x.txt")
    assert not wf.is_file(root, "newdir2/x.txt")
    assert not wf.is_dir(root, "newdir3/x")
    assert wf.list_dir(root, "newdir4/x") == []
    assert sorted(p.name for p in root.iterdir()) == ["sub"]


def test_reads_and_writes_leave_no_descriptor_open(root: Path) -> None:
    wf.read_bytes(root, "sub/ok.txt")  # warm up anything opened once
    before = open_fds()
    for _ in range(20):
        wf.read_bytes(root, "sub/ok.txt")
        wf.is_file(root, "sub/ok.txt")
        wf.list_dir(root, "sub")
        wf.write_bytes(root, "sub/w.txt", b"x")
        wf.append_line(root, "sub/log", "x\n")
        wf.real_dir(root, "sub/made")
    assert open_fds() == before


def test_a_fifo_in_place_of_a_folder_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(UsageError, match="symlink \\(or a file where a folder"):
        wf.read_bytes(root, "pipe/x.json")


def test_a_file_where_a_folder_should_be_is_refused_as_such(root: Path) -> None:
    with pytest.raises(UsageError, match="symlink \\(or a file where a folder"):
        wf.read_bytes(root, "sub/ok.txt/x")
    with pytest.raises(UsageError, match="symlink \\(or a file where a folder"):
        wf.write_bytes(root, "sub/ok.txt/x", b"x")


def test_other_errors_say_the_file_cannot_be_read(root: Path) -> None:
    with pytest.raises(UsageError, match="cannot be read"):
        wf.read_bytes(root, "n" * 300)  # ENAMETOOLONG
    with pytest.raises(UsageError, match="cannot be read"):
        wf.write_bytes(root, "sub", b"x")  # a folder in place of the file: EISDIR
    assert [p.name for p in root.iterdir()] == ["sub"]  # the temp file is gone too


def test_a_file_exactly_at_the_limit_is_read(root: Path) -> None:
    (root / "ten").write_bytes(b"x" * 10)
    assert wf.read_bytes(root, "ten", max_bytes=10) == b"x" * 10
    with pytest.raises(UsageError, match="limit is 9"):
        wf.read_text(root, "ten", max_bytes=9)


def test_the_default_size_limits(root: Path) -> None:
    def sparse(name: str, size: int) -> str:
        with open(root / name, "wb") as fh:
            fh.truncate(size)
        return name

    assert len(wf.read_bytes(root, sparse("at", 4 << 20))) == 4 << 20
    with pytest.raises(UsageError, match=f"limit is {4 << 20}"):
        wf.read_bytes(root, sparse("over", (4 << 20) + 1))
    with pytest.raises(UsageError, match=f"limit is {1 << 20}"):
        wf.read_json(root, sparse("over.json", (1 << 20) + 1))
    (root / "at.json").write_text("1" + " " * ((1 << 20) - 1))
    assert wf.read_json(root, "at.json") == 1
    line = b'\n{"a": 1}\n'
    sparse("over.jsonl", (64 << 20) + 1 - len(line))
    with open(root / "over.jsonl", "ab") as fh:
        fh.write(line)
    assert wf.read_jsonl(root, "over.jsonl") == []  # refused whole, not read in part


class _Grew:
    """os.fstat reporting a smaller size than the file has: the file grew after fstat."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
        real = os.fstat

        def fstat(fd: int):
            st = real(fd)
            return os.stat_result((*st[:6], size, *st[7:]))

        monkeypatch.setattr(os, "fstat", fstat)


def test_a_file_that_grows_while_read_is_read_whole_up_to_the_limit(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "log").write_bytes(b"0123456789" * 2)
    _Grew(monkeypatch, 5)
    assert wf.read_bytes(root, "log", max_bytes=100) == b"0123456789" * 2
    assert wf.read_bytes(root, "log", max_bytes=20) == b"0123456789" * 2
    with pytest.raises(UsageError, match="grew past 10 bytes"):
        wf.read_bytes(root, "log", max_bytes=10)
    with pytest.raises(UsageError, match="grew past 19 bytes"):
        wf.read_bytes(root, "log", max_bytes=19)


def test_a_file_with_one_link_is_read_and_a_second_link_refuses_it(
    root: Path, tmp_path: Path
) -> None:
    assert wf.read_bytes(root, "sub/ok.txt") == b"fine"
    os.link(root / "sub/ok.txt", tmp_path / "second")
    with pytest.raises(UsageError, match="2 hard links"):
        wf.read_bytes(root, "sub/ok.txt")
    with pytest.raises(UsageError, match="hard links"):
        wf.append_line(root, "sub/ok.txt", "x\n")


def test_is_file_and_is_dir_answer_only_for_what_is_really_there(
    root: Path, tmp_path: Path
) -> None:
    (root / "file.txt").write_text("x")
    (root / "link.txt").symlink_to(root / "file.txt")
    (root / "linkdir").symlink_to(root / "sub")
    assert wf.is_file(root, "file.txt") and not wf.is_dir(root, "file.txt")
    assert wf.is_dir(root, "sub") and not wf.is_file(root, "sub")
    for rel in ("link.txt", "linkdir", "linkdir/ok.txt", "missing", "../ws", ""):
        assert wf.is_file(root, rel) is False, rel
        assert wf.is_dir(root, rel) is False, rel


def test_list_dir_gives_sorted_names_and_nothing_for_what_it_refuses(
    root: Path, tmp_path: Path
) -> None:
    for name in ("b", "a", "c"):
        (root / "sub" / name).write_text(name)
    assert wf.list_dir(root, "sub") == ["a", "b", "c", "ok.txt"]
    (root / "linkdir").symlink_to(root / "sub")
    assert wf.list_dir(root, "linkdir") == []
    assert wf.list_dir(root, "sub/ok.txt") == []
    assert wf.list_dir(root, "missing") == []
    assert wf.list_dir(root, "../ws") == []
    (root / "sub/deeper").mkdir()
    (root / "sub/deeper/z").write_text("z")
    assert wf.list_dir(root, "sub/deeper") == ["z"]


def test_a_walk_visits_every_folder_skips_names_and_sorts_by_path_parts(root: Path) -> None:
    (root / "d/a").mkdir(parents=True)
    (root / "d/a/b").write_bytes(b"1")
    (root / "d/a.b").write_bytes(b"2")
    (root / "d/__pycache__").mkdir()
    (root / "d/__pycache__/x.pyc").write_bytes(b"3")
    (root / "d/a/__pycache__").mkdir()
    (root / "d/a/__pycache__/y.pyc").write_bytes(b"4")
    assert wf.walk_files(root, "d", skip=frozenset({"__pycache__"})) == [
        ("d/a/b", b"1"),
        ("d/a.b", b"2"),
    ]
    assert len(wf.walk_files(root, "d")) == 4
    assert wf.walk_files(root, "missing") == []
    (root / "dlink").symlink_to(root / "d")
    assert wf.walk_files(root, "dlink") == []


def test_a_walk_refuses_a_special_file(root: Path) -> None:
    os.mkfifo(root / "sub/pipe")
    with pytest.raises(UsageError, match="sub/pipe .* special file"):
        wf.walk_files(root, "sub")


def test_a_walk_is_bounded_in_files_and_bytes_at_exactly_the_limits(root: Path) -> None:
    for i in range(3):
        (root / "sub" / f"f{i}").write_bytes(b"xy")  # with ok.txt: 4 files, 10 bytes
    assert len(wf.walk_files(root, "sub", max_files=4, max_bytes=10)) == 4
    with pytest.raises(UsageError, match="more than 3 files"):
        wf.walk_files(root, "sub", max_files=3)
    with pytest.raises(UsageError, match="or 9 bytes"):
        wf.walk_files(root, "sub", max_bytes=9)


def test_a_walk_has_default_bounds() -> None:
    # The boundary logic is tested above with small limits; walking 2000 files or 64 MiB to
    # test the defaults would cost seconds, so the defaults themselves are pinned.
    params = inspect.signature(wf.walk_files).parameters
    assert params["max_files"].default == 2000
    assert params["max_bytes"].default == 64 << 20


def test_text_must_be_utf8(root: Path) -> None:
    (root / "bad.txt").write_bytes(b"ok\xffno")
    with pytest.raises(UsageError, match="not UTF-8 text \\(byte 2\\)"):
        wf.read_text(root, "bad.txt")
    with pytest.raises(UsageError, match="^config '../x'"):
        wf.read_text(root, "../x", what="config")


@pytest.mark.parametrize(
    ("text", "limit", "ok"),
    [
        ("[[[]]]", 3, True),
        ("[[[[]]]]", 3, False),
        ('{"a": {"b": {}}}', 3, True),
        ('{"a": {"b": {"c": []}}}', 3, False),
        ("[[]][[]][[]][[]]", 2, True),  # closing brackets count
        ("[[]][[[]]]", 2, False),  # ... one level each
        ("[{}]{[]}", 2, True),
        ('["[[[[[[", "{{{{"]', 1, True),  # brackets inside strings do not
        ('["\\"[[[[["]', 1, True),  # nor after an escaped quote
        ('["\\\\", [[]]]', 2, False),  # an escaped backslash does not escape the quote
        ('["\\\\"]', 1, True),
        ('["a"] [[', 2, True),
        ("[" * 32 + "]" * 32, 32, True),
        ("[" * 33 + "]" * 33, 32, False),
    ],
)
def test_the_depth_check_counts_brackets_outside_strings(text: str, limit: int, ok: bool) -> None:
    assert wf.json_depth_ok(text, limit) is ok


def test_the_default_depth_limit_is_32() -> None:
    assert wf.parse_json("[" * 32 + "]" * 32, source="f") is not None
    with pytest.raises(UsageError, match="^f: JSON nested deeper than 32 levels"):
        wf.parse_json("[" * 33 + "]" * 33, source="f")
    assert wf.json_depth_ok("[" * 33 + "]" * 33) is False


def test_integers_up_to_forty_digits_parse_as_integers() -> None:
    assert wf.parse_json("[1, -2]", source="f") == [1, -2]
    assert wf.parse_json("9" * 40, source="f") == int("9" * 40)
    assert wf.parse_json("-" + "9" * 40, source="f") == -int("9" * 40)
    with pytest.raises(UsageError, match="^f: an integer with 41 digits"):
        wf.parse_json("9" * 41, source="f")
    for constant in ("Infinity", "-Infinity", "NaN"):
        with pytest.raises(UsageError, match="is not a JSON number"):
            wf.parse_json(f"[{constant}]", source="f")
    with pytest.raises(UsageError, match="^cfg.json: not valid JSON"):
        wf.parse_json("{", source="cfg.json")


def test_read_json_names_the_file_and_passes_its_limits(root: Path) -> None:
    (root / "c.json").write_text('{"a": [[1]]}')
    assert wf.read_json(root, "c.json") == {"a": [[1]]}
    with pytest.raises(UsageError, match="^c.json: JSON nested deeper than 2"):
        wf.read_json(root, "c.json", max_depth=2)
    with pytest.raises(UsageError, match="limit is 5"):
        wf.read_json(root, "c.json", max_bytes=5)
    (root / "bad.json").write_text("{nope")
    with pytest.raises(UsageError, match="^bad.json: not valid JSON"):
        wf.read_json(root, "bad.json")


def test_jsonl_keeps_only_object_lines(root: Path) -> None:
    lines = [b'{"a": 1}', b"", b"  ", b"[1, 2]", b"3", b'"s"', b'{"b": "\xff"}', b'{"torn": ']
    (root / "t.jsonl").write_bytes(b"\n".join(lines))
    assert wf.read_jsonl(root, "t.jsonl") == [{"a": 1}, {"b": "\ufffd"}]
    (root / "big.jsonl").write_bytes(b'{"a": 1}\n' * 3)
    assert wf.read_jsonl(root, "big.jsonl", max_bytes=10) == []
    assert wf.read_jsonl(root, "missing.jsonl") == []


def test_writes_are_atomic_fsynced_files_of_mode_644_in_new_folders(
    root: Path, monkeypatch: pytest.MonkeyPatch, umask_022
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_size))
    wf.write_bytes(root, "new/deeper/f.bin", b"12345")
    assert (root / "new/deeper/f.bin").read_bytes() == b"12345"
    assert synced == [5]  # fsynced after the data was flushed to the file
    assert (root / "new/deeper/f.bin").stat().st_mode & 0o777 == 0o644
    assert (root / "new").stat().st_mode & 0o777 == 0o755
    assert (root / "new/deeper").stat().st_mode & 0o777 == 0o755
    wf.write_bytes(root, "new/deeper/f.bin", b"67", mode=0o600)
    assert (root / "new/deeper/f.bin").read_bytes() == b"67"
    assert (root / "new/deeper/f.bin").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (root / "new/deeper").iterdir()) == ["f.bin"]
    wf.write_text(root, "t.txt", "é")
    assert (root / "t.txt").read_bytes() == "é".encode()
    assert synced == [5, 2, 2]
    wf.write_bytes(root, "nosync", b"x", fsync=False)
    wf.write_json(root, "view.json", {"b": 1, "a": [1]}, fsync=False)
    assert synced == [5, 2, 2]
    wf.write_json(root, "kept.json", {})
    assert synced == [5, 2, 2, 3]
    assert (root / "view.json").read_text() == '{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'


def test_append_line_creates_appends_and_refuses_a_fifo(root: Path, umask_022) -> None:
    wf.append_line(root, "logs/t.jsonl", "one\n")
    wf.append_line(root, "logs/t.jsonl", "two\n")
    assert (root / "logs/t.jsonl").read_text() == "one\ntwo\n"
    assert (root / "logs/t.jsonl").stat().st_mode & 0o777 == 0o644
    os.mkfifo(root / "fifo")
    with pytest.raises(UsageError, match="cannot be read"):
        wf.append_line(root, "fifo", "x\n")  # no reader: ENXIO at once, never a hang


def test_real_dir_makes_the_folders_and_refuses_a_link_on_any_component(
    tmp_path: Path,
) -> None:
    root = tmp_path / "not/yet/ws"
    assert wf.real_dir(root, "a/b") == root / "a/b"
    assert (root / "a/b").is_dir()
    assert wf.real_dir(root, "a/b") == root / "a/b"  # again: already there
    (root / "link").symlink_to(tmp_path)
    for rel in ("link", "link/x"):
        with pytest.raises(UsageError, match="symlink"):
            wf.real_dir(root, rel)
    assert not (tmp_path / "x").exists()


def test_inside_gives_a_workspace_path_or_refuses(root: Path, tmp_path: Path) -> None:
    assert wf.inside(root, root / "sub/ok.txt") == "sub/ok.txt"
    with pytest.raises(UsageError, match="outside the workspace"):
        wf.inside(root, tmp_path / "elsewhere")
