"""`harnesslab task import-kernelbench FILE.py|FOLDER`: KernelBench-format problems as declared
kernel tasks, one row per file (written, or refused and why) so that a folder import keeps going.

A KernelBench file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`,
with its sizes as module-level constants. The task's reference is `Model(*init)` built under a
fixed seed (tools/gpu/declared.py, kind "module", in train mode as KernelBench runs it); its
inputs are the file's own `get_inputs()` run with the case's sizes as those constants
(`inputs_from`), then the Model's parameters drawn fresh with the init's mean and spread. Sizes
and shapes are learned on meta tensors (kernelbench_sizes.py), never at the file's full size;
the dev case is the file's size, the hidden cases vary each size constant from half to its
value, and the CPU interpreter runs them at small sizes chosen here and checked by one real call
(which also refuses a random forward: two calls on the same inputs must agree).

The candidate is `model_new(*inputs, *weights, **init)`, a plain function, or a KernelBench
`class ModelNew(nn.Module)` that the harness builds with the constructor's arguments and gives
the weights (tools/gpu/modelnew.py), so a KernelBench solution drops in unchanged.

Host side, trusted: it imports and runs the user's file, as the user asked.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import re
import time
import warnings
from pathlib import Path
from typing import Any, Literal

from ..errors import UsageError
from ..gpu.declared import evaluate
from ..gpu.modelnew import ENTRY_CLASS
from .kernelbench_sizes import (
    Analysis,
    Refused,
    Seen,
    analyse,
    fit,
    forward,
    see,
    user_error,
)
from .scaffold import InputSpec, TaskPlan, TaskRow, load_user_module, signature_names, write_task

ENTRY = "model_new"
# KernelBench's own check: atol = rtol = 1e-2 (fp32 problems; a GPU matmul may use TF32).
KB_TOLERANCES = {
    "float32": {"atol": 1e-2, "rtol": 1e-2},
    "float16": {"atol": 1e-2, "rtol": 2e-2},
    "bfloat16": {"atol": 2e-2, "rtol": 4e-2},
}
# Elements per input on the CPU interpreter (a Triton kernel there runs ~1000x slower); raised
# when an op refuses the sizes it gives, up to BUDGET_MAX.
BUDGET, BUDGET_MAX = 1 << 12, 1 << 22
# Elements per tensor of a hidden case on the GPU: the guarded verify holds every case's inputs,
# their pristine copies and expected outputs at once (a 4096 x 393216 ReLU would need ~300 GB),
# so the hidden sizes stop where the largest tensor reaches 2^26 elements (256 MB in fp32).
GPU_CASE_ELEMENTS = 1 << 26
Mode = Literal["train", "eval"]


def task_name(path: Path) -> str:
    """'1_Square_matrix_multiplication_.py' -> 'kb_1_square_matrix_multiplication'."""
    stem = re.sub(r"[^a-z0-9_-]+", "_", path.stem.lower()).strip("_-")
    return ("kb_" + stem)[:64].rstrip("_-")


class _SelfToParams(ast.NodeTransformer):
    """`self.attr` -> the constructor parameter `__init__` stored in it."""

    def __init__(self, attrs: dict[str, str]) -> None:
        self.attrs = attrs

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.attrs:
            return ast.copy_location(ast.Name(id=self.attrs[node.attr], ctx=ast.Load()), node)
        return self.generic_visit(node)


def forward_as_function(source: str, scalars: dict[str, object]) -> str | None:
    """Model.forward as a plain function `model_new(*inputs, **init)`: the baseline the guarded
    verify accepts (its scan rejects torch.nn in a candidate). None when forward uses anything
    but its inputs and constructor arguments stored as `self.x = x` (then the Model is copied)."""
    tree = ast.parse(source)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return None
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    init, forward = methods.get("__init__"), methods.get("forward")
    if forward is None:
        return None
    attrs: dict[str, str] = {}
    for node in ast.walk(init) if init else ():
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.targets[0].value, ast.Name)
            and node.targets[0].value.id == "self"
            and isinstance(node.value, ast.Name)
            and node.value.id in scalars
        ):
            attrs[node.targets[0].attr] = node.value.id
    body = [_SelfToParams(attrs).visit(stmt) for stmt in forward.body]
    names = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    if "self" in names or "nn" in names or "F" in names:
        return None
    imported = {
        a.asname or a.name.split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for a in node.names
    }
    bound = {n.id for stmt in body for n in ast.walk(stmt)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}  # fmt: skip
    args = {a.arg for a in forward.args.args}
    known = imported | bound | args | set(scalars) | set(dir(builtins))
    if names - known:  # a module-level helper or constant the function would not carry along
        return None
    params = [a.arg for a in forward.args.args if a.arg != "self"]
    kw = ", ".join(f"{k}={v!r}" for k, v in scalars.items())
    header = f"def {ENTRY}({', '.join(params)}{', *, ' + kw if kw else ''}):\n    pass\n"
    fn = ast.parse(header).body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.body = body
    imports = []  # the file's imports the body uses (`import torch.nn as nn` goes)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            used = [a for a in node.names if (a.asname or a.name.split(".")[0]) in names]
            if used:
                node.names = used
                imports.append(node)
    module = ast.Module(body=[*imports, fn], type_ignores=[])
    doc = (
        '"""Baseline: the KernelBench Model\'s forward as a plain PyTorch function. Replace it '
        'with a faster kernel (same signature)."""\n\n'
    )
    return doc + ast.unparse(ast.fix_missing_locations(module)) + "\n"


