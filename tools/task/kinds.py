"""Task kinds: what differs between a kernel task, a command task and a step task (a decode step
over a KV cache), in one object per kind.

Callers ask a task's kind (`kind_of(task)`) what it does instead of testing it (or testing
whether the task has a `[step]` table: tests/tools/task/test_kinds.py scans for both): which
tools apply, which evaluation takes its candidate (`require_runner`, `require_objective`,
`require_steps`: each refuses with a next step), which case set a full run is, which dev cases
(a step task's: traces) a run's `cases` names (`select`, `check_cases`) and what the runner
request carries for them (`runner_cases`), the score's unit, direction and key (`scoring`),
what a new workspace gets from the template, whether its folder may sit inside a workspace
(`check_folder`), whether its final verify draws hidden cases. Code of the layers
above (the dev objective, the final verify, the loop's score) is picked from tables keyed by
the kind's name there (docs/architecture.md "Adding a task kind"). A new kind (a "bring your
own kernel" task) is one subclass registered in KINDS and an entry in each of those tables
(tests/tools/task/test_kinds.py); tests/tasks/test_task_contract.py runs over every task.

A kind reads its task through `TaskView`, a Protocol of what it uses of spec.TaskSpec: spec.py
validates a task through its kind (`problems`), so this module imports nothing of spec.py (a
`Case` is case.py's).

Side of the trust boundary: trusted (it decides which path, guarded or not, scores a task).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from ..errors import UsageError
from .case import Case
from .declaration import Declaration
from .step import StepSpec


class ObjectiveView(Protocol):
    """What a kind reads of a command task's objective (spec.Objective)."""

    @property
    def command(self) -> str: ...
    @property
    def score_key(self) -> str | None: ...
    @property
    def unit(self) -> str | None: ...
    @property
    def higher_is_better(self) -> bool | None: ...


class LanguageView(Protocol):
    """A kernel language's version of a task (spec.Language): its editable files."""

    @property
    def editable(self) -> Sequence[str]: ...


