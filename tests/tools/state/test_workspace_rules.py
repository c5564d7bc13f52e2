"""Each rule of a workspace (tools/state/workspace.py), one test per rule: where its paths are
(the trusted ones in its store, the views in its folder), what `init` copies and refuses, how a
task is bound and read back from the store, and what opening or recognising a workspace takes."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from harnesslab.tools.errors import UsageError
from harnesslab.tools.settings import Settings
from harnesslab.tools.state import task_files
from harnesslab.tools.state.ledger import Ledger
from harnesslab.tools.state.storage import hash_files
from harnesslab.tools.state.telemetry import Telemetry
from harnesslab.tools.state.trusted_store import TrustedStore
from harnesslab.tools.state.workspace import (
    HISTORY_VIEW,
    Workspace,
    init_workspace,
    is_workspace,
    open_workspace,
)
from harnesslab.tools.task.spec import load_task, tasks_root

TASK = "rmsnorm_gate"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(state_dir=tmp_path / "state")


@pytest.fixture
def ws(tmp_path: Path, settings: Settings) -> Workspace:
    return init_workspace(TASK, tmp_path / "ws", settings)


def command_task(folder: Path, *, dev_higher: bool = True, final_higher: bool = False) -> Path:
    """A command task folder (no config file, no template: its own files are the template)."""
    folder.mkdir(parents=True)
    (folder / "task.toml").write_text(textwrap.dedent(f"""
        name = "cmd"
        summary = "score = solution.txt"
        kind = "command"
        editable = ["solution.txt"]
        score_key = "best"

        [objectives.dev]
        command = "{{python}} score.py"
        higher_is_better = {str(dev_higher).lower()}

        [objectives.final]
        command = "{{python}} score.py"
        higher_is_better = {str(final_higher).lower()}
        """))  # fmt: skip
    (folder / "task.md").write_text("Make best good.\n")
    (folder / "score.py").write_text("print('{\"best\": 1}')\n")
    (folder / "solution.txt").write_text("100\n")
    return folder


def kernel_task_copy(folder: Path, name: str = TASK) -> Path:
    """The shipped task's folder copied elsewhere: a folder task (not shipped)."""
    shutil.copytree(tasks_root() / TASK, folder, ignore=shutil.ignore_patterns("__pycache__"))
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace(f'name = "{TASK}"', f'name = "{name}"'))
    return folder


def binding(settings: Settings, root: Path) -> dict:
    return json.loads(
        (TrustedStore.location(settings, root.resolve()) / "binding.json").read_text()
    )


def write_binding(settings: Settings, root: Path, **fields: object) -> None:
    TrustedStore(settings, root).binding_path.write_text(json.dumps(fields))


# -- paths and views ----------------------------------------------------------------------------
def test_trusted_paths_are_in_the_store_and_views_in_the_workspace(ws: Workspace) -> None:
    store = ws.store.root
    assert ws.state == ws.root / ".harnesslab"
    assert ws.telemetry_path == ws.root / ".harnesslab" / "telemetry.jsonl"
    assert ws.artifacts_dir == ws.root / ".harnesslab" / "runs"
    assert ws.history_path == store / "history.jsonl"
    assert ws.checkpoints_dir == store / "checkpoints"
    assert ws.runs_dir == store / "runs"
    assert not store.is_relative_to(ws.root)
    assert ws.describe() == {"root": str(ws.root), "task": TASK, "editable": ws.task.editable}


def test_telemetry_is_read_from_the_workspaces_file(ws: Workspace) -> None:
    tel = Telemetry(ws.telemetry_path, "srv", guard=ws.root)
    tel.record("run_objective", arg_names=[], duration_s=0.001, status="ok")
    assert [r["tool"] for r in ws.telemetry_records()] == ["run_objective"]
    assert ws.telemetry_usage()["run_objective"]["calls"] == 1


def test_the_ledger_ranks_each_mode_in_the_tasks_direction(tmp_path, settings) -> None:
    task = command_task(tmp_path / "task", dev_higher=True, final_higher=False)
    ledger = init_workspace(task, tmp_path / "ws", settings).ledger()
    assert ledger.higher_is_better is True  # the dev direction when a record names no mode
    assert ledger.mode_higher == {"dev": True, "final": False}
    flipped = command_task(tmp_path / "flipped", dev_higher=False, final_higher=True)
    ledger = init_workspace(flipped, tmp_path / "ws2", settings).ledger()
    assert ledger.higher_is_better is False
    assert ledger.mode_higher == {"dev": False, "final": True}


def test_every_ledger_append_rewrites_the_history_view(ws: Workspace) -> None:
    view = ws.root / HISTORY_VIEW
    assert not view.exists()
    ws.ledger().append({"mode": "dev", "status": "passed", "score": 5.0, "candidate": "c",
                        "case_set": "all"})  # fmt: skip
    ranked = json.loads(view.read_text())["modes"]["dev"]["all"]
    assert [(r["rank"], r["candidate"]) for r in ranked] == [(1, "c")]


