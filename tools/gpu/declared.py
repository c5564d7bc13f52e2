"""The generic reference of a declared task (task.toml [declare]): staged as the task's
reference.py on the GPU host, beside `declaration.json` (what the host parsed and checked from
task.toml) and the user's own reference source. Trusted: it decides correctness.

Standard library + torch only, like every staged file. It gives the runner and the guard what a
hand-written reference.py gives: make_inputs, reference, output_spec, bytes_moved, flops,
interpreter_shape and BATCH_DIM, all derived from the declaration (its edge inputs are the
generic suite's, numerics.py, as for every task):

- inputs: name, shape (dim names, integers or small expressions such as "2*dim"), dtype ("case"
  or a fixed one), distribution (normal: mean + scale * N(0, 1); uniform: [low, high);
  randint: [low, high));
- scalars: keyword arguments passed to the reference and to the candidate alike;
- reference: "file.py:function" (called on fp32 copies of the inputs), or "file.py:Model" with
  kind "module" (KernelBench: `Model(**scalars)` built once under a fixed seed, called with the
  inputs);
- output: shape and dtype the candidate must return; bytes and flops formulas over the dims
  (default: every input and the output moved once, one flop per output element).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import operator
import sys
from collections.abc import Callable
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


def _shape(decl: dict[str, Any], dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(int(evaluate(e, dims)) for e in decl["shape"])


def _dtype(decl: dict[str, Any], case_dtype: torch.dtype) -> torch.dtype:
    name = decl.get("dtype", "case")
    return case_dtype if name == "case" else FIXED_DTYPES[name]


def _draw(decl: dict[str, Any], shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    dist = decl.get("distribution", "normal")
    if dist == "randint":
        return torch.randint(
            int(decl.get("low", 0)), int(decl.get("high", 2)), shape, generator=g, device=g.device
        )
    if dist == "uniform":
        lo, hi = float(decl.get("low", 0.0)), float(decl.get("high", 1.0))
        return torch.rand(shape, generator=g, device=g.device) * (hi - lo) + lo
    x = torch.randn(shape, generator=g, device=g.device)
    return x * float(decl.get("scale", 1.0)) + float(decl.get("mean", 0.0))


def _pack(tensors: list[torch.Tensor], dtype: torch.dtype, device: str) -> Inputs:
    out = [
        t.to(device=device, dtype=_dtype(d, dtype)).contiguous()
        for t, d in zip(tensors, DECL["inputs"], strict=True)
    ]
    return tuple(out), dict(DECL.get("scalars", {}))


def make_inputs(
    shape: dict[str, int], dtype: torch.dtype, device: str, generator: torch.Generator
) -> Inputs:
    """Fresh inputs drawn where `generator` lives, each as declared."""
    return _pack([_draw(d, _shape(d, shape), generator) for d in DECL["inputs"]], dtype, device)


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


def _module(kwargs: dict[str, Any], dtype: torch.dtype = torch.float32) -> Any:
    key = json.dumps(kwargs, sort_keys=True, default=str) + str(dtype)
    if key not in _MODULES:
        # A fixed seed: the same parameters every time the task is evaluated, on every host.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(DECL["reference"].get("seed", 0)))
            assert _REF is not None
            _MODULES[key] = _REF(**kwargs).to(dtype).eval()
    return _MODULES[key]


def _fp32(t: Any) -> Any:
    """fp32 for the reference; fp64 stays fp64 (the generic suite's accuracy check)."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
        return t.float()
    return t


def reference(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The user's reference on fp32 copies of the inputs; returns fp32 (fp64 given fp64)."""
    fargs = [_fp32(a) for a in args]
    with torch.no_grad():
        if DECL["reference"].get("kind", "function") == "module":
            wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in fargs)
            model = _module(kwargs, torch.float64 if wide else torch.float32)
            model = model.to(fargs[0].device if fargs else "cpu")
            params = DECL["reference"].get("params", [])
            if params:  # the Model's weights are the task's last inputs
                n = len(fargs) - len(params)
                state = dict(zip(params, fargs[n:], strict=True))
                out = torch.func.functional_call(model, state, tuple(fargs[:n]))
            else:
                out = model(*fargs)
        else:
            assert _REF is not None
            out = _REF(*fargs, **kwargs)
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


def output_spec(*args: Any, **kwargs: Any) -> tuple[tuple[int, ...], torch.dtype]:
    out = DECL["output"]
    return _shape(out, _dims_of(args)), _dtype(out, _case_dtype(args))


def _nbytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8 if dtype.is_floating_point else torch.iinfo(dtype).bits // 8


def bytes_moved(shape: dict[str, int], dtype_bytes: int) -> int:
    """The declared formula (dims and `dtype_bytes`), or every input and the output once."""
    if DECL.get("bytes"):
        return int(evaluate(DECL["bytes"], {**shape, "dtype_bytes": dtype_bytes}))
    total = 0
    for d in [*DECL["inputs"], DECL["output"]]:
        n = 1
        for s in _shape(d, shape):
            n *= s
        fixed = d.get("dtype", "case")
        total += n * (dtype_bytes if fixed == "case" else _nbytes(FIXED_DTYPES[fixed]))
    return total


def flops(shape: dict[str, int]) -> int:
    if DECL.get("flops"):
        return int(evaluate(DECL["flops"], shape))
    n = 1
    for s in _shape(DECL["output"], shape):
        n *= s
    return n


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
    "bytes_moved",
    "evaluate",
    "flops",
    "interpreter_shape",
    "make_inputs",
    "output_spec",
    "reference",
]
