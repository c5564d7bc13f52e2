"""Task templates: `tasks/<name>/task.toml` parsed into a typed `TaskSpec`.

A kernel task folder holds task.toml, task.md, workspace/ (copied into a new workspace),
reference.py (trusted reference + input generator, never copied) and solutions/. A kernel
language other than Triton is a `[languages.<name>]` table (its editable files and launch space)
with `workspace_<name>/` and `task_<name>.md` beside them: `spec.for_language("cuda")`.
A command task is any folder with a task.md and an objective command printing JSON. A step
task (tasks/decode_step) has a reference.py and a `[step]` table (task/step.py) in place of cases.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import stat
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import UsageError
from ..gpu.numerics import NAMES as NUMERICS_NAMES
from .case import MAX_DIM, Case
from .declaration import Declaration
from .kinds import KINDS
from .step import StepSpec

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
OBJECTIVE_PLACEHOLDERS = ("python", "warmup", "repeats", "cases", "cases_file", "task_dir")
MAX_TOML_BYTES = 1 << 20


class Tolerance(BaseModel):
    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class SizeRange(BaseModel):
    min: int = Field(ge=1, le=MAX_DIM)
    max: int = Field(ge=1, le=MAX_DIM)
    multiple_of: int = Field(default=1, ge=1)


class FinalDomain(BaseModel):
    """Where hidden final cases are drawn from. Sizes are either a range or a list of choices;
    `require` lists partial shapes at least one drawn case must have (e.g. dim=8192)."""

    count: int = Field(ge=1, le=64)
    dtypes: list[str]
    ranges: dict[str, SizeRange] = Field(default_factory=dict)
    choices: dict[str, list[Annotated[int, Field(ge=1, le=MAX_DIM)]]] = Field(default_factory=dict)
    require: list[dict[str, Annotated[int, Field(ge=1, le=MAX_DIM)]]] = Field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        """The domain without any drawn values: safe to show the agent."""
        return {
            "count": self.count,
            "dtypes": self.dtypes,
            "ranges": {k: v.model_dump() for k, v in self.ranges.items()},
            "choices": self.choices,
            "always_includes": self.require,
        }

    def draw(self, seed: bytes | str | int, *, prefix: str = "final") -> list[Case]:
        """Deterministic draw from a secret seed: same seed, same cases."""
        digest = hashlib.sha256(str(seed).encode() if not isinstance(seed, bytes) else seed)
        rng = random.Random(digest.hexdigest())
        cases: list[Case] = []
        for i in range(self.count):
            shape: dict[str, int] = {}
            for key, r in self.ranges.items():
                lo, hi = -(-r.min // r.multiple_of), r.max // r.multiple_of
                shape[key] = rng.randint(lo, hi) * r.multiple_of
            for key, opts in self.choices.items():
                shape[key] = rng.choice(opts)
            if i < len(self.require):
                shape.update(self.require[i])
            dtype = (
                self.dtypes[i % len(self.dtypes)]
                if i < len(self.dtypes)
                else rng.choice(self.dtypes)
            )
            dims = "x".join(str(shape[k]) for k in shape)
            cases.append(Case(name=f"{prefix}{i}_{dims}_{_short(dtype)}", dtype=dtype, shape=shape))
        return cases


def _short(dtype: str) -> str:
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)


class Numerics(BaseModel):
    """task.toml `[numerics]`: what of the generic adversarial inputs (tools/gpu/numerics.py,
    run by the guarded verify and numerical_probe) does not apply to this task, e.g. `skip =
    ["empty_batch"]` for an op that needs at least one row. Integer and bool inputs are never
    transformed; a family the reference cannot take (its output not finite) is skipped per
    input on its own."""

    model_config = ConfigDict(extra="forbid")

    skip: list[str] = Field(
        default_factory=list, description="size edges or value families that do not apply"
    )

    @field_validator("skip")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in NUMERICS_NAMES:
                raise ValueError(
                    f"numerics.skip: {name!r} is not one of {', '.join(NUMERICS_NAMES)}"
                )
        return v


class Objective(BaseModel):
    """One objective of a command task: a command printing JSON with a score key.

    `dev` is what run_objective runs for the agent, in its workspace; `final` is what the loop
    and guarded_final_verify run, in a fresh copy of the task's files as bound (never the
    agent's) with the candidate's editable files, sandboxed, fed the hidden cases. Fields left
    out take the task's top-level score_key, unit and higher_is_better."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        min_length=1,
        description="shell command; placeholders {python} (the toolkit's interpreter), "
        "{warmup} {repeats} {cases} (dev: run_objective's arguments), {cases_file} (final: the "
        "hidden cases as JSON, also in $HARNESSLAB_FINAL_CASES), {task_dir}",
    )
    timeout_s: float | None = Field(default=None, gt=0, le=86400)
    score_key: str | None = None
    unit: str | None = None
    higher_is_better: bool | None = None
    warmup: int | None = Field(default=None, ge=0, le=100, description="default for {warmup}")
    repeats: int | None = Field(default=None, ge=1, le=200, description="default for {repeats}")
    cases: str | None = Field(default=None, description="default for {cases}")

    @field_validator("command")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        for name in PLACEHOLDER_RE.findall(v):
            if name not in OBJECTIVE_PLACEHOLDERS:
                raise ValueError(
                    f"unknown placeholder {{{name}}} in {v!r}; known: "
                    + ", ".join("{" + p + "}" for p in OBJECTIVE_PLACEHOLDERS)
                )
        return v