def _weight_spec(arg: str, shape: list, t: Any) -> InputSpec:
    """A weight as an input: drawn by the Model's own initialiser per call ("init"); mean and
    spread (at the small sizes) approximate it for the probes that draw per declaration."""
    if t.is_floating_point():
        std = float(t.std()) if t.numel() > 1 else 0.0
        return InputSpec(name=arg, shape=shape, distribution="init", mean=float(t.mean()),
                         scale=max(std, 1e-6))  # fmt: skip
    return InputSpec(name=arg, shape=shape, dtype=str(t.dtype)[6:], distribution="randint",
                     low=int(t.min()), high=int(t.max()) + 1)  # fmt: skip


def _arg_names(weights: list[str], taken: set[str]) -> list[str]:
    """The candidate's argument name for each weight: `conv.weight` -> `conv_weight`."""
    out = []
    for name in weights:
        arg = re.sub(r"\W", "_", name)
        arg = arg if arg[0].isalpha() else "p_" + arg
        while arg in taken:
            arg += "_param"
        taken.add(arg)
        out.append(arg)
    return out


def _input_spec(a: Analysis, i: int, small: Seen) -> InputSpec:
    """How input i is distributed (for the probes and edges that draw it per declaration;
    the task's own inputs come from get_inputs())."""
    import torch

    name, shape, t = a.names[i], a.shapes[i], small.inputs[i]
    if t.dtype == torch.bool:
        return InputSpec(name=name, shape=shape, dtype="bool", distribution="randint", high=2)
    if not t.is_floating_point():
        dt = str(t.dtype).removeprefix("torch.")
        if dt not in ("int32", "int64"):
            raise Refused(f"input {name} has dtype {dt} (supported: floats, int32, int64, bool)")
        low, high = _index_bounds(a, i) or (int(t.min()), int(t.max()) + 1)
        return InputSpec(
            name=name, shape=shape, dtype=dt, distribution="randint", low=low, high=high
        )
    made = a.runs[0].made.get(id(a.runs[0].inputs[i]))
    if made and made[0] == "randn":
        return InputSpec(name=name, shape=shape)
    if made and made[0] == "rand":
        return InputSpec(name=name, shape=shape, distribution="uniform", low=0.0, high=1.0)
    lo, hi = float(t.min()), float(t.max())
    if lo >= 0:
        return InputSpec(
            name=name, shape=shape, distribution="uniform", low=lo, high=max(hi, lo + 1e-6)
        )
    return InputSpec(name=name, shape=shape, mean=float(t.mean()), scale=max(float(t.std()), 1e-6))


def _index_bounds(a: Analysis, i: int) -> tuple[Any, Any] | None:
    """torch.randint's (low, high) for input i, as literals or dims, when get_inputs() returns
    the randint tensor itself (targets < num_classes)."""
    records = [r.made.get(id(r.inputs[i])) for r in a.runs]
    if any(rec is None or rec[0] != "randint" for rec in records):
        return None
    lows = [rec[1][0] if len(rec[1]) >= 2 else 0 for rec in records if rec]
    highs = [rec[1][1] if len(rec[1]) >= 2 else rec[1][0] for rec in records if rec]
    low, high = fit(lows, a.runs_dims), fit(highs, a.runs_dims)
    return (low, high) if low is not None and high is not None else None