class TaskView(Protocol):
    """What a kind reads of its task (spec.TaskSpec satisfies it; mypy checks every call)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> Literal["kernel", "command", "step"]: ...
    @property
    def root(self) -> Path: ...
    @property
    def entry(self) -> str: ...
    @property
    def entry_file(self) -> str: ...
    @property
    def entry_function(self) -> str: ...
    @property
    def workspace_template(self) -> Path: ...
    @property
    def config_file(self) -> str: ...
    @property
    def editable(self) -> Sequence[str]: ...
    @property
    def dtypes(self) -> Sequence[str]: ...
    @property
    def tolerances(self) -> Mapping[str, object]: ...
    @property
    def dev_cases(self) -> Sequence[Case]: ...
    @property
    def final(self) -> object | None: ...
    @property
    def declare(self) -> Declaration | None: ...
    @property
    def languages(self) -> Mapping[str, LanguageView]: ...
    @property
    def step(self) -> StepSpec | None: ...
    @property
    def objective(self) -> str: ...
    @property
    def objectives(self) -> Mapping[Literal["dev", "final"], ObjectiveView]: ...
    @property
    def score_key(self) -> str: ...
    def dims(self) -> set[str]: ...
    def objective_for(self, mode: Literal["dev", "final"]) -> ObjectiveView: ...


# The tools that work on every kind of task (the rest need a kernel the runner can import).
GENERIC_TOOLS = frozenset(
    {"inspect_context", "run_objective", "guarded_final_verify", "rank_history",
     "restore_best_checkpoint", "remote_health_check"}
)  # fmt: skip
# The runner's tools built for a step task's decode step too (the rest refuse it, saying so).
STEP_TOOLS = frozenset({"numerical_probe", "sweep_kernel_config", "profile_kernel"})


class TaskKind:
    """The behaviour of one kind of task (a stateless singleton in KINDS)."""

    name: ClassVar[str]
    # The case set of a full run: scores compare only within one.
    full_case_set: ClassVar[str]

    def applies(self, tool: str) -> bool:
        """Whether the MCP tool `tool` works on this kind of task."""
        return tool in GENERIC_TOOLS

    def require_runner(self, task: TaskView, what: str) -> None:
        """Refuse `what` (a tool, a mode) unless the runner evaluates this kind's candidates
        (imports them as a kernel: config, dev cases, hidden cases, the guarded verify)."""
        raise UsageError(
            f"{what} works on kernel tasks; {task.name!r} is a {task.kind} task.",
            next_step="use run_objective, rank_history and restore_best_checkpoint",
        )

    # init copies the task folder's own files (task_files) when template() names no folder.
    copies_task_files: ClassVar[bool] = False

    def unit(self, task: TaskView, mode: str = "final") -> str:
        """What a score of `mode` ("dev" or "final") counts."""
        return "us"

    def higher_is_better(self, task: TaskView, mode: str = "final") -> bool:
        return False

    def score_label(self, task: TaskView, mode: str = "final") -> str:
        """'best_us (us), lower is better': what a score of `mode` is, for people and agents."""
        return "us (sum of per-case median device time), lower is better"

    def scoring(self, task: TaskView) -> dict[str, Any]:
        """How a final score reads in the loop's and compare's reports: higher_is_better,
        score_key (the result's field) and unit ("" when the task declares none)."""
        return {"higher_is_better": False, "score_key": "score_us", "unit": "us"}

    def dev_cases(self, task: TaskView) -> list[dict[str, Any]]:
        """What the `cases` argument of run_objective and sweep_kernel_config names, in the
        task's order: each case's name with its named sizes (the task's dev cases)."""
        return [{"name": c.name, **c.shape} for c in task.dev_cases]

    # What one name of `cases` (profile_kernel: `case`) names, in the refusal of an unknown one.
    case_noun: ClassVar[str] = "case"

    def check_cases(self, task: TaskView, names: Sequence[str] | None, arg: str) -> None:
        """Refuse a name in `names` (the tool argument `arg`) that is none of dev_cases',
        saying every name `arg` takes."""
        known = [c["name"] for c in self.dev_cases(task)]
        for name in names or []:
            if name not in known:
                raise UsageError(
                    f"{arg}: unknown {self.case_noun} {name!r}.",
                    next_step=f"{arg} takes {', '.join(known) or 'none'}",
                )

    def select(self, task: TaskView, names: list[str] | None, arg: str = "cases") -> list[Case]:
        """The dev cases a run on the runner takes for `names` (all of them: None or empty),
        checked (check_cases), each as the Case its result row answers: the named ones in
        the order given."""
        self.check_cases(task, names, arg)
        by_name = {c.name: c for c in task.dev_cases}
        return [by_name[n] for n in names] if names else list(task.dev_cases)

    def runner_cases(self, task: TaskView, names: list[str] | None) -> dict[str, Any]:
        """What a runner request carries for the dev cases `names` (all: None), as keyword
        arguments of evaluation/request.py's kernel_request: the cases themselves."""
        return {"cases": self.select(task, names)}

    # sweep_kernel_config: whether a config is scored by one whole dev run of the candidate (a
    # step task's traces: no compile-only phase on the compile workers, a run's timeout per
    # config) rather than compiled and checked apart first, then timed per dev case.
    sweep_runs_objective: ClassVar[bool] = False

    def draws_hidden_cases(self, task: TaskView) -> bool:
        """Whether the final score is taken on cases drawn from the workspace's secret (so a
        rotation draws new ones)."""
        return task.final is not None

    def check_folder(self, task: TaskView, workspace: Path) -> None:
        """Refuse a task folder (not shipped) that the agent's workspace `workspace` holds, if
        this kind's verifier trusts what is in it. A command task's files are kept in the
        trusted store when it is bound (state/task_files.py): its folder may be anywhere."""
        return None

    # What the lab, qualification, the importers and inspect_context ask of a kind. The
    # answers here are a candidate no runner imports as a kernel function (a command task's);
    # a kind that offers more says so (KernelKind; tests/tools/task/test_kinds.py pins each).
    def reads_launch_config(self, task: TaskView) -> bool:
        """Whether a candidate carries a launch config (task.config_file) the runner reads:
        inspect_context shows it and what is wrong with it."""
        return False

    def in_lab(self, task: TaskView) -> bool:
        """Whether the lab (tools/lab/: every strategy and solution of the task timed on the
        GPU host) benchmarks this task."""
        return False

    def contract_baseline(self, task: TaskView) -> tuple[Path, str] | None:
        """The shipped baseline file and its entry function that an imported kernel is matched
        against (same leading parameters: the HarnessGym importer takes this task's reference
        and cases for it), or None: no imported kernel takes this task's contract."""
        return None

    def tries_cheats(self, task: TaskView) -> bool:
        """Whether qualification writes its cheats (x.clone() and the integrity corpus's
        kernels) over the entry file (task.entry_file) and expects the verify to reject each."""
        return False

    def template(self, task: TaskView) -> Path | None:
        """The folder a new workspace is copied from (None: only task.md)."""
        raise NotImplementedError

    def problems(self, task: TaskView) -> list[str]:
        """What task.toml lacks for this kind (empty: a valid task)."""
        raise NotImplementedError

    def require_final_score(self, task: TaskView, what: str) -> None:
        """Refuse `what` (the loop, compare) unless this kind's candidates get a final score
        (the guarded verify; a command task's final objective)."""
        return None

    def require_steps(self, task: TaskView, what: str) -> StepSpec:
        """Refuse `what` unless this kind's candidate is a decode step the runner runs over
        traces (its step mode: tools/gpu/step_trace.py); the task's `[step]` table."""
        raise UsageError(
            f"{what} runs a step task's traces; {task.name!r} is a {task.kind} task.",
            next_step="use run_objective",
        )

    def require_objective(self, task: TaskView, what: str, instead: str) -> None:
        """Refuse `what` unless this kind's candidates are scored by the task's own objective
        command (a command task's dev and final objectives); `instead`: what to call."""
        raise UsageError(
            f"{what} runs a command task's objective; {task.name!r} is a {task.kind} task.",
            next_step=f"use {instead}",
        )


def _reference_outside(task: TaskView, workspace: Path) -> None:
    """A folder holding the reference (and task.toml) a score trusts is never the agent's to
    edit: refuse one inside the workspace."""
    folder = task.root.resolve()
    if folder == workspace or workspace in folder.parents:
        raise UsageError(
            f"the task folder {folder} is inside the workspace {workspace}: its "
            "reference.py and task.toml would be the agent's to edit.",
            next_step="keep the task folder outside the workspace and pass it with --task",
        )


class KernelKind(TaskKind):
    """The candidate is a kernel the runner imports: every tool applies, dev cases are named
    shapes, a launch config is read, and the final score is the guarded verify's on cases
    drawn from a secret (rotated for the loop's final verify)."""

    name = "kernel"
    full_case_set = "all"  # run_objective with every dev case

    def applies(self, tool: str) -> bool:
        return True

    def require_runner(self, task: TaskView, what: str) -> None:
        return None

    def check_folder(self, task: TaskView, workspace: Path) -> None:
        _reference_outside(task, workspace)

    def reads_launch_config(self, task: TaskView) -> bool:
        return True

    def in_lab(self, task: TaskView) -> bool:
        return True

    def contract_baseline(self, task: TaskView) -> tuple[Path, str] | None:
        return task.workspace_template / task.entry_file, task.entry_function

    def tries_cheats(self, task: TaskView) -> bool:
        return True

    def template(self, task: TaskView) -> Path | None:
        return task.workspace_template

    def problems(self, task: TaskView) -> list[str]:
        out = []
        if ":" not in task.entry:
            out.append("kernel tasks need entry = 'file.py:function'")
        if not task.dev_cases or task.final is None:
            out.append("kernel tasks need dev_cases and a [final] domain")
        out += [f"no tolerance for dtype {d}" for d in task.dtypes if d not in task.tolerances]
        if task.declare is not None:  # the text only: a sandboxed reader cannot see the folder
            out += task.declare.problems(task.dims())
        for name, lang in task.languages.items():
            for needed in filter(None, (task.entry_file, task.config_file)):
                if needed not in lang.editable:
                    out.append(f"[languages.{name}] editable must list {needed}")
        return out


class CommandKind(TaskKind):
    """Any folder with a task.md and an objective command printing JSON with a score key."""

    name = "command"
    full_case_set = "command"  # a command task's objective is one fixed case set

    copies_task_files = True

    def require_objective(self, task: TaskView, what: str, instead: str) -> None:
        return None

    def unit(self, task: TaskView, mode: str = "final") -> str:
        obj = task.objective_for("final" if mode == "final" else "dev")
        return obj.unit or obj.score_key or task.score_key

    def higher_is_better(self, task: TaskView, mode: str = "final") -> bool:
        return bool(task.objective_for("final" if mode == "final" else "dev").higher_is_better)

    def scoring(self, task: TaskView) -> dict[str, Any]:
        obj = task.objective_for("final")
        return {
            "higher_is_better": bool(obj.higher_is_better),
            "score_key": obj.score_key or "score",
            "unit": obj.unit or "",
        }

    def score_label(self, task: TaskView, mode: str = "final") -> str:
        obj = task.objective_for("final" if mode == "final" else "dev")
        unit = f" ({obj.unit})" if obj.unit else ""
        better = "higher" if obj.higher_is_better else "lower"
        return f"{obj.score_key}{unit}, {better} is better"

    def template(self, task: TaskView) -> Path | None:
        return None  # state/task_files.py reads its folder, whatever the layout

    def problems(self, task: TaskView) -> list[str]:
        if not task.objective and not task.objectives:
            return [
                "command tasks need objective = 'command printing JSON', or [objectives.dev] "
                "and [objectives.final] tables with a command each"
            ]
        if not task.objective and set(task.objectives) != {"dev", "final"}:
            missing = sorted({"dev", "final"} - set(task.objectives))
            return [f"[objectives.{missing[0]}] is missing (or set objective = ...)"]
        out = []
        if "{cases_file}" in task.objective_for("final").command and task.final is None:
            out.append("the final objective uses {cases_file}: add a [final] domain")
        for mode, obj in task.objectives.items():
            for knob in ("warmup", "repeats", "cases"):
                if f"{{{knob}}}" in obj.command and getattr(obj, knob) is None:
                    out.append(
                        f"[objectives.{mode}] uses {{{knob}}}: give it a default ({knob} = ...)"
                    )
        return out


# What a step task's scores mean (the refusals say it).
STEP_SCORE_MEANS = (
    "run_objective's score is dev feedback: the step timed over the dev traces in the "
    "candidate's own sandboxed process; guarded_final_verify (the loop's score) checks every "
    "step's logits and the KV cache on hidden traces from the trusted side, then times one more "
    "pass there: its score is the sum over the hidden traces of the p50 step latency as the "
    "trusted parent's clock sees a step through the sandbox; on a GPU that pass replays the "
    "steps recorded in the last checked pass (your kernels and torch operators, each step "
    "captured as one CUDA graph by the harness), so graphs you capture yourself help "
    "run_objective, not this score"
)


class StepKind(TaskKind):
    """A decode step `step(state, tokens) -> logits` over a resident KV cache (issue 32): the
    runner's step mode runs it over the dev traces of task.toml's `[step]` table (per-bucket
    latency, every step checked); the guarded verify is its own (tools/integrity/step_verify.py:
    outputs on hidden traces and a timed pass, the score the loop takes); numerical_probe runs
    its probes (the runner's probe mode, tools/gpu/step_probe.py: long contexts, extreme
    activations), sweep_kernel_config scores launch configs with the step objective (the
    runner's sweep mode over the traces) and profile_kernel breaks a step down per kernel (the
    runner's step_profile mode). The kernel verify and the kernel objective are not its:
    require_runner refuses them, saying what the step's own give."""

    name = "step"
    full_case_set = "all"  # run_objective over every dev trace

    def applies(self, tool: str) -> bool:
        return tool in GENERIC_TOOLS or tool in STEP_TOOLS

    def require_runner(self, task: TaskView, what: str) -> None:
        if what not in STEP_TOOLS:
            raise self._not_built(task, what)

    @staticmethod
    def _not_built(task: TaskView, what: str) -> UsageError:
        return UsageError(
            f"{what} is not built for step tasks ({task.name!r} is one; issue 32): a step "
            f"task has its own objective and guarded verify. {STEP_SCORE_MEANS[0].upper()}"
            f"{STEP_SCORE_MEANS[1:]}.",
            next_step="use run_objective (per-bucket latency table), numerical_probe (long "
            "contexts, extreme activations), sweep_kernel_config (launch knobs by the step "
            "objective), profile_kernel (which kernel dominates a step), guarded_final_verify "
            "(outputs and the timed score on hidden traces), rank_history and "
            "restore_best_checkpoint",
        )

    def require_steps(self, task: TaskView, what: str) -> StepSpec:
        if task.step is None:  # problems() refuses it where task.toml is parsed
            raise UsageError(
                f"{what}: step task {task.name!r} has no [step] table.",
                next_step="add one to its task.toml (tools/task/step.py)",
            )
        return task.step

    def dev_cases(self, task: TaskView) -> list[dict[str, Any]]:
        """A step task's `cases` name its dev traces (no sizes: a trace has its own)."""
        return [{"name": t.name} for t in task.step.traces] if task.step is not None else []

    case_noun = "trace"
    sweep_runs_objective = True  # a config is the step objective over the traces

    def select(self, task: TaskView, names: list[str] | None, arg: str = "cases") -> list[Case]:
        """The dev traces `names` names (all: None), in the task's order, each as a Case
        without sizes (a trace has its own)."""
        self.check_cases(task, names, arg)
        traces = task.step.traces if task.step is not None else []
        return [
            Case(name=t.name, dtype=t.dtype, shape={})
            for t in traces
            if not names or t.name in names
        ]

    def runner_cases(self, task: TaskView, names: list[str] | None) -> dict[str, Any]:
        """The runner's step mode reads the model's sizes and the traces `names` (all: None)
        from `step` (task/step.py StepSpec.request)."""
        self.check_cases(task, names, "cases")
        return {"step": task.step.request(names) if task.step is not None else {}}

    def in_lab(self, task: TaskView) -> bool:
        return True  # the lab's decode row: tools/gpu/kernel_lab/lab_step.py

    def reads_launch_config(self, task: TaskView) -> bool:
        return bool(task.config_file)  # the launch knobs sweep_kernel_config tunes

    def score_label(self, task: TaskView, mode: str = "final") -> str:
        if mode == "final":  # the step verify's timed pass (gpu/verify/step_timed.py)
            return (
                "us (sum over the hidden traces of the p50 step latency, the trusted parent's "
                "clock from request to reply), lower is better"
            )
        return "us (sum over the dev traces of the p50 step latency), lower is better"

    def check_folder(self, task: TaskView, workspace: Path) -> None:
        _reference_outside(task, workspace)

    def template(self, task: TaskView) -> Path | None:
        return task.workspace_template

    def problems(self, task: TaskView) -> list[str]:
        out = []
        if ":" not in task.entry:
            out.append("step tasks need entry = 'file.py:step'")
        if task.step is None:
            return [*out, "step tasks need a [step] table (model, interpreter, traces)"]
        out += [f"no tolerance for dtype {d}" for d in task.dtypes if d not in task.tolerances]
        if task.config_file and task.config_file not in task.editable:
            out.append(f"editable must list the launch config {task.config_file}")
        out += [
            f"step.traces {t.name!r}: dtype {t.dtype} is not one of the task's dtypes"
            for t in task.step.traces
            if t.dtype not in task.dtypes
        ]
        return out


KINDS: dict[str, TaskKind] = {k.name: k for k in (KernelKind(), CommandKind(), StepKind())}


def kind_of(task: TaskView) -> TaskKind:
    return KINDS[task.kind]


__all__ = [
    "GENERIC_TOOLS",
    "KINDS",
    "STEP_SCORE_MEANS",
    "STEP_TOOLS",
    "CommandKind",
    "KernelKind",
    "StepKind",
    "TaskKind",
    "TaskView",
    "kind_of",
]
