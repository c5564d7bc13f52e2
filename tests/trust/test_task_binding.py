"""Attack: the agent rewrites `.harnesslab/task.json` (or drops a task.toml in its workspace) to
bind the workspace to a task folder it wrote, whose reference.py the verifier would run and
whose task.toml would set the tolerances and the hidden domain. The binding lives in the
trusted store; a workspace from before the store is bound only to a shipped task by name, a
task folder only when the operator names it on the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harnesslab.servers.builtin import ServerState
from harnesslab.tools.errors import UsageError
from harnesslab.tools.task.spec import load_task, tasks_root

from .support import SMALL, TASK, canned_state, cli, init_ws, settings_for, tool_calls

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def evil_task(folder: Path) -> Path:
    """rmsnorm_gate with any output accepted and a reference that leaves a mark when run."""
    shutil.copytree(tasks_root() / TASK, folder, ignore=shutil.ignore_patterns("__pycache__"))
    toml = (folder / "task.toml").read_text().replace(f'name = "{TASK}"', 'name = "evil"')
    (folder / "task.toml").write_text(toml.replace("atol = ", "atol = 1e9 # "))
    ref = folder / "reference.py"
    ref.write_text(f"open({str(folder / 'RAN')!r}, 'w').close()\n" + ref.read_text())
    return folder


async def test_a_forged_task_json_does_not_rebind_the_workspace(tmp_path, monkeypatch, capsys):
    root = init_ws(tmp_path, monkeypatch, capsys)
    evil = evil_task(root / "evil_task")
    (root / ".harnesslab/task.json").write_text(
        json.dumps({"task": "evil", "task_root": str(evil)})
    )
    shutil.copy(evil / "task.toml", root / "task.toml")  # and a task.toml of its own, too

    state = canned_state(root, tmp_path)
    ctx, obj = await tool_calls(
        state, ("inspect_context", {}), ("run_objective", {"cases": [SMALL]})
    )
    await state.aclose()
    assert ctx.structured_content["task"]["name"] == TASK
    assert not obj.is_error
    shipped = {k: v.model_dump() for k, v in load_task(TASK).tolerances.items()}
    assert state.launcher.requests[-1]["tolerances"] == shipped
    assert not (evil / "RAN").exists()


def legacy_workspace(tmp_path: Path, task_json: dict) -> Path:
    """A workspace as harnesslab made it before the trusted store: the template's files and a
    `.harnesslab/task.json`, nothing in any store."""
    root = tmp_path / "old"
    shutil.copytree(tasks_root() / TASK / "workspace", root)
    (root / ".harnesslab").mkdir()
    (root / ".harnesslab/task.json").write_text(json.dumps(task_json))
    return root


def test_a_pre_store_workspace_naming_an_agent_task_folder_is_refused_until_the_operator_binds_it(
    tmp_path, monkeypatch, capsys
):
    evil = evil_task(tmp_path / "old_task")
    root = legacy_workspace(tmp_path, {"task": "evil", "task_root": str(evil)})
    with pytest.raises(UsageError) as err:
        ServerState.open(root, settings_for(tmp_path))
    assert "not a shipped task" in err.value.message
    assert "harnesslab bind --task FOLDER" in err.value.next_step

    # The operator names the folder on the command line: then, and only then, it is the task.
    code, out, _ = cli(
        ["bind", "--task", str(evil), "-w", str(root)], tmp_path, monkeypatch, capsys
    )
    assert code == 0 and "bound to task evil" in out
    state = ServerState.open(root, settings_for(tmp_path))
    assert state.workspace.task.name == "evil"


def test_a_task_folder_inside_the_workspace_is_never_bound(tmp_path, monkeypatch, capsys):
    root = tmp_path / "ws"
    root.mkdir()
    evil = evil_task(root / "mine")
    code, _, err = cli(
        ["init", "--task", str(evil), str(root), "--force"], tmp_path, monkeypatch, capsys
    )
    assert code == 2 and "inside the workspace" in err
