"""The record of what the toolkit wrote into a workspace's client files (state/owned_config.py):
each write and removal is recorded, an edit holds the lock, the record stays JSON, a damaged
record reads as empty, and a folder's digest names its files and contents."""

from __future__ import annotations

import fcntl
from pathlib import Path

from harnesslab.tools.state.owned_config import OwnedConfig, OwnedRecord, tree_digest


def test_servers_approvals_and_skills_are_recorded_and_forgotten(tmp_path: Path) -> None:
    owned = OwnedConfig(tmp_path / "client-files.json")
    owned.server("claude", "a", {"command": "x"})
    owned.server("claude", "b", {"command": "y"})
    owned.server("claude", "a", None)
    owned.server("codex", "gone", None)  # removing what was never written is no error
    for name in ("a", "b", "a"):
        owned.approval(name, added=True)
    owned.skill(".claude/skills/s", "d1")
    owned.skill(".agents/skills/s", "d2")
    owned.skill(".claude/skills/s", None)
    record = owned.load()
    assert record.servers == {"claude": {"b": {"command": "y"}}, "codex": {}}
    assert record.approvals == ["b", "a"]  # once each, the latest last
    assert record.skills == {".agents/skills/s": "d2"}
    owned.approval("b", added=False)
    assert owned.load().approvals == ["a"]


def test_an_edit_holds_the_lock_while_it_reads_and_writes(tmp_path: Path) -> None:
    """Rule: the loop and a meta-server may register at once: an edit is one locked
    read-modify-write (another writer's lock attempt fails meanwhile)."""
    owned = OwnedConfig(tmp_path / "client-files.json")
    seen: list[str] = []
    read = owned.load

    def probing() -> OwnedRecord:
        with open(tmp_path / "client-files.lock", "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")
        return read()

    owned.load = probing  # type: ignore[method-assign]
    owned.approval("x", added=True)
    assert seen == ["held"]


def test_the_record_is_json_whatever_an_entry_carries(tmp_path: Path) -> None:
    owned = OwnedConfig(tmp_path / "client-files.json")
    owned.server("claude", "a", {"cwd": tmp_path, "args": ("x", "y")})
    assert owned.load().servers["claude"]["a"] == {"cwd": str(tmp_path), "args": ["x", "y"]}


def test_a_damaged_or_missing_record_reads_as_nothing_written(tmp_path: Path) -> None:
    path = tmp_path / "client-files.json"
    assert OwnedConfig(path).load() == OwnedRecord()
    for text in ("{", '{"servers": 3}', "[]"):
        path.write_text(text)
        assert OwnedConfig(path).load() == OwnedRecord()


def test_a_folders_digest_names_its_files_and_contents_in_any_order() -> None:
    files = [("a.md", b"x"), ("b/c.py", b"y")]
    digest = tree_digest(files)
    assert len(digest) == 16 and digest == tree_digest(files[::-1])
    assert digest != tree_digest([("a.md", b"x"), ("b/c.py", b"z")])
    assert digest != tree_digest([("a2.md", b"x"), ("b/c.py", b"y")])