def plan_kernelbench(path: Path, *, dtypes: list[str], mode: Mode = "train") -> TaskPlan:
    """The task a KernelBench file makes, or Refused with the reason it cannot make one."""
    source = path.read_text()
    mod = load_user_module(path, "kb")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
    if missing:
        raise Refused(f"not in KernelBench format: it defines no {', '.join(missing)}")
    names = [p for p in signature_names(mod.Model.forward) if p != "self"]
    try:
        a = analyse(path, source, mod.Model, names, mode == "train")
    except UsageError:
        raise
    except Exception as exc:  # the user's file, whatever it raises at its own sizes
        raise Refused(f"its inputs or Model fail on meta tensors ({user_error(exc)})") from exc
    if not a.sizes.dims:
        raise Refused("it has no size the hidden cases could vary (no module-level size constant)")
    small, real = _small(path, mod, a, mode)
    tolerances = {d: KB_TOLERANCES[d] for d in dtypes if d in KB_TOLERANCES}
    normal = _null_passes(real.out, real.inputs, tolerances) and _normal_inputs(real, tolerances)
    init_all = {**real.init}  # in the constructor's order
    args = _arg_names(list(a.weights), set(a.names) | set(init_all))
    decls = [_input_spec(a, i, real) for i in range(len(a.names))]
    inputs_from: dict[str, Any] | None = {
        "call": f"{_in_task(path)}:get_inputs",
        "constants": a.sizes.constants,
    }
    if normal:  # get_inputs() cannot tell the op from a copy of its input: N(0, 1) instead
        decls = [InputSpec(name=d.name, shape=d.shape) for d in decls]
        inputs_from = None
    decls += [_weight_spec(arg, a.weights[w], real.weights[w].detach())
              for w, arg in zip(a.weights, args, strict=True)]  # fmt: skip
    out_dtype = a.runs[0].out.dtype
    scalars = {k: v for k, v in a.init.items()}
    baseline = (
        "" if a.weights else (forward_as_function(source, {**scalars, **_file_values(a)}) or "")
    )
    dims = a.sizes.dims
    return TaskPlan(
        name=task_name(path),
        summary=f"KernelBench problem {path.stem}: "
        + ((inspect.getdoc(mod.Model) or "").splitlines() or ["Model.forward"])[0],
        reference_file=path,
        reference_name="Model",
        reference_kind="module",
        module_params=list(a.weights),
        module_mode=mode,
        inputs=decls,
        inputs_from=inputs_from,
        scalars=scalars,
        scalar_dims=a.init_dims,
        init_order=list(init_all),
        output_shape=a.out_shape,
        output_dtype="case" if out_dtype.is_floating_point else str(out_dtype)[6:],
        dims=dims,
        dtypes=dtypes,
        ranges=_ranges(path, mod, a, mode),
        interpreter=small,
        tolerances=tolerances,
        entry_function=ENTRY,
        baseline=baseline or class_baseline(path),
        brief=_brief(a.names, args, {**scalars, **_file_values(a)}, mode, bool(baseline))
        + (NORMAL_NOTE if normal else ""),
    )


NORMAL_NOTE = (
    "\nThe inputs are drawn from N(0, 1), not from the file's `get_inputs()`: on its inputs the "
    "reference cannot be told from a copy of its input (ReLU on [0, 1) is the identity), so a "
    "candidate returning its input would pass.\n"
)


def _null_passes(out: Any, inputs: list[Any], tolerances: dict[str, dict[str, float]]) -> bool:
    """Whether an output of zeros, or a copy of the first input, is within the loosest tolerance
    of `out` (the guarded verify's null control: such a case proves nothing)."""
    import torch

    if not out.is_floating_point() or not tolerances:
        return False
    atol = max(t["atol"] for t in tolerances.values())
    rtol = max(t["rtol"] for t in tolerances.values())
    ref = out.float()
    nulls = [torch.zeros_like(ref)]
    first = inputs[0] if inputs else None
    if isinstance(first, torch.Tensor) and first.shape == ref.shape:
        nulls.append(first.float())
    return any(bool(((n - ref).abs() <= atol + rtol * ref.abs()).all()) for n in nulls)


