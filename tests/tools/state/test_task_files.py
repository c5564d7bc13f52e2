"""A command task's own files (state/task_files.py): read once from the operator's folder as
untrusted input, kept in the trusted store with a hash each, re-hashed before every final run;
what `init` copies into a workspace leaves the task's private files behind."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import task_files as tf
from harnesslab.tools.state.trusted_store import TrustedStore
from harnesslab.tools.task.spec import TaskSpec, load_task


def command_task(root: Path, private: list[str] | None = None) -> TaskSpec:
    root.mkdir(parents=True)
    lines = [
        'name = "cmd"',
        'summary = "A command task."',
        'kind = "command"',
        'editable = ["solution.txt"]',
        'objective = "python3 score.py"',
        'score_key = "best_us"',
    ]
    if private is not None:
        lines.append(f"private = {json.dumps(private)}")
    (root / "task.toml").write_text("\n".join(lines) + "\n")
    (root / "task.md").write_text("brief\n")
    (root / "score.py").write_text("print('{}')\n")
    (root / "solution.txt").write_text("50\n")
    return load_task(root)


@pytest.fixture
def store(tmp_path: Path) -> TrustedStore:
    (tmp_path / "ws").mkdir()
    return TrustedStore(Settings(state_dir=tmp_path / "state"), tmp_path / "ws")


def test_the_folders_files_are_read_with_the_toolkits_and_clients_folders_left_out(
    tmp_path: Path,
) -> None:
    task = command_task(tmp_path / "task")
    for junk in (".git/HEAD", "__pycache__/x.pyc", ".harnesslab/v.json", ".venv/bin/python",
                 "node_modules/a.js", ".claude/s.md", ".agents/s.md", ".codex/c.toml",
                 ".harnessgym/x", ".pytest_cache/x", "sub/__pycache__/y.pyc"):  # fmt: skip
        (task.root / junk).parent.mkdir(parents=True, exist_ok=True)
        (task.root / junk).write_text("junk")
    (task.root / ".mcp.json").write_text("{}")
    (task.root / "sub/data.txt").write_text("d")
    files = tf.folder_files(task)
    assert sorted(files) == ["score.py", "solution.txt", "sub/data.txt", "task.md", "task.toml"]
    assert files["sub/data.txt"] == b"d"


def test_a_link_in_the_task_folder_is_refused_naming_the_folder(tmp_path: Path) -> None:
    task = command_task(tmp_path / "task")
    (tmp_path / "secret").write_text("s")
    (task.root / "data.txt").symlink_to(tmp_path / "secret")
    with pytest.raises(UsageError, match=f"^task folder {task.root.resolve()}: .*data.txt"):
        tf.folder_files(task)


def test_the_folder_bounds_are_2000_files_and_64_mib() -> None:
    assert (tf.MAX_FILES, tf.MAX_BYTES) == (2000, 64 << 20)


def test_the_workspace_gets_every_file_but_task_toml_and_the_private_ones(tmp_path: Path) -> None:
    task = command_task(tmp_path / "task", private=["score.py", "hidden", "deep/er"])
    files = {
        "task.toml": b"t", "task.md": b"m", "score.py": b"s", "solution.txt": b"1",
        "hidden/cases.json": b"h", "hiddenness.txt": b"kept", "deep/er/x": b"p",
        "deep/other": b"kept",
    }  # fmt: skip
    assert sorted(tf.workspace_template(task, files)) == [
        "deep/other",
        "hiddenness.txt",
        "solution.txt",
        "task.md",
    ]
    assert sorted(tf.workspace_template(task)) == ["solution.txt", "task.md"]


def test_a_workspace_subfolder_is_all_the_workspace_gets(tmp_path: Path) -> None:
    task = command_task(tmp_path / "task")
    files = {"task.md": b"m", "verifier.py": b"v", "workspace/kernel.py": b"k",
             "workspace/sub/x": b"x"}  # fmt: skip
    assert tf.workspace_template(task, files) == {"kernel.py": b"k", "sub/x": b"x"}


def test_a_final_room_puts_the_workspace_files_at_the_top_over_the_tasks(tmp_path: Path) -> None:
    files = {"verifier.py": b"v", "kernel.py": b"task's", "workspace/kernel.py": b"ws",
             "workspace/sub/x": b"x"}  # fmt: skip
    assert tf.room_files(files) == {"verifier.py": b"v", "kernel.py": b"ws", "sub/x": b"x"}


def test_a_snapshot_keeps_the_files_with_their_hashes_and_replaces_an_older_one(
    tmp_path: Path, store: TrustedStore
) -> None:
    task = command_task(tmp_path / "task")
    assert not tf.has_snapshot(store)
    tf.snapshot(store, task)
    assert tf.has_snapshot(store)
    kept = tf.kept_files(store)
    assert kept == tf.folder_files(task)
    manifest = json.loads((store.root / "task_files/current/manifest.json").read_text())
    assert manifest["task"] == "cmd"
    assert manifest["files"]["score.py"] == hashlib.sha256(b"print('{}')\n").hexdigest()
    (task.root / "score.py").write_text("print('changed')\n")
    (task.root / "new.txt").write_text("n")
    assert tf.kept_files(store)["score.py"] == b"print('{}')\n"  # the copy, not the folder
    tf.snapshot(store, task)
    assert tf.kept_files(store)["new.txt"] == b"n"
    assert sorted(p.name for p in (store.root / "task_files").iterdir()) == ["current"]
    assert (store.root / "task_files").stat().st_mode & 0o777 == 0o700


def test_an_empty_task_folder_still_makes_a_snapshot(tmp_path: Path, store: TrustedStore) -> None:
    task = command_task(tmp_path / "task")
    for p in task.root.iterdir():
        p.unlink()
    tf.snapshot(store, task)
    assert tf.has_snapshot(store) and tf.kept_files(store) == {}
    assert (store.root / "task_files/current/files").is_dir()


def test_an_altered_kept_file_is_refused(tmp_path: Path, store: TrustedStore) -> None:
    task = command_task(tmp_path / "task")
    tf.snapshot(store, task)
    (store.root / "task_files/current/files/score.py").write_text("import os\n")
    with pytest.raises(UsageError, match="score.py no longer matches its hash"):
        tf.kept_files(store)


@pytest.mark.parametrize("manifest", ["{torn", "[]", '{"files": 3}', '{"nofiles": {}}'])
def test_a_missing_or_damaged_manifest_is_refused(
    tmp_path: Path, store: TrustedStore, manifest: str
) -> None:
    with pytest.raises(UsageError, match="missing or damaged"):
        tf.kept_files(store)
    task = command_task(tmp_path / "task")
    tf.snapshot(store, task)
    (store.root / "task_files/current/manifest.json").write_text(manifest)
    with pytest.raises(UsageError, match="missing or damaged"):
        tf.kept_files(store)


def test_a_kept_manifest_naming_a_path_outside_is_refused(
    tmp_path: Path, store: TrustedStore
) -> None:
    task = command_task(tmp_path / "task")
    tf.snapshot(store, task)
    path = store.root / "task_files/current/manifest.json"
    (store.root / "task_files/current/outside").write_text("x")
    digest = hashlib.sha256(b"x").hexdigest()
    path.write_text(json.dumps({"task": "cmd", "files": {"../outside": digest}}))
    with pytest.raises(UsageError, match="kept task file '../outside'"):
        tf.kept_files(store)


def test_write_tree_writes_files_in_new_folders_and_refuses_paths_that_leave(
    tmp_path: Path,
) -> None:
    tf.write_tree(tmp_path / "room", {"a/b/c.txt": b"c", "d.txt": b"d"})
    assert (tmp_path / "room/a/b/c.txt").read_bytes() == b"c"
    assert (tmp_path / "room/d.txt").read_bytes() == b"d"
    with pytest.raises(UsageError, match="task file '../escape'"):
        tf.write_tree(tmp_path / "room2", {"../escape": b"x"})
    assert not (tmp_path / "escape").exists()


def test_the_snapshot_lives_under_task_files_in_the_store() -> None:
    assert tf.SNAPSHOT == "task_files"  # the store's layout: an older store keeps its copy
