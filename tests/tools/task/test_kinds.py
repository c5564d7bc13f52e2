"""Task kinds say what they do, so callers never test the kind: which evaluation a kind refuses
(`require_runner`, `require_objective`), how its final score reads (`scoring`), whether its
final verify draws hidden cases, what the lab, qualification, the HarnessGym importer and
inspect_context do with its tasks (ANSWERS: one row per kind), and every per-kind dispatch table in the servers and the loop
names every kind in KINDS (a new kind that forgets one fails here, not with a KeyError in a
tool call)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harnesslab.servers import autopilot, commands, task_tools
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation import overview
from harnesslab.tools.loop import driver
from harnesslab.tools.task.kinds import KINDS, kind_of
from harnesslab.tools.task.spec import TaskSpec, load_task, parse_task

TABLES = {
    "servers.task_tools.OBJECTIVE_BY_KIND": task_tools.OBJECTIVE_BY_KIND,
    "servers.task_tools.VERIFY_BY_KIND": task_tools.VERIFY_BY_KIND,
    "servers.commands.EVAL_BY_KIND": commands.EVAL_BY_KIND,
    "servers.commands.VERIFY_BY_KIND": commands.VERIFY_BY_KIND,
    "servers.autopilot.PHASES_BY_KIND": autopilot.PHASES_BY_KIND,
    "tools.loop.driver.SCORE_BY_KIND": driver.SCORE_BY_KIND,
    "tools.evaluation.overview.TASK_FIELDS_BY_KIND": overview.TASK_FIELDS_BY_KIND,
    "tools.evaluation.overview.NEXT_BY_KIND": overview.NEXT_BY_KIND,
}


def command_task(tmp_path: Path, *, unit: str = "", final: bool = False) -> TaskSpec:
    text = textwrap.dedent(
        f"""
        name = "cmd"
        summary = "s"
        kind = "command"
        editable = ["solution.txt"]
        objective = "python3 score.py"
        score_key = "speedup"
        higher_is_better = true
        {f'unit = "{unit}"' if unit else ""}
        """
    )
    if final:
        text += (
            '[final]\ncount = 2\ndtypes = ["float16"]\nranges = { rows = { min = 3, max = 9 } }\n'
        )
    return parse_task(text, tmp_path)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_per_kind_table_names_every_kind(table):
    assert set(TABLES[table]) == set(KINDS)


def test_a_kernel_task_is_run_by_the_runner_and_refuses_the_objective_paths():
    task = load_task("rmsnorm_gate")
    kind_of(task).require_runner(task, "run_objective")
    with pytest.raises(UsageError, match="rmsnorm_gate' is a kernel task") as err:
        kind_of(task).require_objective(task, "command_verify", "guarded_verify")
    assert err.value.next_step == "use guarded_verify"


def test_a_command_task_refuses_the_runner_and_takes_the_objective_paths(tmp_path):
    task = command_task(tmp_path)
    kind_of(task).require_objective(task, "run_command_objective", "run_objective")
    with pytest.raises(UsageError, match="sweep_kernel_config works on kernel tasks"):
        kind_of(task).require_runner(task, "sweep_kernel_config")


def test_tools_apply_to_every_kernel_task_and_only_the_generic_ones_to_a_command_task(tmp_path):
    kernel, command = kind_of(load_task("rmsnorm_gate")), kind_of(command_task(tmp_path))
    assert kernel.applies("sweep_kernel_config") and kernel.applies("run_objective")
    assert command.applies("run_objective") and command.applies("guarded_final_verify")
    assert not command.applies("sweep_kernel_config") and not command.applies("numerical_probe")


def test_the_final_score_reads_in_the_kinds_own_key_unit_and_direction(tmp_path):
    kernel = load_task("rmsnorm_gate")
    assert kind_of(kernel).scoring(kernel) == {
        "higher_is_better": False, "score_key": "score_us", "unit": "us"
    }  # fmt: skip
    plain = command_task(tmp_path)
    assert kind_of(plain).scoring(plain) == {
        "higher_is_better": True, "score_key": "speedup", "unit": ""
    }  # fmt: skip
    timed = command_task(tmp_path, unit="ms")
    assert kind_of(timed).scoring(timed)["unit"] == "ms"


def test_hidden_cases_are_drawn_where_the_task_has_a_final_domain(tmp_path):
    kernel = load_task("rmsnorm_gate")
    assert kind_of(kernel).draws_hidden_cases(kernel)
    assert not kind_of(command_task(tmp_path)).draws_hidden_cases(command_task(tmp_path))
    with_domain = command_task(tmp_path, final=True)
    assert kind_of(with_domain).draws_hidden_cases(with_domain)


def test_a_kernel_tasks_folder_may_not_be_in_the_workspace_a_command_tasks_may(tmp_path):
    kernel = load_task("rmsnorm_gate")
    folder = kernel.root.resolve()
    for workspace in (folder, folder.parent):
        with pytest.raises(UsageError, match="is inside the workspace"):
            kind_of(kernel).check_folder(kernel, workspace)
    kind_of(kernel).check_folder(kernel, tmp_path)
    command = command_task(tmp_path)
    kind_of(command).check_folder(command, tmp_path.resolve())


# A task of each kind, and what the kind answers for it to the lab (`in_lab`), qualification
# (`tries_cheats`), the HarnessGym importer (`contract_baseline`: the file relative to the task
# folder) and inspect_context (`reads_launch_config`). A new kind adds a row to both.
TASK_OF_KIND = {
    "kernel": lambda tmp_path: load_task("rmsnorm_gate"),
    "command": command_task,
    "step": lambda tmp_path: load_task("decode_step"),
}
ANSWERS = {
    "kernel": {"reads_launch_config": True, "in_lab": True, "tries_cheats": True,
               "contract_baseline": ("workspace/kernel.py", "rmsnorm_gate")},
    "command": {"reads_launch_config": False, "in_lab": False, "tries_cheats": False,
                "contract_baseline": None},
    "step": {"reads_launch_config": False, "in_lab": True, "tries_cheats": False,
             "contract_baseline": None},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_says_what_the_lab_qualification_importer_and_overview_do(name, tmp_path):
    task = TASK_OF_KIND[name](tmp_path)
    kind = kind_of(task)
    assert kind.name == name
    contract = kind.contract_baseline(task)
    assert {
        "reads_launch_config": kind.reads_launch_config(task),
        "in_lab": kind.in_lab(task),
        "tries_cheats": kind.tries_cheats(task),
        "contract_baseline": contract
        and (contract[0].relative_to(task.root).as_posix(), contract[1]),
    } == ANSWERS[name]


def test_the_decode_step_task_is_a_step_task_with_gpu_and_interpreter_sizes():
    task = load_task("decode_step")
    kind = kind_of(task)
    assert task.kind == "step" and kind.name == "step" and task.step is not None
    assert task.step.interpreter.layers == 2 and task.step.interpreter.hidden == 64
    assert task.step.model.hidden > task.step.interpreter.hidden
    assert kind.template(task) == task.root / "workspace"
    kind.require_steps(task, "run_objective")
    assert kind.score_label(task, "dev").startswith("us (sum over the dev traces of the p50")


def test_a_step_task_refuses_the_kernel_tools_and_the_guarded_verify_saying_why():
    task = load_task("decode_step")
    kind = kind_of(task)
    assert kind.applies("run_objective") and kind.applies("rank_history")
    assert not kind.applies("sweep_kernel_config") and not kind.applies("profile_kernel")
    for what in ("guarded_final_verify", "sweep_kernel_config", "numerical_probe"):
        with pytest.raises(UsageError, match=f"{what} is not built for step tasks yet") as err:
            kind.require_runner(task, what)
        assert "dev feedback" in str(err.value) and "run_objective" in err.value.next_step
    with pytest.raises(UsageError, match="is a step task"):
        kind.require_objective(task, "command_verify", "guarded_verify")
    kernel = load_task("rmsnorm_gate")
    with pytest.raises(UsageError, match="runs a step task's traces; 'rmsnorm_gate' is a kernel"):
        kind_of(kernel).require_steps(kernel, "run_step_objective")


def test_a_step_tasks_folder_may_not_be_in_the_workspace():
    task = load_task("decode_step")
    with pytest.raises(UsageError, match="is inside the workspace"):
        kind_of(task).check_folder(task, task.root.resolve().parent)


def test_only_the_step_kind_refuses_a_final_score(tmp_path):
    for task in (load_task("rmsnorm_gate"), command_task(tmp_path)):
        kind_of(task).require_final_score(task, "harnesslab run")
    step = load_task("decode_step")
    with pytest.raises(UsageError, match="harnesslab run \\(scored by the guarded verify\\)"):
        kind_of(step).require_final_score(step, "harnesslab run")