def _normal_inputs(real: Seen, tolerances: dict[str, dict[str, float]]) -> bool:
    """True when N(0, 1) inputs make the null control fail (ReLU on get_inputs()'s [0, 1) is
    the identity); refused when no input can (an output that is zeros whatever the input)."""
    import torch

    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in real.inputs):
        raise Refused("the checker cannot tell its output from zeros or a copy of its input "
                      "on get_inputs(): nothing a candidate computes could be verified")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(t.shape, generator=g) for t in real.inputs]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = forward(real.model, args)
    except Exception as exc:  # the user's op refused N(0, 1) inputs
        raise Refused(f"the checker cannot tell its output from zeros or a copy of its input on "
                      f"get_inputs(), and it fails on N(0, 1) inputs ({user_error(exc)})") from exc  # fmt: skip
    if bool(torch.isfinite(out).all()) and not _null_passes(out, args, tolerances):
        return True
    raise Refused("the checker cannot tell its output from zeros or a copy of its input, on "
                  "get_inputs() or N(0, 1) inputs (|output| below the tolerance)")  # fmt: skip


def _file_values(a: Analysis) -> dict[str, Any]:
    """The size arguments of the constructor at the file's values (the dev case's)."""
    return {k: a.runs[0].init[k] for k in a.init_dims}


def _in_task(path: Path) -> str:
    return "user_reference.py" if path.name == "reference.py" else path.name


def _small(path: Path, mod: Any, a: Analysis, mode: Mode) -> tuple[dict[str, int], Seen]:
    """The CPU interpreter's dims: every input and weight within the budget where the dims
    allow, checked by one real call at them (twice: a forward whose two calls on the same
    inputs differ is random, and refused)."""
    import torch

    budget, error = BUDGET, ""
    shapes = [*a.shapes, *a.weights.values()]
    while budget <= BUDGET_MAX:
        dims = small_dims(a.sizes.dims, shapes, budget)
        try:
            got = see(path, mod.Model, a.sizes, dims, mode == "train", meta=False)
            with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(2)
                again = forward(got.model, got.inputs)
        except Refused:
            raise
        except Exception as exc:  # the user's op refused these sizes: larger ones
            error = user_error(exc)
            budget *= 4
            continue
        first = got.out
        if first.is_floating_point() and not bool(torch.isfinite(first).all()):
            raise Refused("its reference gives NaN or Inf on get_inputs() (at small sizes)")
        if first.shape != again.shape or not torch.equal(first, again):
            fix = " (--module-mode eval turns dropout off)" if mode == "train" else ""
            raise Refused("random: two calls of Model.forward on the same inputs differ "
                          f"(dropout or another random op){fix}")  # fmt: skip
        if a.out_shape != "reference":
            want = [int(evaluate(e, dims)) for e in a.out_shape]
            if list(first.shape) != want:
                raise Refused(f"its output is {list(first.shape)} at small sizes, {want} expected")
        return dims, got
    raise Refused(f"its reference fails at every small size tried ({error})")


def small_dims(
    dims: dict[str, int], shapes: list[list[Any]], budget: int, only: set[str] | None = None
) -> dict[str, int]:
    """Dims at which every input and weight has at most `budget` elements where the dims (or
    those in `only`) allow: the largest halved until then (the proportions kept roughly)."""
    out = dict(dims)

    def numel(shape: list[Any]) -> int:
        n = 1
        for e in shape:
            n *= max(1, int(evaluate(e, out)))
        return n

    while any(numel(s) > budget for s in shapes):
        movable = [k for k in out if out[k] > 2 and (only is None or k in only)]
        big = max(movable, key=lambda k: out[k], default=None)
        if big is None:
            break
        out[big] = (out[big] + 1) // 2
    return out


