"""Task kinds say what they do, so callers never test the kind: which evaluation a kind refuses
(`require_runner`, `require_objective`), how its final score reads (`scoring`), whether its
final verify draws hidden cases, what the lab, qualification, the HarnessGym importer and
inspect_context do with its tasks (ANSWERS: one row per kind), and every per-kind dispatch table in the servers and the loop
names every kind in KINDS (a new kind that forgets one fails here, not with a KeyError in a
tool call)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import harnesslab.servers as servers
import harnesslab.tools as tools
from harnesslab.servers import autopilot, commands, task_tools
from harnesslab.tools.errors import UsageError
from harnesslab.tools.evaluation import overview, probe, profiling
from harnesslab.tools.loop import driver
from harnesslab.tools.task.kinds import KINDS, TaskKind, kind_of
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
    "tools.evaluation.probe.PROBES_BY_KIND": probe.PROBES_BY_KIND,
}
# Tables of one tool's work per kind: they name every kind the tool applies to (the rest refuse
# it before, require_runner).
TOOL_TABLES = {
    "tools.evaluation.profiling.PROFILE_BY_KIND": ("profile_kernel", profiling.PROFILE_BY_KIND),
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


@pytest.mark.parametrize("table", sorted(TOOL_TABLES))
def test_every_tools_per_kind_table_names_every_kind_the_tool_applies_to(table):
    tool, entries = TOOL_TABLES[table]
    assert set(entries) == {name for name, kind in KINDS.items() if kind.applies(tool)}


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
    "step": {"reads_launch_config": True, "in_lab": True, "tries_cheats": False,
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
    # the final score: the step verify's timed pass on hidden traces (gpu/verify/step_timed.py)
    assert kind.score_label(task).startswith("us (sum over the hidden traces of the p50")


def test_a_step_task_takes_the_kernel_tools_and_refuses_the_kernel_verify_saying_why():
    task = load_task("decode_step")
    kind = kind_of(task)
    assert kind.applies("run_objective") and kind.applies("rank_history")
    assert not kind.applies("guarded_verify")
    # step_probe.py, the step sweep, step_profile.py
    for built in ("numerical_probe", "sweep_kernel_config", "profile_kernel"):
        assert kind.applies(built)
        kind.require_runner(task, built)
    for what in ("guarded_final_verify", "a kernel task's guarded verify"):
        with pytest.raises(UsageError, match=f"{what} is not built for step tasks \\(") as err:
            kind.require_runner(task, what)
        assert "dev feedback" in str(err.value) and "run_objective" in err.value.next_step
        assert "p50 step latency" in str(err.value)  # what the step's own verify scores
        for built in ("probe", "sweep", "profile"):
            assert built not in err.value.message  # the refusal says what is not built
            assert built in err.value.next_step  # and names the built ones as next steps
    kind.require_final_score(task, "harnesslab run")  # the loop: the step verify's score
    with pytest.raises(UsageError, match="is a step task"):
        kind.require_objective(task, "command_verify", "guarded_verify")
    kernel = load_task("rmsnorm_gate")
    with pytest.raises(UsageError, match="runs a step task's traces; 'rmsnorm_gate' is a kernel"):
        kind_of(kernel).require_steps(kernel, "run_step_objective")


def test_a_step_tasks_folder_may_not_be_in_the_workspace():
    task = load_task("decode_step")
    with pytest.raises(UsageError, match="is inside the workspace"):
        kind_of(task).check_folder(task, task.root.resolve().parent)


def test_every_kind_has_a_final_score_so_the_loop_takes_it(tmp_path):
    """A step task's guarded verify times a pass and scores it (tools/gpu/verify/step_timed.py):
    the loop no longer refuses it (before: "harnesslab run (scored by the guarded verify) is not
    built for step tasks yet")."""
    for task in (load_task("rmsnorm_gate"), command_task(tmp_path), load_task("decode_step")):
        kind_of(task).require_final_score(task, "harnesslab run")


# -- what each kind's task.toml must hold (problems(), through parse_task) --------------------
KERNEL_TOML = """
name = "k"
summary = "s"
kind = "kernel"
entry = "kernel.py:f"
config_file = "kernel_config.json"
editable = ["kernel.py", "kernel_config.json"]
dtypes = ["float16"]
[tolerances.float16]
atol = 1e-2
rtol = 1e-2
[[dev_cases]]
name = "a"
dtype = "float16"
shape = { rows = 4 }
[final]
count = 1
dtypes = ["float16"]
ranges = { rows = { min = 1, max = 8 } }
"""


def refusal(text: str, tmp_path: Path) -> str:
    with pytest.raises(UsageError) as err:
        parse_task(text, tmp_path)
    return str(err.value)


def test_a_kernel_task_needs_an_entry_cases_a_domain_tolerances_and_complete_languages(tmp_path):
    task = parse_task(KERNEL_TOML, tmp_path)
    assert kind_of(task).template(task) == tmp_path / "workspace"
    dev_case = '[[dev_cases]]\nname = "a"\ndtype = "float16"\nshape = { rows = 4 }'
    broken = [
        (KERNEL_TOML.replace('"kernel.py:f"', '"kernel.py"'), "need entry = 'file.py:function'"),
        (KERNEL_TOML.replace(dev_case, ""), "kernel tasks need dev_cases and a [final] domain"),
        (KERNEL_TOML[: KERNEL_TOML.index("[final]")], "need dev_cases and a [final] domain"),
        (KERNEL_TOML.replace("[tolerances.float16]", "[tolerances.float32]"),
         "no tolerance for dtype float16"),
    ]  # fmt: skip
    for text, problem in broken:
        assert problem in refusal(text, tmp_path)
    for editable, missing in (('["kernel.cu", "kernel.py"]', "kernel_config.json"),
                              ('["kernel.cu", "kernel_config.json"]', "kernel.py")):  # fmt: skip
        text = KERNEL_TOML + f"[languages.cuda]\neditable = {editable}\n"
        assert f"[languages.cuda] editable must list {missing}" in refusal(text, tmp_path)
    whole = KERNEL_TOML + '[languages.cuda]\neditable = ["kernel.py", "kernel_config.json"]\n'
    assert parse_task(whole, tmp_path).languages["cuda"].editable[0] == "kernel.py"


def test_a_declared_kernel_tasks_declaration_is_checked_with_the_tasks_dims(tmp_path):
    declare = (
        '[declare]\nreference = "ref.py:f"\ninputs = [{ name = "x", shape = ["rows"] }]\n'
        'output = { shape = ["%s"] }\n'
    )
    assert parse_task(KERNEL_TOML + declare % "rows", tmp_path).declare is not None
    assert "declare.output.shape: unknown dim 'cols'" in refusal(
        KERNEL_TOML + declare % "cols", tmp_path
    )


COMMAND_TOML = 'name = "c"\nsummary = "s"\nkind = "command"\neditable = ["a.txt"]\n'


def test_a_command_task_needs_a_dev_and_a_final_objective_and_what_their_placeholders_use(
    tmp_path,
):
    assert "command tasks need objective =" in refusal(COMMAND_TOML, tmp_path)
    dev = '[objectives.dev]\ncommand = "python3 dev.py {warmup}"\nwarmup = 1\n'
    final = '[objectives.final]\ncommand = "python3 final.py"\n'
    assert "[objectives.final] is missing" in refusal(COMMAND_TOML + dev, tmp_path)
    assert "[objectives.dev] is missing" in refusal(COMMAND_TOML + final, tmp_path)
    assert parse_task(COMMAND_TOML + dev + final, tmp_path).kind == "command"
    one = COMMAND_TOML.replace('kind = "command"', 'kind = "command"\nobjective = "x"')
    assert parse_task(one + dev, tmp_path).objective == "x"  # one objective: no table needed
    cases_file = final.replace("final.py", "final.py {cases_file}")
    assert "the final objective uses {cases_file}: add a [final] domain" in refusal(
        COMMAND_TOML + dev + cases_file, tmp_path
    )
    domain = '[final]\ncount = 1\ndtypes = ["float16"]\nranges = { n = { min = 1, max = 2 } }\n'
    assert parse_task(COMMAND_TOML + dev + cases_file + domain, tmp_path).final is not None
    for knob in ("warmup", "repeats", "cases"):
        uses = f'[objectives.dev]\ncommand = "python3 dev.py {{{knob}}}"\n'
        assert f"[objectives.dev] uses {{{knob}}}: give it a default ({knob} = ...)" in refusal(
            COMMAND_TOML + uses + final, tmp_path
        )


def test_a_step_task_needs_an_entry_a_step_table_tolerances_and_trace_dtypes(tmp_path):
    text = (load_task("decode_step").root / "task.toml").read_text()
    assert parse_task(text, tmp_path).step is not None
    assert "step tasks need entry = 'file.py:step'" in refusal(
        text.replace('entry = "kernel.py:step"', 'entry = "kernel.py"'), tmp_path
    )
    no_step = text[: text.index("[step]")]
    assert "step tasks need a [step] table" in refusal(no_step, tmp_path)
    both = no_step.replace('entry = "kernel.py:step"', 'entry = "kernel.py"')
    assert "step tasks need entry = 'file.py:step'" in refusal(both, tmp_path)
    assert "no tolerance for dtype bfloat16" in refusal(
        text.replace("[tolerances.bfloat16]", "[tolerances.float32]"), tmp_path
    )
    assert "step.traces 'dynamic_bf16': dtype bfloat16 is not one of the task's dtypes" in (
        refusal(text.replace('dtypes = ["float16", "bfloat16"]', 'dtypes = ["float16"]'), tmp_path)
    )
    unlisted = text.replace(
        'editable = ["kernel.py", "kernel_config.json"]', 'editable = ["kernel.py"]'
    )
    assert "editable must list the launch config kernel_config.json" in refusal(unlisted, tmp_path)
    # no launch config at all: nothing for editable to list
    no_config = unlisted.replace('config_file = "kernel_config.json"\n', "")
    assert parse_task(no_config, tmp_path).config_file == ""


def test_each_generic_tool_applies_to_a_command_task(tmp_path):
    command = kind_of(command_task(tmp_path))
    for tool in ("inspect_context", "run_objective", "guarded_final_verify", "rank_history",
                 "restore_best_checkpoint", "remote_health_check"):  # fmt: skip
        assert command.applies(tool), tool


def test_only_a_command_task_gets_its_folders_own_files(tmp_path):
    copies = {name: kind_of(TASK_OF_KIND[name](tmp_path)).copies_task_files for name in KINDS}
    assert copies == {"kernel": False, "command": True, "step": False}


def test_a_scores_unit_direction_and_label_follow_the_mode_and_the_objective(tmp_path):
    kernel = load_task("rmsnorm_gate")
    kk = kind_of(kernel)
    assert (kk.unit(kernel, "dev"), kk.higher_is_better(kernel, "dev")) == ("us", False)
    assert kk.score_label(kernel) == "us (sum of per-case median device time), lower is better"
    text = COMMAND_TOML + (
        'score_key = "top"\n'
        '[objectives.dev]\ncommand = "python3 dev.py"\nscore_key = "speedup"\n'
        "higher_is_better = true\n"
        '[objectives.final]\ncommand = "python3 final.py"\nunit = "ms"\n'
    )
    task = parse_task(text, tmp_path)
    kc = kind_of(task)
    assert (kc.unit(task, "dev"), kc.unit(task, "final")) == ("speedup", "ms")
    assert (kc.higher_is_better(task, "dev"), kc.higher_is_better(task, "final")) == (True, False)
    assert kc.score_label(task, "dev") == "speedup, higher is better"
    assert kc.score_label(task, "final") == "top (ms), lower is better"
    assert kc.scoring(task) == {"higher_is_better": False, "score_key": "top", "unit": "ms"}
    bare = parse_task(COMMAND_TOML + '[objectives.dev]\ncommand = "a"\n[objectives.final]\n'
                      'command = "b"\nunit = ""\n', tmp_path)  # fmt: skip
    assert kind_of(bare).unit(bare) == "score"  # no unit: the score key names it
    nameless = parse_task(COMMAND_TOML + 'score_key = ""\n'
                          + '[objectives.dev]\ncommand = "a"\n[objectives.final]\ncommand = "b"\n',
                          tmp_path)  # fmt: skip
    assert kind_of(nameless).scoring(nameless)["score_key"] == "score"


def test_a_new_kind_that_forgets_its_template_or_its_checks_fails_loudly(tmp_path):
    """Rule: the base class answers neither (a kind that forgot one is no valid kind)."""

    class Forgetful(TaskKind):
        name = "forgetful"
        full_case_set = "all"

    task = command_task(tmp_path)
    with pytest.raises(NotImplementedError):
        Forgetful().template(task)
    with pytest.raises(NotImplementedError):
        Forgetful().problems(task)


def test_a_tools_cases_name_the_dev_cases_with_their_sizes_and_a_step_tasks_its_traces(
    tmp_path,
):
    """What run_objective's and sweep_kernel_config's `cases` name (the autopilot picks from
    them, the self-test runs the first)."""
    kernel = load_task("rmsnorm_gate")
    rows = kind_of(kernel).dev_cases(kernel)
    assert rows[:2] == [{"name": "1024x1024_fp16", "rows": 1024, "dim": 1024},
                        {"name": "768x2048_fp16", "rows": 768, "dim": 2048}]  # fmt: skip
    assert [r["name"] for r in rows] == [c.name for c in kernel.dev_cases]
    command = command_task(tmp_path).model_copy(update={"dev_cases": kernel.dev_cases[:1]})
    assert kind_of(command).dev_cases(command) == rows[:1]  # a command task's own, if any
    assert kind_of(command_task(tmp_path)).dev_cases(command_task(tmp_path)) == []
    step = load_task("decode_step")
    assert kind_of(step).dev_cases(step) == [
        {"name": "fixed_fp16"},
        {"name": "dynamic_fp16"},
        {"name": "dynamic_bf16"},
    ]
    assert step.dev_cases == []  # ...not the kernel cases a step task does not have
    assert kind_of(step).dev_cases(step.model_copy(update={"step": None})) == []


def test_a_runs_cases_are_checked_and_selected_by_the_kind_in_the_order_given(tmp_path):
    """Rule: `cases` names a kernel task's dev cases (in the order given), a step task's dev
    traces (in the task's order); an unknown name is refused with the argument's name and
    every name it takes; None is all of them."""
    kernel = load_task("rmsnorm_gate")
    kind = kind_of(kernel)
    names = [c.name for c in kernel.dev_cases]
    assert kind.select(kernel, None) == list(kernel.dev_cases) == kind.select(kernel, [])
    picked = kind.select(kernel, [names[1], names[0]])
    assert picked == [kernel.dev_cases[1], kernel.dev_cases[0]]
    with pytest.raises(UsageError) as err:
        kind.select(kernel, [names[0], "nope"], "case")
    assert err.value.message == "case: unknown case 'nope'."
    assert err.value.next_step == f"case takes {', '.join(names)}"
    step = load_task("decode_step")
    traces = kind_of(step).select(step, ["dynamic_bf16", "fixed_fp16"])
    assert [(c.name, c.dtype, c.shape) for c in traces] == [
        ("fixed_fp16", "float16", {}), ("dynamic_bf16", "bfloat16", {})]  # fmt: skip
    assert [c.name for c in kind_of(step).select(step, None)] == [
        "fixed_fp16", "dynamic_fp16", "dynamic_bf16"]  # fmt: skip
    with pytest.raises(UsageError) as err:
        kind_of(step).select(step, ["fixed"])
    assert err.value.message == "cases: unknown trace 'fixed'."
    assert err.value.next_step == "cases takes fixed_fp16, dynamic_fp16, dynamic_bf16"
    with pytest.raises(UsageError, match="unknown case 'x'") as err:
        kind_of(command_task(tmp_path)).check_cases(command_task(tmp_path), ["x"], "cases")
    assert err.value.next_step == "cases takes none"
    kind.check_cases(kernel, None, "cases")  # nothing named: nothing to refuse


def test_a_runner_request_carries_a_kernels_cases_and_a_step_tasks_step_table():
    """Rule: what kernel_request is given for `names`: a kernel's selected cases, a step task's
    [step] request with the named traces (all: None), never the other's key."""
    kernel = load_task("rmsnorm_gate")
    names = [c.name for c in kernel.dev_cases]
    assert kind_of(kernel).runner_cases(kernel, None) == {"cases": list(kernel.dev_cases)}
    assert kind_of(kernel).runner_cases(kernel, names[:1]) == {"cases": kernel.dev_cases[:1]}
    step = load_task("decode_step")
    assert step.step is not None
    assert kind_of(step).runner_cases(step, None) == {"step": step.step.request()}
    named = kind_of(step).runner_cases(step, ["dynamic_bf16"])
    assert named == {"step": step.step.request(["dynamic_bf16"])}
    assert [t["name"] for t in named["step"]["traces"]] == ["dynamic_bf16"]
    with pytest.raises(UsageError, match="unknown trace 'nope'"):
        kind_of(step).runner_cases(step, ["nope"])
    with pytest.raises(UsageError, match="unknown case 'nope'"):
        kind_of(kernel).runner_cases(kernel, ["nope"])


def test_a_step_tasks_sweep_scores_a_config_with_a_whole_run_a_kernels_compiles_first():
    assert KINDS["step"].sweep_runs_objective
    assert not KINDS["kernel"].sweep_runs_objective
    assert not KINDS["command"].sweep_runs_objective


def test_require_steps_hands_over_the_step_table_and_refuses_a_step_task_without_one():
    step = load_task("decode_step")
    assert kind_of(step).require_steps(step, "x") is step.step
    with pytest.raises(UsageError, match="x: step task 'decode_step' has no \\[step\\] table"):
        kind_of(step).require_steps(step.model_copy(update={"step": None}), "x")


# Where a task's kind may be tested: the kinds themselves (tools/task/), and the staged GPU side,
# which never sees a TaskSpec (its `step` is a step index).
KIND_HOMES = (Path(tools.__path__[0]) / "task", Path(tools.__path__[0]) / "gpu")


def kind_tests(source: str) -> list[str]:
    """The expressions in `source` that test a task's kind instead of asking it: a task's
    `.kind` compared with anything; any `.step`, or a name bound to one (`step = t.step`),
    compared with None; a task's `.step` or such a name taken as a truth value."""
    tree = ast.parse(source)
    aliases = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "step"
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def a_step(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "step") or (
            isinstance(node, ast.Name) and node.id in aliases
        )

    def of_task(node: ast.AST, attr: str) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == attr
            and ast.unparse(node.value).endswith("task")
        )

    found = []
    for node in ast.walk(tree):
        tested: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            none = any(isinstance(x, ast.Constant) and x.value is None for x in sides)
            if any(of_task(x, "kind") for x in sides) or (none and any(map(a_step, sides))):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.If | ast.IfExp | ast.While | ast.Assert):
            tested = [node.test]
        elif isinstance(node, ast.BoolOp):
            tested = node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tested = [node.operand]
        elif isinstance(node, ast.comprehension):
            tested = node.ifs
        found += [
            ast.unparse(t)
            for t in tested
            if of_task(t, "step") or (isinstance(t, ast.Name) and t.id in aliases)
        ]
    return found