class Language(BaseModel):
    """A kernel language's version of a task (`[languages.cuda]`): what differs from Triton's.
    The reference, cases, tolerances and final domain are the task's: one ledger, one score."""

    model_config = ConfigDict(extra="forbid")

    editable: list[str] = Field(min_length=1)
    space: dict[str, list[Any]] = Field(default_factory=dict)
    config_rules: list[str] = Field(default_factory=list)


class TaskSpec(BaseModel):
    """Parsed task.toml. `root` is the task folder (inside the installed package)."""

    name: str
    summary: str
    kind: Literal["kernel", "command", "step"]
    editable: list[str]
    root: Path
    # kernel tasks
    entry: str = Field(default="", description="'file.py:function' in the workspace")
    config_file: str = ""
    dtypes: list[str] = Field(default_factory=list)
    tolerances: dict[str, Tolerance] = Field(default_factory=dict)
    space: dict[str, list[Any]] = Field(default_factory=dict)
    config_rules: list[str] = Field(
        default_factory=list, description="Constraints between knobs, shown to the agent."
    )
    dev_cases: list[Case] = Field(default_factory=list)
    final: FinalDomain | None = None
    declare: Declaration | None = Field(
        default=None,
        description="a declared task: inputs, reference function and output in task.toml, "
        "no reference.py (tools/gpu/declared.py is staged in its place)",
    )
    numerics: Numerics = Field(
        default_factory=Numerics, description="[numerics]: generic adversarial inputs skipped"
    )
    language: str = Field(
        default="triton", description="the kernel language of this view of the task"
    )
    languages: dict[str, Language] = Field(
        default_factory=dict,
        description="other kernel languages: name -> editable files and launch space "
        "(workspace_<name>/ and task_<name>.md in the task folder)",
    )
    # step tasks
    step: StepSpec | None = Field(
        default=None, description="[step]: the decoder's sizes and the dev traces (task/step.py)"
    )
    # command tasks
    objective: str = Field(default="", description="one command for dev and final (older form)")
    objectives: dict[Literal["dev", "final"], Objective] = Field(default_factory=dict)
    score_key: str = "score"
    unit: str = Field(default="", description="unit of the score, for labels (e.g. us)")
    higher_is_better: bool = False
    private: list[str] = Field(
        default_factory=list,
        description="command tasks: files of the task folder never copied into a workspace "
        "(the final objective still gets them)",
    )

    @model_validator(mode="after")
    def _check(self) -> TaskSpec:
        if not NAME_RE.match(self.name):
            raise ValueError(f"task name {self.name!r} must match {NAME_RE.pattern}")
        problems = KINDS[self.kind].problems(self)
        if problems:
            raise ValueError(problems[0])
        return self

    def objective_for(self, mode: Literal["dev", "final"]) -> Objective:
        """A command task's objective for `mode`, with the task's defaults filled in."""
        obj = self.objectives.get(mode) or Objective(command=self.objective or "true")
        return obj.model_copy(
            update={
                "score_key": obj.score_key or self.score_key,
                "unit": obj.unit if obj.unit is not None else self.unit,
                "higher_is_better": (
                    self.higher_is_better if obj.higher_is_better is None else obj.higher_is_better
                ),
            }
        )

    @property
    def entry_file(self) -> str:
        return self.entry.split(":", 1)[0]

    @property
    def entry_function(self) -> str:
        return self.entry.split(":", 1)[1]

    @property
    def reference_path(self) -> Path:
        return self.root / "reference.py"

    def dims(self) -> set[str]:
        """The named sizes of the dev cases and the final domain."""
        out = {k for c in self.dev_cases for k in c.shape}
        if self.final is not None:
            out |= set(self.final.ranges) | set(self.final.choices)
        return out

    def numerics_request(self) -> dict[str, Any]:
        """What the runner's generic suite needs from the host: the families skipped and each
        dim's largest hidden value (the long-reduction edge)."""
        max_dims: dict[str, int] = {}
        if self.final is not None:
            max_dims.update({k: r.max for k, r in self.final.ranges.items()})
            max_dims.update({k: max(v) for k, v in self.final.choices.items() if v})
        return {"skip": list(self.numerics.skip), "max_dims": max_dims}

    def for_language(self, language: str) -> TaskSpec:
        """This task in `language` ("triton", or a `[languages.<name>]` table): its editable
        files, launch space, template and brief."""
        if language == self.language:
            return self
        lang = self.languages.get(language)
        if self.language != "triton" or lang is None:
            known = ", ".join(["triton", *self.languages])
            raise UsageError(
                f"task {self.name} has no {language!r} version.",
                next_step=f"use one of: {known}",
            )
        return self.model_copy(
            update={"language": language, "editable": list(lang.editable),
                    "space": dict(lang.space), "config_rules": list(lang.config_rules)}
        )  # fmt: skip

    @property
    def workspace_template(self) -> Path:
        return self.root / (
            "workspace" if self.language == "triton" else f"workspace_{self.language}"
        )

    def brief_path(self) -> Path:
        return self.root / ("task.md" if self.language == "triton" else f"task_{self.language}.md")

    def solutions(self, language: str | None = None) -> dict[str, Path]:
        """Reference solutions in `language` (default: this view's). A CUDA solution is
        solutions/cuda_<x>.py with its .cu beside it."""
        sol = self.root / "solutions"
        if not sol.is_dir():
            return {}
        cuda = (language or self.language) == "cuda"
        return {
            p.stem: p
            for p in sorted(sol.glob("*.py"))
            if not p.name.startswith("_") and p.name.startswith("cuda_") == cuda
        }

    def dev_case(self, name: str) -> Case:
        for c in self.dev_cases:
            if c.name == name:
                return c
        raise UsageError(
            f"unknown case {name!r}.",
            next_step=f"use one of: {', '.join(c.name for c in self.dev_cases)}",
        )

    def validate_config(self, config: dict[str, Any], *, source: str = "") -> None:
        """Every knob in the declared space must hold an allowed value."""
        where = f"{source}: " if source else ""
        for key, value in config.items():
            if key.startswith("_"):
                continue
            if key not in self.space:
                continue  # the candidate's own knobs are its business; declared ones are checked
            allowed = self.space[key]
            # Strict: True == 1 and 1.0 == 1 in Python, so `in` alone would let num_warps=true
            # or 4.0 through; a value must be one of the allowed values with the same type.
            if not any(type(value) is type(a) and value == a for a in allowed):
                raise UsageError(
                    f"{where}{key}={value!r} is not one of {','.join(map(str, allowed))}.",
                    next_step=f"set {key} to one of the allowed values",
                )


