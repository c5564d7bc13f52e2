"""The generic reference of a declared task (task.toml [declare]): staged as the task's
reference.py on the GPU host, beside `declaration.json` (what the host parsed and checked from
task.toml) and the user's own reference source. Trusted: it decides correctness.

Standard library + torch only, like every staged file. It gives the runner and the guard what a
hand-written reference.py gives: make_inputs, reference, output_spec, bytes_moved, flops,
interpreter_shape and BATCH_DIM, all derived from the declaration (its edge inputs are the
generic suite's, numerics.py, as for every task):

- inputs: name, shape (dim names, integers or small expressions such as "2*dim"), dtype ("case"
  or a fixed one), distribution (normal: mean + scale * N(0, 1); uniform: [low, high);
  randint: [low, high), the bounds numbers or expressions over dims);
- inputs_from: a function of the reference file (KernelBench's get_inputs) that makes the inputs
  instead, run with the case's dims as the file's module constants (load_source), under a seed
  drawn from the case's generator;
- scalars: keyword arguments passed to the reference and to the candidate alike;
- reference: "file.py:function" (called on fp32 copies of the inputs), or "file.py:Model" with
  kind "module" (KernelBench: `Model(**scalars)` built once under a fixed seed, its parameters
  the task's last inputs; in train mode, as KernelBench runs it, each call starts from the
  Model's own buffers, so BatchNorm's running statistics never drift between calls);
- output: shape and dtype the candidate must return ("reference": the shape the reference gives
  for the inputs, derived on meta tensors); bytes and flops formulas over the dims (default:
  every input and the output moved once, one flop per output element).
MODULE tells the runner and the guard how to build a candidate `ModelNew` class (modelnew.py).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import operator
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
# Staged beside declaration.json; imported anywhere else (the host's package) it declares nothing.
_DECL_FILE = HERE / "declaration.json"
DECL: dict[str, Any] = json.loads(_DECL_FILE.read_text()) if _DECL_FILE.is_file() else {}

Inputs = tuple[tuple, dict]
FIXED_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
}


def evaluate(expr: int | float | str, dims: dict[str, int]) -> float:
    """An integer, a dim name or an arithmetic expression over dims (no calls, no attributes)."""
    if isinstance(expr, (int, float)):
        return expr

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            return dims[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"unsupported expression {expr!r}")

    return ev(ast.parse(str(expr), mode="eval"))


class _Shape(tuple):
    """An input's concrete shape that remembers the dims it came from, so that a bound over dims
    (targets < num_classes) resolves wherever the shape goes."""

    dims: dict[str, int]


def _shape(decl: dict[str, Any], dims: dict[str, int]) -> tuple[int, ...]:
    out = _Shape(int(evaluate(e, dims)) for e in decl["shape"])
    out.dims = dims
    return out


def _dtype(decl: dict[str, Any], case_dtype: torch.dtype) -> torch.dtype:
    name = decl.get("dtype", "case")
    return case_dtype if name == "case" else FIXED_DTYPES[name]


def _bound(decl: dict[str, Any], key: str, default: float, shape: tuple[int, ...]) -> float:
    value = decl.get(key, default)
    return evaluate(value, getattr(shape, "dims", {})) if isinstance(value, str) else value


def _draw(decl: dict[str, Any], shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    dist = decl.get("distribution", "normal")
    if dist == "randint":
        low, high = int(_bound(decl, "low", 0, shape)), int(_bound(decl, "high", 2, shape))
        return torch.randint(low, max(high, low + 1), shape, generator=g, device=g.device)
    if dist == "uniform":
        lo, hi = float(_bound(decl, "low", 0.0, shape)), float(_bound(decl, "high", 1.0, shape))
        return torch.rand(shape, generator=g, device=g.device) * (hi - lo) + lo
    x = torch.randn(shape, generator=g, device=g.device)
    return x * float(decl.get("scale", 1.0)) + float(decl.get("mean", 0.0))


def _pack(tensors: list[torch.Tensor], dtype: torch.dtype, device: str) -> Inputs:
    out = [
        t.to(device=device, dtype=_dtype(d, dtype)).contiguous()
        for t, d in zip(tensors, DECL["inputs"], strict=True)
    ]
    return tuple(out), _kwargs(_dims_of(tuple(out)))


def _kwargs(dims: dict[str, int]) -> dict[str, Any]:
    """The keyword arguments of a call with these dims: the fixed scalars, and the sizes among
    them (scalar_dims: a Model's in_features) at the call's dims."""
    out = dict(DECL.get("scalars", {}))
    for k, v in DECL.get("scalar_dims", {}).items():
        out[k] = (
            [int(evaluate(e, dims)) for e in v] if isinstance(v, list) else int(evaluate(v, dims))
        )
    return out


def make_inputs(
    shape: dict[str, int], dtype: torch.dtype, device: str, generator: torch.Generator
) -> Inputs:
    """Fresh inputs drawn where `generator` lives, each as declared (or made by the file's
    inputs_from function), then the Model's parameters (as its own initialiser draws them)."""
    decls = DECL["inputs"]
    n = len(decls) - len(_PARAMS)
    where = torch.device(device)
    if DECL.get("inputs_from"):
        made = _made_inputs(shape, where, generator, decls[:n])
    else:
        made = [_draw(d, _shape(d, shape), generator) for d in decls[:n]]
    if any(d.get("distribution") == "init" for d in decls[n:]):
        # The Model's parameters as its own constructor initialises them at these sizes, fresh
        # per call (a seed from the case's generator), built where they are used.
        with _seeded(generator, where):
            model = _build(_kwargs(shape), where, torch.float32)
        own = dict([*model.named_parameters(), *model.named_buffers()])
    for d, p in zip(decls[n:], _PARAMS, strict=True):
        made.append(
            own[p].detach()
            if d.get("distribution") == "init"
            else _draw(d, _shape(d, shape), generator)
        )
    return _pack(made, dtype, device)


@contextlib.contextmanager
def _seeded(generator: torch.Generator, where: torch.device) -> Iterator[None]:
    """Torch's global generators forked and seeded from `generator` (what a file's get_inputs()
    and a Model's initialiser draw from)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    with torch.random.fork_rng(devices=[where.index or 0] if where.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _made_inputs(
    shape: dict[str, int], where: torch.device, generator: torch.Generator, decls: list[dict]
) -> list[torch.Tensor]:
    """The file's inputs_from function at the case's dims, checked against the declaration."""
    with _seeded(generator, where), where:
        made = list(_inputs_function(shape)())
    if len(made) != len(decls):
        raise ValueError(f"inputs_from made {len(made)} inputs, the declaration has {len(decls)}")
    for i, (t, d) in enumerate(zip(made, decls, strict=True)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != _shape(d, shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(
                f"inputs_from's input {i} is {got}, the declaration says {_shape(d, shape)}"
            )
    return made


def load_source(path: Path, name: str, constants: dict[str, Any] | None = None) -> types.ModuleType:
    """The Python file `path` run as module `name`, each module-level constant named in
    `constants` taking the given value right after the file assigns it, so that what the file
    derives from it (`input_shape = (num_classes,)`) follows."""
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = []
    for stmt in tree.body:
        body.append(stmt)
        for target in sorted(assigned_names(stmt) & set(constants or {})):
            assert constants is not None
            body += ast.parse(f"{target} = {constants[target]!r}").body
    tree.body = body
    mod = types.ModuleType(name)
    mod.__file__ = str(path)
    sys.modules[name] = mod
    exec(compile(tree, str(path), "exec"), mod.__dict__)
    return mod


def assigned_names(stmt: ast.stmt) -> set[str]:
    """Names a module-level statement binds: `a = b = 1`, `d, h, w = (16, 32, 32)`."""
    if isinstance(stmt, ast.Assign):
        targets: list[ast.expr] = list(stmt.targets)
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    else:
        return set()
    out: set[str] = set()
    for t in targets:
        elts = t.elts if isinstance(t, ast.Tuple | ast.List) else [t]
        out |= {e.id for e in elts if isinstance(e, ast.Name)}
    return out


_INPUT_FNS: dict[str, Callable[[], Any]] = {}


def _inputs_function(dims: dict[str, int]) -> Callable[[], Any]:
    spec = DECL["inputs_from"]
    values = {
        k: tuple(int(evaluate(e, dims)) for e in v)
        if isinstance(v, list)
        else int(evaluate(v, dims))
        for k, v in spec["constants"].items()
    }
    key = json.dumps(values, sort_keys=True)
    if key not in _INPUT_FNS:
        file_name, attr = spec["call"].split(":", 1)
        mod = load_source(HERE / file_name, f"_hl_declared_inputs_{len(_INPUT_FNS)}", values)
        _INPUT_FNS[key] = getattr(mod, attr)
    return _INPUT_FNS[key]


# -- the reference ------------------------------------------------------------------------------


def _load_reference() -> Callable[..., Any]:
    file_name, attr = DECL["reference"]["entry"].split(":", 1)
    name = f"_hl_declared_ref_{abs(hash(str(HERE)))}"
    spec = importlib.util.spec_from_file_location(name, HERE / file_name)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the reference {file_name}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, attr)


_REF: Callable[..., Any] | None = _load_reference() if DECL else None
_MODULES: dict[str, Any] = {}
_IS_MODULE = bool(DECL) and DECL["reference"].get("kind", "function") == "module"
_PARAMS: list[str] = list(DECL["reference"].get("params", [])) if DECL else []
_TRAIN = _IS_MODULE and DECL["reference"].get("mode", "train") == "train"
# How a candidate `ModelNew` class is built (tools/gpu/modelnew.py): the constructor's arguments
# in order, the seed, and which of the task's last inputs are which parameter of the Model.
MODULE: dict[str, Any] | None = (
    {"params": _PARAMS, "init": list(DECL["reference"].get("init", [])),
     "seed": int(DECL["reference"].get("seed", 0)), "train": _TRAIN}
    if _IS_MODULE else None
)  # fmt: skip


def init_value(v: Any) -> Any:
    """A constructor argument as KernelBench passes it: a tuple where TOML has a list."""
    return tuple(v) if isinstance(v, list) else v


def _build(kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """Model(**kwargs) in `dtype`, built on `device` (a meta Model costs no memory)."""
    assert _REF is not None
    with device:
        model = _REF(**{k: init_value(v) for k, v in kwargs.items()})
    return model.to(dtype).train(_TRAIN)


def _module(kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    key = json.dumps(kwargs, sort_keys=True, default=str) + str(device) + str(dtype)
    if key not in _MODULES:
        # A fixed seed: the same parameters every time the task is evaluated, on every host.
        cuda = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(int(DECL["reference"].get("seed", 0)))
            _MODULES[key] = _build(kwargs, device, dtype)
    return _MODULES[key]


def _fp32(t: Any) -> Any:
    """fp32 for the reference; fp64 stays fp64 (the generic suite's accuracy check)."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
        return t.float()
    return t


def _call(args: list[Any], kwargs: dict[str, Any], device: Any) -> Any:
    """The user's reference on `args` (fp32 copies, or meta tensors for the output's shape)."""
    if not _IS_MODULE:
        assert _REF is not None
        return _REF(*args, **kwargs)
    # fp64 inputs (the generic suite's accuracy check) get an fp64 Model, else fp32
    wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in args)
    model = _module(kwargs, device, torch.float64 if wide else torch.float32)
    state: dict[str, Any] = {}
    if _TRAIN and device.type != "meta":  # each call starts from the Model's own buffers
        state = {k: b.clone() for k, b in model.named_buffers()}
    n = len(args) - len(_PARAMS)
    state |= dict(zip(_PARAMS, args[n:], strict=True))
    return torch.func.functional_call(model, state, tuple(args[:n]))


def reference(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The user's reference on fp32 copies of the inputs; returns fp32 (fp64 given fp64)."""
    fargs = [_fp32(a) for a in args]
    device = next((a.device for a in fargs if isinstance(a, torch.Tensor)), torch.device("cpu"))
    with torch.no_grad():
        out = _call(fargs, kwargs, device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the reference returned {type(out).__name__}, expected one tensor")
    return _fp32(out)


def _case_dtype(args: tuple) -> torch.dtype:
    for a, d in zip(args, DECL["inputs"], strict=False):
        if d.get("dtype", "case") == "case" and isinstance(a, torch.Tensor):
            return a.dtype
    return torch.float32


def _dims_of(args: tuple) -> dict[str, int]:
    """The dims an actual call has (read back from the input shapes)."""
    dims: dict[str, int] = {}
    for a, d in zip(args, DECL["inputs"], strict=False):
        for size, expr in zip(a.shape, d["shape"], strict=False):
            if isinstance(expr, str) and expr.isidentifier():
                dims.setdefault(expr, int(size))
    return dims


def _derived_shape(shapes: list[tuple[int, ...]], dtypes: list[torch.dtype]) -> tuple[int, ...]:
    """The reference's output shape for inputs of these shapes, from one call on meta tensors."""
    margs = [torch.empty(s, dtype=t, device="meta") for s, t in zip(shapes, dtypes, strict=True)]
    with torch.no_grad():
        out = _call(margs, _kwargs(_dims_of(tuple(margs))), torch.device("meta"))
    return tuple(out.shape)


def _output_shape(dims: dict[str, int]) -> tuple[int, ...]:
    out = DECL["output"]
    if out["shape"] != "reference":
        return _shape(out, dims)
    decls = DECL["inputs"]
    dtypes = [_dtype(d, torch.float32) for d in decls]
    return _derived_shape([_shape(d, dims) for d in decls], dtypes)


def output_spec(*args: Any, **kwargs: Any) -> tuple[tuple[int, ...], torch.dtype]:
    out = DECL["output"]
    dtype = _dtype(out, _case_dtype(args))
    if out["shape"] != "reference":
        return _shape(out, _dims_of(args)), dtype
    shapes = [tuple(a.shape) for a in args]
    return _derived_shape(shapes, [_fp32(a).dtype for a in args]), dtype


def _nbytes(dtype: torch.dtype) -> int:
    return dtype.itemsize  # torch.bool too (iinfo refuses it)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def bytes_moved(shape: dict[str, int], dtype_bytes: int) -> int:
    """The declared formula (dims and `dtype_bytes`), or every input and the output once."""
    if DECL.get("bytes"):
        return int(evaluate(DECL["bytes"], {**shape, "dtype_bytes": dtype_bytes}))
    total = 0
    for d in DECL["inputs"]:
        fixed = d.get("dtype", "case")
        size = dtype_bytes if fixed == "case" else _nbytes(FIXED_DTYPES[fixed])
        total += _numel(_shape(d, shape)) * size
    fixed = DECL["output"].get("dtype", "case")
    size = dtype_bytes if fixed == "case" else _nbytes(FIXED_DTYPES[fixed])
    return total + _numel(_output_shape(shape)) * size


def flops(shape: dict[str, int]) -> int:
    if DECL.get("flops"):
        return int(evaluate(DECL["flops"], shape))
    return _numel(_output_shape(shape))


def interpreter_shape(shape: dict[str, int]) -> dict[str, int]:
    """The declared interpreter dims, the others capped (the CPU interpreter is ~1000x slower)."""
    cap = int(DECL.get("interpreter_cap", 64))
    fixed = DECL.get("interpreter", {})
    return {k: int(fixed.get(k, min(v, cap))) for k, v in shape.items()}


# -- the generic suite --------------------------------------------------------------------------
# A declared task has no probes or edges of its own: the guarded verify and numerical_probe run
# the generic suite (numerics.py: every size edge and value family) on its inputs, in the dim
# the first input's first axis names (the batch).


def _batch_dim() -> str | None:
    first = DECL["inputs"][0]["shape"][0] if DECL and DECL["inputs"][0]["shape"] else None
    return first if isinstance(first, str) and first.isidentifier() else None


BATCH_DIM = _batch_dim()

__all__ = [
    "BATCH_DIM",
    "MODULE",
    "bytes_moved",
    "evaluate",
    "flops",
    "interpreter_shape",
    "load_source",
    "make_inputs",
    "output_spec",
    "reference",
]