def _ranges(path: Path, mod: Any, a: Analysis, mode: Mode) -> dict[str, tuple[int, int]]:
    """Hidden sizes from half the top size up to it, narrowed to three quarters, or fixed, where
    the Model refuses half. The top is the file's size (never above: the file's sizes are chosen
    to fit a GPU), or smaller where a tensor would exceed GPU_CASE_ELEMENTS. The constructor's
    sizes stay the file's on the GPU (KernelBench's Model as written)."""
    train = mode == "train"
    varying = {k for k in a.sizes.dims if k not in a.sizes.init_dims}
    shapes = [*a.shapes, *a.weights.values()]
    shapes += [a.out_shape] if isinstance(a.out_shape, list) else []
    budget, top = GPU_CASE_ELEMENTS, dict(a.sizes.dims)
    while budget >= 1:
        top = small_dims(a.sizes.dims, shapes, budget, only=varying)
        try:
            out = see(path, mod.Model, a.sizes, top, train, meta=True).out
        except Exception:  # the user's op refused these sizes: the file's own
            top = dict(a.sizes.dims)
            break
        if out.numel() <= GPU_CASE_ELEMENTS or top == small_dims(top, shapes, 1, only=varying):
            break
        budget //= 2  # an output larger than its inputs (a transposed conv): smaller inputs
    for frac in (0.5, 0.75):
        low = {k: max(2, math.ceil(v * frac)) if k in varying else v for k, v in top.items()}
        try:
            see(path, mod.Model, a.sizes, low, train, meta=True)
        except Exception:  # the user's op refused these sizes: a narrower range
            continue
        return {k: (min(low[k], v), v) for k, v in top.items()}
    return {k: (v, v) for k, v in top.items()}


def class_baseline(path: Path) -> str:
    """kernel.py for a Model the forward-to-function rewrite cannot take (weights, submodules):
    the Model itself as the KernelBench `ModelNew` class the harness builds and binds."""
    return (
        f'"""Baseline: the KernelBench Model itself as `{ENTRY_CLASS}`. The harness builds it '
        "with the constructor's\narguments and gives it the task's weights on every call (keep "
        'the parameters\' names). Replace its\nforward with Triton kernels."""\n\n'
        f"{path.read_text().rstrip()}\n\n\nclass {ENTRY_CLASS}(Model):\n    pass\n"
    )


def _brief(names: list[str], weights: list[str], init: dict[str, Any], mode: Mode,
           function_baseline: bool) -> str:  # fmt: skip
    kw = ", ".join(f"{k}={v!r}" for k, v in init.items()) or "none"
    train = (
        "The Model runs in train mode, as KernelBench runs it (BatchNorm normalises by the "
        "batch's statistics)."
        if mode == "train"
        else "The Model runs in eval mode (running statistics; dropout off)."
    )
    return (
        f"\nThis is a KernelBench problem: `Model.forward` is the reference, on inputs from the "
        f"file's own `get_inputs()` at the case's sizes. {train} Write either\n\n"
        f"- `{ENTRY}({', '.join([*names, *weights])}, *, {kw})`, a plain function: the "
        f"forward's tensors, then the Model's weights ({', '.join(weights) or 'none'}: fresh "
        "random tensors each call, like the inputs), the constructor's arguments as keywords; "
        f"or\n- `class {ENTRY_CLASS}(nn.Module)`, as for KernelBench: the harness builds it with "
        "the constructor's arguments (in order) and binds the same weights to its parameters "
        "of the same names before each call, so weights derived in `__init__` are stale.\n\n"
        + (
            "The baseline is the forward as a plain PyTorch function."
            if function_baseline
            else f"The baseline is the Model itself as `{ENTRY_CLASS}`."
        )
        + " The guarded verify needs the work in Triton kernels.\n"
    )


def kernelbench_files(source: Path) -> list[Path]:
    if source.is_dir():
        files = sorted(p for p in source.glob("*.py") if not p.name.startswith("_"))
    elif source.is_file():
        files = [source]
    else:
        raise UsageError(f"{source} does not exist.", next_step="give a KernelBench file or folder")
    if not files:
        raise UsageError(
            f"{source} holds no .py file.", next_step="give a KernelBench file or folder"
        )
    return files


def import_kernelbench(
    source: Path, out: Path, *, dtypes: list[str], force: bool = False, mode: Mode = "train"
) -> list[TaskRow]:
    """Each KernelBench file (`source`, or every .py directly in the folder `source`) as a task
    folder under `out`, named kb_<file stem>: one row per file, written or refused (and why)."""
    rows = []
    for path in kernelbench_files(source):
        started = time.perf_counter()
        try:
            plan = plan_kernelbench(path, dtypes=dtypes, mode=mode)
            task = write_task(plan, out / plan.name, force=force)
            row = TaskRow(file=path.name, task=task.name, status="written", folder=str(task.root))
        except UsageError as exc:
            row = TaskRow(
                file=path.name, task=task_name(path), status="refused", reason=exc.message
            )
        row.seconds = round(time.perf_counter() - started, 3)
        rows.append(row)
    return rows


__all__ = [
    "ENTRY",
    "import_kernelbench",
    "kernelbench_files",
    "plan_kernelbench",
    "task_name",
]
