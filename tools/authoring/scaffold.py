"""A declared kernel task folder from a plan (`TaskPlan`): what `harnesslab task new`
(authoring/task_new.py) and `harnesslab task import-kernelbench` (authoring/kernelbench.py) write (nothing
of a failed one stays), the row each reports (`TaskRow`), the baseline check's record beside
task.toml (`check.json`, read by `harnesslab init`), and task new's inference (input
declarations from example tensors, the output's axes).

Host side, trusted: it imports the user's own reference file to infer what the declaration
cannot be told (input shapes from an example call, the output's shape), as the user asked it
to. The folder it writes is an ordinary task folder (task.toml with a `[declare]` table, task.md,
the reference source, workspace/) that `harnesslab init --task FOLDER` binds like any other.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..errors import UsageError
from ..task import DTYPES, TaskSpec, load_task
from ..task.declaration import INPUT_DTYPES
from ..task.spec import NAME_RE

# |out - ref| <= atol + rtol * |ref|, ref in fp32 from the same inputs: a few ulp of the output
# dtype (fp16 ~1e-3, bf16 ~8e-3 relative), and room for fp32 accumulation-order differences.
TOLERANCES = {
    "float16": {"atol": 1e-3, "rtol": 1e-2},
    "bfloat16": {"atol": 1e-2, "rtol": 2e-2},
    "float32": {"atol": 1e-4, "rtol": 1e-3},
}
DEFAULT_SPACE: dict[str, list[Any]] = {
    "num_warps": [1, 2, 4, 8],
    "block_size": [64, 128, 256, 512, 1024],
}
# Sizes at which a reference is called once to tell its output's axes apart.
DISTINCT_SIZES = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


class InputSpec(BaseModel):
    name: str
    shape: list[int | str]
    dtype: str = "case"
    distribution: str = "normal"
    low: float | str = 0.0
    high: float | str = 1.0
    mean: float = 0.0
    scale: float = 1.0


class TaskPlan(BaseModel):
    """Everything a declared task folder is written from."""

    name: str
    summary: str
    reference_file: Path
    reference_name: str
    reference_kind: str = "function"
    module_params: list[str] = Field(default_factory=list)
    module_mode: str = "train"
    inputs: list[InputSpec]
    inputs_from: dict[str, Any] | None = None
    scalars: dict[str, Any] = Field(default_factory=dict)
    scalar_dims: dict[str, Any] = Field(default_factory=dict)
    init_order: list[str] = Field(default_factory=list)
    output_shape: list[int | str] | str
    output_dtype: str = "case"
    dims: dict[str, int]
    dtypes: list[str]
    ranges: dict[str, tuple[int, int]] = Field(default_factory=dict)
    tolerances: dict[str, dict[str, float]] = Field(default_factory=dict)
    space: dict[str, list[Any]] = Field(default_factory=lambda: dict(DEFAULT_SPACE))
    entry_function: str
    kernel_file: Path | None = None
    interpreter: dict[str, int] = Field(default_factory=dict)
    brief: str = ""
    baseline: str = Field(default="", description="kernel.py's text when no kernel is given")
    bytes_formula: str = ""
    flops_formula: str = ""

    @property
    def reference_in_task(self) -> str:
        """The reference's file name in the task folder (reference.py is the generated one's)."""
        name = self.reference_file.name
        return "user_reference.py" if name == "reference.py" else name


class TaskRow(BaseModel):
    """One task `task new` or `task import-kernelbench` made from a file: written (and how its
    baseline fared against its reference), or refused and why."""

    file: str
    task: str
    status: Literal["written", "refused"]
    folder: str = ""
    reason: str = ""
    baseline: str = Field(default="", description="passed, failed or not run (task written)")
    failing: list[str] = Field(default_factory=list)
    seconds: float = 0.0


def load_user_module(path: Path, tag: str) -> ModuleType:
    """Import the user's file by path (their code, run because they asked for this task)."""
    if not path.is_file():
        raise UsageError(
            f"{path} does not exist.", next_step="give FILE.py:NAME of an existing file"
        )
    name = f"_hl_user_{tag}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}.", next_step="give a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        raise UsageError(
            f"importing {path} failed: {type(exc).__name__}: {exc}", next_step="fix the file"
        ) from exc
    return mod


def split_ref(text: str, flag: str) -> tuple[Path, str]:
    path, sep, name = text.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise UsageError(
            f"{flag} {text!r} is not FILE.py:NAME.", next_step=f"e.g. {flag} op.py:fused"
        )
    return Path(path), name


