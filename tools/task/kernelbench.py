"""`harnesslab task import-kernelbench FILE.py|FOLDER`: KernelBench-format problems as declared
kernel tasks.

A KernelBench file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`,
with its sizes as module-level integer constants. The task's reference is
`Model(**init)` built under a fixed seed (tools/gpu/declared.py, kind "module"); `get_inputs()`
gives the dev case and the input declarations, each axis named by the module constant of its
size; the hidden final domain varies those constants from half to twice their value (sizes
with no constant stay fixed). The candidate implements a plain function `model_new(*inputs,
**init)`: the forward's tensors positionally, then the Model's parameters and buffers (drawn
fresh like any input, with the init's mean and spread), `__init__`'s arguments as keywords.

Host side, trusted: it imports the user's file, as the user asked.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from ..errors import UsageError
from .scaffold import (
    TaskPlan,
    call_reference,
    infer_inputs,
    load_user_module,
    output_shape,
    signature_names,
    write_task,
)
from .spec import TaskSpec

ENTRY = "model_new"
# KernelBench's own check: atol = rtol = 1e-2 (fp32 problems; a GPU matmul may use TF32).
KB_TOLERANCES = {
    "float32": {"atol": 1e-2, "rtol": 1e-2},
    "float16": {"atol": 1e-2, "rtol": 2e-2},
    "bfloat16": {"atol": 2e-2, "rtol": 4e-2},
}


def task_name(path: Path) -> str:
    """'1_Square_matrix_multiplication_.py' -> 'kb_1_square_matrix_multiplication'."""
    stem = re.sub(r"[^a-z0-9_-]+", "_", path.stem.lower()).strip("_-")
    return ("kb_" + stem)[:64].rstrip("_-")


def size_constants(source: str) -> dict[str, int]:
    """Module-level `NAME = <int>` assignments, less those get_init_inputs() uses (those are
    arguments of Model's constructor, such as the reduced dim, not sizes)."""
    tree = ast.parse(source)
    consts: dict[str, int] = {}
    init_names: set[str] = set()
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and type(node.value.value) is int
        ):
            consts[node.targets[0].id] = node.value.value
        if isinstance(node, ast.FunctionDef) and node.name == "get_init_inputs":
            init_names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return {k: v for k, v in consts.items() if k not in init_names and v > 1}


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


def plan_kernelbench(path: Path, *, dtypes: list[str]) -> TaskPlan:
    import torch

    source = path.read_text()
    mod = load_user_module(path, "kb")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
    if missing:
        raise UsageError(
            f"{path} is not in KernelBench format: it defines no {', '.join(missing)}.",
            next_step="a KernelBench file has class Model(nn.Module), get_inputs() and "
            "get_init_inputs()",
        )
    init_params = [p for p in signature_names(mod.Model.__init__) if p != "self"]
    init_values = list(mod.get_init_inputs())
    if len(init_values) > len(init_params):
        raise UsageError(
            f"{path}: get_init_inputs() gives {len(init_values)} values, Model.__init__ takes "
            f"{len(init_params)}.",
            next_step="make them agree",
        )
    scalars = dict(zip(init_params, init_values, strict=False))
    bad = {k: v for k, v in scalars.items() if not isinstance(v, (int, float, bool, str))}
    if bad:
        raise UsageError(
            f"{path}: init inputs {sorted(bad)} are not numbers or strings.",
            next_step="only scalar constructor arguments can be declared",
        )
    torch.manual_seed(0)
    model = mod.Model(**scalars)
    # Weights (nn.Linear's, a conv's) become the task's last inputs, drawn fresh like the
    # others with the init's mean and spread, so a plain-function candidate receives them too.
    weights = [(n, t.detach()) for n, t in [*model.named_parameters(), *model.named_buffers()]]
    args = list(mod.get_inputs())
    names = [p for p in signature_names(mod.Model.forward) if p != "self"]
    names = names[: len(args)] + [f"x{i}" for i in range(len(names), len(args))]
    sizes = size_constants(source)
    weight_names = [w.replace(".", "_") for w, _ in weights]
    named = list(zip(names, args, strict=True))
    named += [(n, t) for n, (_, t) in zip(weight_names, weights, strict=True)]
    decls, dims = infer_inputs(named, sizes)
    for decl, (_, t) in zip(decls[len(args) :], weights, strict=True):
        if t.is_floating_point() and t.numel() > 1:
            decl.mean, decl.scale = float(t.mean()), max(float(t.std()), 1e-6)
    out = call_reference(model, [a.float() if a.is_floating_point() else a for a in args], {})
    constant_dims = set(sizes)
    ranges = {k: (v, v) for k, v in dims.items() if k not in constant_dims}
    return TaskPlan(
        name=task_name(path),
        summary=f"KernelBench problem {path.stem}: "
        + ((inspect.getdoc(mod.Model) or "").splitlines() or ["Model.forward"])[0],
        reference_file=path,
        reference_name="Model",
        reference_kind="module",
        module_params=[w for w, _ in weights],
        inputs=decls,
        scalars=scalars,
        output_shape=output_shape(tuple(out.shape), dims),
        output_dtype="case" if out.is_floating_point() else str(out.dtype).removeprefix("torch."),
        dims=dims,
        dtypes=dtypes,
        ranges=ranges,
        tolerances={d: KB_TOLERANCES[d] for d in dtypes if d in KB_TOLERANCES},
        entry_function=ENTRY,
        baseline="" if weights else (forward_as_function(source, scalars) or ""),
        brief=f"\nThis is a KernelBench problem: `Model.forward` is the reference. Implement "
        f"`{ENTRY}` as a plain function (not a `ModelNew` class): the forward's tensors "
        f"positionally, then the Model's weights "
        f"({', '.join(weight_names) or 'none'}: fresh random tensors each call, like the "
        f"inputs), Model's constructor arguments ({', '.join(scalars) or 'none'}) as keywords. "
        + (
            "The baseline runs the Model on those weights in PyTorch (the guarded verify needs a "
            "Triton kernel instead).\n"
            if weights
            else "The baseline is the forward as a plain PyTorch function.\n"
        ),
    )


def import_kernelbench(
    source: Path, out: Path, *, dtypes: list[str], force: bool = False
) -> list[TaskSpec]:
    """Each KernelBench file (`source`, or every .py directly in the folder `source`) as a task
    folder under `out`, named kb_<file stem>."""
    files = (
        sorted(p for p in source.glob("*.py") if not p.name.startswith("_"))
        if source.is_dir()
        else [source]
    )
    if not files:
        raise UsageError(
            f"{source} holds no .py file.", next_step="give a KernelBench file or folder"
        )
    tasks = []
    for path in files:
        plan = plan_kernelbench(path, dtypes=dtypes)
        tasks.append(write_task(plan, out / plan.name, force=force))
    return tasks


__all__ = ["ENTRY", "import_kernelbench", "plan_kernelbench", "size_constants", "task_name"]