@pytest.mark.parametrize(
    "source",
    [
        "if ws.task.step is not None: pass",
        "x = 1 if task.step is None else 2",
        "assert t.step is not None",
        "if state.workspace.task.step: pass",
        "ok = not task.step",
        "ok = bool(x) and ws.task.step",
        'if task.kind == "step": pass',
        'x = [1 for _ in y if ws.task.kind in ("kernel", "step")]',
        'if task.kind != "command": pass',
        "step = ws.task.step\nx = {} if step is None else step.request()",
        "step = t.step\nmodel = step.model if step else None",
    ],
)
def test_a_test_of_the_tasks_kind_is_seen(source):
    assert kind_tests(source) != []


def test_asking_the_kind_and_other_steps_and_kinds_are_not_kind_tests():
    source = (
        "kind_of(task).require_steps(task, 'x')\n"
        "if kind.sweep_runs_objective: pass\n"
        "while it.step != 'done': pass\n"  # the loop's phase
        "if report.kind == 'command': pass\n"  # an import report's, not a task's
        "if p.kind == p.VAR_KEYWORD: pass\n"
        "step = kind.require_steps(task, 'x')\n"
    )
    assert kind_tests(source) == []


def test_callers_never_test_a_tasks_kind_they_ask_it():
    """Rule: outside the kinds (tools/task/), tools/ and servers/ never branch on a task's kind
    or on whether it has a [step] table: they ask `kind_of(task)` (select, runner_cases,
    require_steps, ...) or take the kind's entry of a per-kind table (TABLES, TOOL_TABLES)."""
    roots = [Path(tools.__path__[0]), Path(servers.__path__[0])]
    found = [
        f"{path.relative_to(root.parent)}: {hit}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if not any(home in path.parents for home in KIND_HOMES)
        for hit in kind_tests(path.read_text())
    ]
    assert found == []