def test_the_history_view_is_of_the_ledger_given_and_never_fsynced(
    ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = Ledger(tmp_path / "other.jsonl")
    other.append({"mode": "dev", "status": "passed", "score": 1.0, "candidate": "other",
                  "case_set": "all"})  # fmt: skip
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)  # a view is rebuilt after every change
    ws.write_history_view(other)
    view = json.loads((ws.root / HISTORY_VIEW).read_text())
    assert [r["candidate"] for r in view["modes"]["dev"]["all"]] == ["other"]
    ws.write_history_view()  # the workspace's own ledger: empty
    assert json.loads((ws.root / HISTORY_VIEW).read_text())["modes"] == {}
    assert synced == []


def test_a_deleted_workspace_is_not_recreated_by_a_view(ws: Workspace) -> None:
    shutil.rmtree(ws.root)
    ws.write_history_view()
    assert not ws.root.exists()
    with pytest.raises(UsageError, match=r"does not exist \(deleted\?\)"):
        ws.editable_files()


def test_a_hash_of_given_files_is_of_those_files(ws: Workspace) -> None:
    files = {"kernel.py": b"x = 1\n"}
    assert ws.candidate_hash(files) == hash_files(files) != ws.candidate_hash()


def test_a_task_without_a_config_file_has_an_empty_config(tmp_path, settings) -> None:
    ws = init_workspace(command_task(tmp_path / "task"), tmp_path / "ws", settings)
    assert ws.read_config() == {}
    assert ws.read_config(ws.snapshot()) == {}


def test_a_snapshots_bad_config_is_named_in_the_error(ws: Workspace) -> None:
    files = {**ws.snapshot().files, "kernel_config.json": b'{"num_warps": 3}'}
    with pytest.raises(UsageError, match="kernel_config.json"):
        ws.read_config(type(ws.snapshot()).of(files))
    files["kernel_config.json"] = b" " * (2 << 20)
    with pytest.raises(UsageError, match="kernel_config.json is"):
        ws.read_config(type(ws.snapshot()).of(files))


# -- init ---------------------------------------------------------------------------------------
def test_init_refuses_a_folder_with_files_unless_forced(tmp_path, settings) -> None:
    dest = tmp_path / "ws"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="is not empty"):
        init_workspace(TASK, dest, settings)
    (dest / ".harnesslab").mkdir()  # a view folder beside the file changes nothing
    with pytest.raises(UsageError, match="is not empty"):
        init_workspace(TASK, dest, settings)
    ws = init_workspace(TASK, dest, settings, force=True)
    assert (ws.root / "notes.txt").read_text() == "mine" and (ws.root / "kernel.py").is_file()


def test_init_takes_a_new_an_empty_or_a_views_only_folder(tmp_path, settings) -> None:
    deep = init_workspace(TASK, tmp_path / "a" / "b" / "ws", settings)  # parents made
    assert (deep.root / "kernel.py").is_file()
    (tmp_path / "empty").mkdir()
    assert (init_workspace(TASK, tmp_path / "empty", settings).root / "kernel.py").is_file()
    (tmp_path / "views" / ".harnesslab").mkdir(parents=True)
    assert (init_workspace(TASK, tmp_path / "views", settings).root / "kernel.py").is_file()


def test_init_copies_the_template_and_the_brief_binds_and_writes_the_task_view(
    tmp_path, settings
) -> None:
    ws = init_workspace(TASK, tmp_path / "ws", settings, language="cuda")
    task = load_task(TASK)
    # The template's files and the brief; not the template's bytecode cache, which a run that
    # imported its kernel.py leaves in the source tree and init drops (test_init_leaves_no_pycache_and_a_file_of_that_name_breaks_nothing).
    template = [p.name for p in (task.root / "workspace_cuda").iterdir() if p.name != "__pycache__"]
    assert sorted(p.name for p in ws.root.iterdir() if p.name != ".harnesslab") == sorted(
        [*template, "task.md"]
    )
    assert (ws.root / "task.md").read_bytes() == (task.root / "task_cuda.md").read_bytes()
    assert ws.task.language == "cuda" and "kernel.cu" in ws.task.editable
    bound = binding(settings, ws.root)
    assert (bound["task"], bound["task_root"], bound["task_toml"]) == (TASK, None, None)
    assert (bound["how"], bound["language"]) == ("init", "cuda")
    view = json.loads((ws.root / ".harnesslab" / "task.json").read_text())
    assert view["task"] == TASK and "changes nothing" in view["about"]
    assert json.loads(ws.store.imported_path.read_text())["nothing"] == "a new workspace"
    assert open_workspace(ws.root, settings).task.language == "cuda"  # read back from the store