def tasks_root() -> Path:
    return Path(str(resources.files("harnesslab.tasks")))


def list_tasks() -> list[str]:
    root = tasks_root()
    return sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file())


def load_task(name_or_dir: str | Path) -> TaskSpec:
    """Load a shipped task by name, or a task folder by path."""
    candidate = Path(name_or_dir)
    if candidate.is_dir():
        root = candidate.resolve()
    else:
        name = str(name_or_dir)
        if not NAME_RE.match(name) or not (tasks_root() / name / "task.toml").is_file():
            raise UsageError(
                f"unknown task {name!r}.",
                next_step=f"use one of: {', '.join(list_tasks())}, or a task folder path",
            )
        root = tasks_root() / name
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise UsageError(
            f"{root} has no task.toml.",
            next_step="a task folder needs task.toml and task.md (see tasks/rmsnorm_gate)",
        )
    task = parse_task(read_toml(toml_path), root)
    if task.declare is not None:
        problems = task.declare.folder_problems(root)
        if problems:
            raise UsageError(f"{toml_path}: {problems[0]}", next_step="fix the task folder")
    return task


def read_toml(path: Path) -> str:
    """task.toml's text: a regular file of at most MAX_TOML_BYTES, in UTF-8 (a UsageError
    naming the file otherwise; nothing larger is read)."""
    try:
        with path.open("rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise UsageError(f"{path} is not a regular file.", next_step="make it a file")
            data = fh.read(MAX_TOML_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror}.", next_step="fix it") from exc
    if len(data) > MAX_TOML_BYTES:
        raise UsageError(
            f"{path} is over {MAX_TOML_BYTES} bytes: not a task description.",
            next_step="keep task.toml to its settings (cases, tolerances, the launch space)",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path}: not UTF-8 text (byte {exc.start}).", next_step="save it as UTF-8"
        ) from exc