def infer_inputs(
    named: list[tuple[str, Any]], sizes: dict[str, int]
) -> tuple[list[InputSpec], dict[str, int]]:
    """Declarations from example tensors (`task new --example`): each axis is the first named
    size with its value, else a new dim d0, d1, ... per distinct size; size-1 axes stay
    literal. Floating tensors take the case dtype; integer ones keep theirs, drawn in the
    example's value range."""
    import torch

    dims: dict[str, int] = {}
    by_value: dict[int, str] = {}
    for k, v in sizes.items():
        by_value.setdefault(v, k)
    out = []
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise UsageError(
                f"input {name} of the example is {type(t).__name__}, not a tensor.",
                next_step="pass non-tensor arguments as keyword arguments (--scalar NAME=VALUE)",
            )
        shape: list[int | str] = []
        for size in t.shape:
            if size == 1:
                shape.append(1)
                continue
            if size not in by_value:
                by_value[size] = f"d{len([d for d in by_value.values() if d.startswith('d')])}"
            dims[by_value[size]] = size
            shape.append(by_value[size])
        if t.is_floating_point():
            out.append(InputSpec(name=name, shape=shape))
        else:
            dt = str(t.dtype).removeprefix("torch.")
            if dt not in INPUT_DTYPES:
                raise UsageError(f"input {name} has dtype {dt}.", next_step="use a supported dtype")
            lo = int(t.min()) if t.numel() else 0
            hi = int(t.max()) + 1 if t.numel() else 2
            out.append(
                InputSpec(name=name, shape=shape, dtype=dt, distribution="randint", low=lo, high=hi)
            )
    return out, dims


def output_shape(shape: tuple[int, ...], dims: dict[str, int]) -> list[int | str]:
    """The output's axes as dims (the first dim of that size), literal where none matches."""
    by_value: dict[int, str] = {}
    for k, v in dims.items():
        by_value.setdefault(v, k)
    return [by_value.get(s, s) if s != 1 else 1 for s in shape]