def test_init_leaves_no_pycache_and_a_file_of_that_name_breaks_nothing(tmp_path, settings) -> None:
    task = kernel_task_copy(tmp_path / "mine", name="mine")
    (task / "workspace" / "__pycache__").mkdir()
    (task / "workspace" / "__pycache__" / "kernel.cpython-312.pyc").write_bytes(b"\0")
    (task / "workspace" / "sub").mkdir()
    (task / "workspace" / "sub" / "__pycache__").write_text("a file: left, never an error")
    ws = init_workspace(task, tmp_path / "ws", settings)
    assert (ws.root / "kernel.py").is_file() and not (ws.root / "__pycache__").exists()
    assert (ws.root / "sub" / "__pycache__").is_file()


def test_a_command_task_folder_is_copied_and_kept_in_the_store(tmp_path, settings) -> None:
    task = command_task(tmp_path / "task")
    ws = init_workspace(task, tmp_path / "ws", settings)
    assert (ws.root / "solution.txt").read_text() == "100\n"
    assert (ws.root / "task.md").read_text() == "Make best good.\n"
    bound = binding(settings, ws.root)
    assert bound["task_root"] == str(task.resolve())
    assert bound["task_toml"] == (task / "task.toml").read_text()
    assert task_files.kept_files(ws.store)["score.py"] == (task / "score.py").read_bytes()


def test_a_command_task_made_in_its_own_folder_keeps_its_files(tmp_path, settings) -> None:
    task = command_task(tmp_path / "task")
    (task / "workspace").mkdir()  # a template subfolder: copied only into another folder
    (task / "workspace" / "solution.txt").write_text("template\n")
    ws = init_workspace(task, task, settings, force=True)
    assert (ws.root / "solution.txt").read_text() == "100\n"


def test_a_later_edit_of_a_bound_task_toml_changes_nothing(tmp_path, settings) -> None:
    task = kernel_task_copy(tmp_path / "mine", name="mine")
    ws = init_workspace(task, tmp_path / "ws", settings)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('name = "mine"', 'name = "edited"'))
    again = open_workspace(ws.root, settings)
    assert again.task.name == "mine" and again.task.root == task.resolve()


def test_a_folder_task_is_bound_in_the_language_it_was_made_in(tmp_path, settings) -> None:
    task = kernel_task_copy(tmp_path / "mine", name="mine")
    ws = init_workspace(task, tmp_path / "ws", settings, language="cuda")
    assert binding(settings, ws.root)["language"] == "cuda"
    assert open_workspace(ws.root, settings).task.editable == ws.task.editable
    assert "kernel.cu" in ws.task.editable


def test_a_task_without_a_brief_makes_a_workspace_without_one(tmp_path, settings) -> None:
    task = command_task(tmp_path / "task")
    (task / "task.md").unlink()
    ws = init_workspace(task, tmp_path / "ws", settings)
    assert (ws.root / "solution.txt").is_file() and not (ws.root / "task.md").exists()


def test_an_editable_name_leaving_the_workspace_is_refused_as_an_editable_file(
    tmp_path, settings
) -> None:
    task = kernel_task_copy(tmp_path / "mine", name="mine")
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('editable = ["kernel.py"', 'editable = ["../k.py"', 1))
    (tmp_path / "k.py").write_text("outside")
    ws = init_workspace(task, tmp_path / "ws", settings)
    with pytest.raises(UsageError, match=r"^editable file '\.\./k\.py' leaves the workspace"):
        ws.editable_files()


def test_a_task_folder_inside_the_workspace_is_refused(tmp_path, settings) -> None:
    dest = tmp_path / "ws"
    inner = kernel_task_copy(dest / "mine", name="mine")
    with pytest.raises(UsageError, match="inside the workspace"):
        init_workspace(inner, dest, settings, force=True)
    plain = init_workspace(TASK, tmp_path / "plain", settings)
    kernel_task_copy(plain.root / "mine", name="mine")
    store = TrustedStore(settings, plain.root)
    store.binding_path.unlink()
    with pytest.raises(UsageError, match="inside the workspace"):
        open_workspace(plain.root, settings, task=plain.root / "mine")


# -- the binding read back ------------------------------------------------------------------------
def test_a_binding_without_a_language_is_triton_and_a_wrong_one_is_refused(ws, settings) -> None:
    write_binding(settings, ws.root, task=TASK)
    assert open_workspace(ws.root, settings).task.language == "triton"
    write_binding(settings, ws.root, task=TASK, language=None)
    assert open_workspace(ws.root, settings).task.language == "triton"
    write_binding(settings, ws.root, task=TASK, language=5)
    with pytest.raises(UsageError, match="names no kernel language"):
        open_workspace(ws.root, settings)