def parse_task(text: str, root: Path) -> TaskSpec:
    """A TaskSpec from task.toml text whose folder is `root` (the trusted store keeps the text
    of a folder task as it was bound, and parses that, not the folder's file of today).
    Whatever the text holds (huge integers, deep nesting, wrong types), the answer is a
    TaskSpec or a one-line UsageError naming the file."""
    where = root / "task.toml"
    if len(text) > MAX_TOML_BYTES:
        raise UsageError(f"{where} is over {MAX_TOML_BYTES} bytes.", next_step="fix task.toml")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{where}: not valid TOML ({exc}).", next_step="fix the file") from exc
    except RecursionError as exc:  # arrays or tables nested thousands deep
        raise UsageError(f"{where}: nested too deeply.", next_step="fix task.toml") from exc
    except ValueError as exc:  # an integer past Python's digit limit (4300)
        raise UsageError(
            f"{where}: an integer too long to be a size or a setting ({first_line(exc, 80)}).",
            next_step="fix task.toml",
        ) from exc
    try:
        dev = data.pop("dev_cases", [])
        data["dev_cases"] = [_case_from_toml(c) for c in dev]
        return TaskSpec(root=root, **data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise UsageError(f"{where}: {first_line(exc)}", next_step="fix task.toml") from exc


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception's message, one line of it (a pydantic error spans several)."""
    lines = str(exc).strip().splitlines()
    text = "; ".join(line.strip() for line in lines[:3]) if lines else type(exc).__name__
    return text[:limit]


def is_shipped(task: TaskSpec) -> bool:
    """Whether `task` is one of the toolkit's own tasks (its folder in the installed package)."""
    return task.root.resolve() == (tasks_root() / task.name).resolve()


def _case_from_toml(raw: dict[str, Any]) -> dict[str, Any]:
    raw = dict(raw)
    name, dtype = raw.pop("name", None), raw.pop("dtype")
    shape = {k: int(v) for k, v in raw.pop("shape", raw).items()}
    if name is None:
        name = "x".join(str(v) for v in shape.values()) + "_" + _short(dtype)
    return {"name": name, "dtype": dtype, "shape": shape}


__all__ = [
    "Case",
    "FinalDomain",
    "Language",
    "Numerics",
    "Objective",
    "TaskSpec",
    "Tolerance",
    "is_shipped",
    "list_tasks",
    "load_task",
    "parse_task",
    "read_toml",
    "tasks_root",
]