def draw_example(inputs: list[InputSpec], dims: dict[str, int]) -> list[Any]:
    """fp32 inputs for one call of the reference at `dims` (to learn the output's shape)."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for i in inputs:
        shape = [int(eval_dim(e, dims)) for e in i.shape]
        if i.distribution == "randint":
            out.append(torch.randint(int(i.low), int(i.high), shape, generator=g))
        else:
            out.append(torch.randn(shape, generator=g))
    return out


def eval_dim(expr: int | str, dims: dict[str, int]) -> int:
    if isinstance(expr, int):
        return expr
    if expr in dims:
        return dims[expr]
    raise UsageError(
        f"unknown dim {expr!r} (dims: {', '.join(dims) or 'none'}).",
        next_step="give its dev size with --dims NAME=SIZE",
    )


# -- writing ------------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} to TOML")


def render_toml(plan: TaskPlan, entry: str) -> str:
    lines = [
        "# Written by `harnesslab task new` / `harnesslab task import-kernelbench`: a declared",
        "# kernel task. Edit freely; `harnesslab init --task THIS_FOLDER` checks it.",
        f"name = {_toml_value(plan.name)}",
        f"summary = {_toml_value(plan.summary)}",
        'kind = "kernel"',
        f"entry = {_toml_value(entry)}",
        'config_file = "kernel_config.json"',
        f"editable = {_toml_value([entry.split(':')[0], 'kernel_config.json'])}",
        f"dtypes = {_toml_value(plan.dtypes)}",
        "",
    ]
    for d in plan.dtypes:
        tol = plan.tolerances.get(d) or TOLERANCES[d]
        lines += [f"[tolerances.{d}]", f"atol = {tol['atol']!r}", f"rtol = {tol['rtol']!r}", ""]
    lines.append("[space]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in plan.space.items()]
    lines.append("")
    for d in plan.dtypes:
        label = "x".join(str(v) for v in plan.dims.values()) or "scalar"
        lines += [
            "[[dev_cases]]",
            f'name = "{label}_{d}"',
            f'dtype = "{d}"',
            f"shape = {_toml_value(plan.dims)}",
            "",
        ]
    ranges = {
        k: {"min": lo, "max": hi}
        for k, (lo, hi) in (
            (k, plan.ranges.get(k, _default_range(v))) for k, v in plan.dims.items()
        )
    }
    lines += ["[final]", "count = 4", f"dtypes = {_toml_value(plan.dtypes)}"]
    lines += [f"ranges = {_toml_value(ranges)}", ""]
    lines += [
        "[declare]",
        f"reference = {_toml_value(plan.reference_in_task + ':' + plan.reference_name)}",
        f"reference_kind = {_toml_value(plan.reference_kind)}",
    ]
    if plan.module_params:
        lines.append(f"module_params = {_toml_value(plan.module_params)}")
    if plan.reference_kind == "module":
        lines.append(f"module_mode = {_toml_value(plan.module_mode)}")
    if plan.inputs_from:
        lines.append(f"inputs_from = {_toml_value(plan.inputs_from)}")
    if plan.scalars:
        lines.append(f"scalars = {_toml_value(plan.scalars)}")
    if plan.scalar_dims:
        lines.append(f"scalar_dims = {_toml_value(plan.scalar_dims)}")
    if plan.init_order:
        lines.append(f"init_order = {_toml_value(plan.init_order)}")
    if plan.interpreter:
        lines.append(f"interpreter = {_toml_value(plan.interpreter)}")
    if plan.bytes_formula:
        lines.append(f"bytes = {_toml_value(plan.bytes_formula)}")
    if plan.flops_formula:
        lines.append(f"flops = {_toml_value(plan.flops_formula)}")
    lines.append(
        f"output = {_toml_value({'shape': plan.output_shape, 'dtype': plan.output_dtype})}"
    )
    lines.append("")
    for i in plan.inputs:
        lines += ["[[declare.inputs]]", f"name = {_toml_value(i.name)}"]
        lines.append(f"shape = {_toml_value(i.shape)}")
        lines.append(f"dtype = {_toml_value(i.dtype)}")
        if i.distribution != "normal":
            lines.append(f"distribution = {_toml_value(i.distribution)}")
            lines.append(f"low = {_toml_value(i.low)}")
            lines.append(f"high = {_toml_value(i.high)}")
        elif (i.mean, i.scale) != (0.0, 1.0):
            lines.append(f"mean = {i.mean!r}")
            lines.append(f"scale = {i.scale!r}")
        lines.append("")
    return "\n".join(lines)


def _default_range(v: int) -> tuple[int, int]:
    """Hidden sizes from half to twice the dev size."""
    return max(1, v // 2), max(2, v * 2)


def render_brief(plan: TaskPlan, entry: str, params: str) -> str:
    ref_src = plan.reference_file.read_text()
    inputs = "\n".join(
        f"| `{i.name}` | {i.shape} | {'the case dtype' if i.dtype == 'case' else i.dtype} |"
        for i in plan.inputs
    )
    scalars = (
        ", ".join(
            [f"{k}={v!r}" for k, v in plan.scalars.items()]
            + [f"{k}={v} (the case's size)" for k, v in plan.scalar_dims.items()]
        )
        or "none"
    )
    what = "a plain function"
    if plan.reference_kind == "module":
        what = "a plain function, or a KernelBench `ModelNew` class (below)"
    shape = plan.output_shape
    if shape == "reference":
        shape = "the one the reference returns for the inputs (it depends on the sizes)"
    return f"""# {plan.name}

{plan.summary}

Write a faster `{entry}` ({what} whose work runs in Triton kernels: the guarded
verify rejects PyTorch math outside them) that returns what the
reference below returns:

    {entry.split(":")[1]}({params}) -> torch.Tensor

| input | shape | dtype |
|---|---|---|
{inputs}

Keyword arguments (passed to the reference and to your function alike): {scalars}.
The output has shape {shape} and dtype
{"the case dtype" if plan.output_dtype == "case" else plan.output_dtype}. Dev dims: {plan.dims};
dtypes {", ".join(plan.dtypes)}. Hidden final cases draw other sizes of the same dims (see
`inspect_context`), so do not specialise on the dev sizes. Launch parameters go in
`kernel_config.json` (knobs: {", ".join(plan.space) or "none"}).
{plan.brief}
Correctness: |out - ref| <= atol + rtol * |ref| per dtype, the reference computed in fp32 from
the same inputs; NaN/Inf always fails; do not modify the inputs.

## The reference (`{plan.reference_in_task}`)