def test_a_binding_takes_a_folder_only_with_its_text(ws, settings, tmp_path) -> None:
    text = (kernel_task_copy(tmp_path / "mine", name="mine") / "task.toml").read_text()
    write_binding(settings, ws.root, task=TASK, task_root=str(tmp_path / "mine"), task_toml=None)
    assert open_workspace(ws.root, settings).task.name == TASK
    write_binding(settings, ws.root, task=TASK, task_root=None, task_toml=text)
    assert open_workspace(ws.root, settings).task.name == TASK
    write_binding(settings, ws.root, task=5, task_root=str(tmp_path / "mine"), task_toml=text)
    assert open_workspace(ws.root, settings).task.name == "mine"
    write_binding(settings, ws.root, task=None)
    with pytest.raises(UsageError, match="names no task"):
        open_workspace(ws.root, settings)


# -- open -----------------------------------------------------------------------------------------
def test_open_refuses_a_missing_folder(tmp_path, settings) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        open_workspace(tmp_path / "nowhere", settings)


def test_open_with_a_task_must_name_the_bound_one(ws, settings, tmp_path) -> None:
    assert open_workspace(ws.root, settings).task.name == TASK
    assert open_workspace(ws.root, settings, task=TASK).task.name == TASK
    assert open_workspace(ws.root, settings, task=tasks_root() / TASK).task.name == TASK
    with pytest.raises(UsageError, match="is bound to task"):
        open_workspace(ws.root, settings, task="softmax")
    copy = kernel_task_copy(tmp_path / "copy")  # the same name, another folder
    with pytest.raises(UsageError, match="is bound to task"):
        open_workspace(ws.root, settings, task=copy)


def test_an_unbound_workspace_is_bound_to_the_operators_task(ws, settings) -> None:
    ws.store.binding_path.unlink()
    opened = open_workspace(ws.root, settings, task="softmax")
    assert opened.task.name == "softmax" and opened.root == ws.root
    assert binding(settings, ws.root)["how"] == "operator"


def test_a_command_task_folder_opens_as_its_own_workspace(tmp_path, settings) -> None:
    task = command_task(tmp_path / "task")
    opened = open_workspace(task, settings)
    assert opened.task.name == "cmd" and opened.root == task.resolve()
    assert binding(settings, task)["how"] == "first open"
    assert opened.store.imported_path.is_file()


def test_a_pre_store_workspace_is_bound_by_its_view_never_by_a_task_toml_beside_it(
    ws, settings, tmp_path
) -> None:
    ws.store.binding_path.unlink()
    ws.store.imported_path.unlink()
    shutil.copy(kernel_task_copy(tmp_path / "evil", name="evil") / "task.toml", ws.root)
    opened = open_workspace(ws.root, settings)
    assert opened.task.name == TASK and opened.task.root == (tasks_root() / TASK).resolve()
    assert binding(settings, ws.root)["how"] == "first open"
    assert opened.store.imported_path.is_file()  # its old state imported, once


def test_a_bound_workspace_not_yet_imported_is_imported_on_open(ws, settings) -> None:
    ws.store.imported_path.unlink()
    assert open_workspace(ws.root, settings).store.imported_path.is_file()


def test_a_pre_store_task_view_may_only_name_a_shipped_task(ws, settings) -> None:
    ws.store.binding_path.unlink()
    view = ws.root / ".harnesslab" / "task.json"
    for recorded in ({"task": "evil"}, {"task": 5}, [TASK], {}):
        view.write_text(json.dumps(recorded))
        with pytest.raises(UsageError, match="not a shipped task"):
            open_workspace(ws.root, settings)
    view.unlink()
    with pytest.raises(UsageError, match="not a harnesslab workspace"):
        open_workspace(ws.root, settings)


# -- is_workspace ----------------------------------------------------------------------------------
def test_a_workspace_is_a_bound_folder_a_task_view_or_a_task_toml(ws, settings, tmp_path) -> None:
    assert is_workspace(ws.root, settings) is True
    (ws.root / ".harnesslab" / "task.json").unlink()
    assert is_workspace(ws.root, settings) is True  # bound in the store
    ws.store.binding_path.unlink()
    assert is_workspace(ws.root, settings) is False
    (ws.root / ".harnesslab" / "task.json").write_text("{}")
    assert is_workspace(ws.root, settings) is True
    assert is_workspace(command_task(tmp_path / "task"), settings) is True
    assert is_workspace(tmp_path / "task" / "nowhere", settings) is False


def test_a_deleted_workspace_is_none_though_its_store_remains(ws, settings) -> None:
    shutil.rmtree(ws.root)
    assert ws.store.binding_path.is_file()
    assert is_workspace(ws.root, settings) is False