```python
{ref_src.rstrip()}
```
"""


def write_task(plan: TaskPlan, out: Path, *, force: bool = False) -> TaskSpec:
    """Write the task folder and load it back (the declaration checked like any task.toml)."""
    if not NAME_RE.match(plan.name):
        raise UsageError(
            f"task name {plan.name!r} must match {NAME_RE.pattern}.",
            next_step="use lowercase letters, digits, _ and -",
        )
    bad = [d for d in plan.dtypes if d not in DTYPES]
    if bad:
        raise UsageError(
            f"dtype {bad[0]!r} is not one of {', '.join(DTYPES)}.", next_step="fix --dtypes"
        )
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} is not empty.", next_step="choose a new folder or pass --force")
    fresh = not out.exists()
    empty = out.is_dir() and not any(out.iterdir())
    try:
        _write_files(plan, out)
        return load_task(out)
    except BaseException:
        if fresh or empty:  # nothing of a failed task stays behind (an old folder is the user's)
            shutil.rmtree(out, ignore_errors=True)
            if empty:
                out.mkdir()
        raise


def _write_files(plan: TaskPlan, out: Path) -> None:
    (out / "workspace").mkdir(parents=True, exist_ok=True)
    (out / CHECK_FILE).unlink(missing_ok=True)  # a new task has not been checked yet
    ref_copy = out / plan.reference_in_task
    if ref_copy.resolve() != plan.reference_file.resolve():
        shutil.copyfile(plan.reference_file, ref_copy)
    if plan.kernel_file is not None:
        kernel_name = plan.kernel_file.name
        shutil.copyfile(plan.kernel_file, out / "workspace" / kernel_name)
    else:
        kernel_name = "kernel.py"
        (out / "workspace" / kernel_name).write_text(plan.baseline or baseline_source(plan))
    entry = f"{kernel_name}:{plan.entry_function}"
    config = {k: v[min(2, len(v) - 1)] for k, v in plan.space.items()}
    (out / "workspace" / "kernel_config.json").write_text(json.dumps(config, indent=1) + "\n")
    (out / "task.toml").write_text(render_toml(plan, entry))
    params = ", ".join(
        [i.name for i in plan.inputs]
        + [f"{k}={v!r}" for k, v in plan.scalars.items()]
        + [f"{k}={v}" for k, v in plan.scalar_dims.items()]  # a size: the case's dim
    )
    (out / "task.md").write_text(render_brief(plan, entry, params))


# -- the baseline check's record ---------------------------------------------------------------
# `task new` and `task import-kernelbench` run the new task's baseline against its reference and
# keep the outcome beside task.toml, so that `harnesslab init` does not bind a task whose own
# baseline failed without being told to.
CHECK_FILE = "check.json"


def record_check(folder: Path, baseline: str, failing: list[str]) -> None:
    data = {"baseline": baseline, "failing": failing}
    (folder / CHECK_FILE).write_text(json.dumps(data, indent=1) + "\n")


def failed_check(folder: Path) -> str | None:
    """Why the task folder's baseline failed its check when the task was made (None: it passed,
    or was never checked)."""
    try:
        data = json.loads((folder / CHECK_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("baseline") != "failed":
        return None
    return "; ".join(str(f) for f in data.get("failing", [])[:3]) or "it failed"


def baseline_source(plan: TaskPlan) -> str:
    """No kernel given: the reference itself in the inputs' dtype, as a correct starting point."""
    src = plan.reference_file.read_text().rstrip()
    names = ", ".join(i.name for i in plan.inputs)
    kw = ", ".join(f"{k}={v!r}" for k, v in plan.scalars.items())
    sig = names + (", *, " + kw if kw else "")
    pass_kw = ", ".join(f"{k}={k}" for k in plan.scalars)
    ref = f"_reference_{plan.reference_name}"  # the entry may have the reference's name
    return (
        f'"""Baseline: the reference itself, in PyTorch. Replace `{plan.entry_function}` with a '
        f'faster kernel."""\n\n{src}\n\n\n{ref} = {plan.reference_name}\n\n\n'
        f"def {plan.entry_function}({sig}):\n"
        f"    return {ref}({names}{', ' + pass_kw if pass_kw else ''})\n"
    )


def signature_names(fn: Callable[..., Any]) -> list[str]:
    try:
        return [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return []


__all__ = [
    "CHECK_FILE",
    "TOLERANCES",
    "InputSpec",
    "TaskPlan",
    "TaskRow",
    "draw_example",
    "failed_check",
    "infer_inputs",
    "load_user_module",
    "output_shape",
    "record_check",
    "render_toml",
    "signature_names",
    "split_ref",
    "write_task",
]
