"""What a KernelBench file's sizes are, learned without building its full-size inputs: which of
its module-level constants are sizes, which constant (or `2*D`) each input axis, weight axis and
constructor argument is, the bounds of its index inputs, and its output's shape.

The file is re-run with its constants replaced (tools/gpu/declared.py load_source, so that
`input_shape = (num_classes,)` follows) at the file's values and at perturbed ones, and its
`get_inputs()` and `Model(*get_init_inputs())` run on meta tensors (no memory). An axis that
moves with a constant in every run is that constant's dim; one that never moves is a literal; the
output's axes are named the same way, or derived per case by the reference itself (output shape
"reference": a strided conv's `(H - k) // s + 1`). Constants the Model needs equal (a loss that
broadcasts batch against classes) are tied into one dim; constants it cannot take apart from
their file values (a LayerNorm over a width) are fixed, found by a short search. Constructor
sizes (in_features) become dims too: fixed on the GPU, smaller on the CPU interpreter.

Host side, trusted: it runs the user's file, as the user asked.
"""

from __future__ import annotations

import ast
import itertools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..gpu.declared import assigned_names, evaluate, init_value, load_source

Dim = int | str
# Perturbed runs: dim i at base + step * i, then +1, then +(3 + i) from there: a floor division
# (a strided output) cannot pass for a linear expression, nor one dim for another (the third
# offset differs per dim). The second set is tried when an op refuses the first's sizes (an
# even size, a divisibility).
RUN_SETS = ((96, 16, 1), (128, 32, 2))
# A constructor constant below this is a kernel size, a stride or a group count: never varied.
MIN_INIT_SIZE = 16
_counter = itertools.count()


class Refused(UsageError):
    """A KernelBench file the import cannot make a faithful task of, and why."""

    def __init__(self, message: str) -> None:
        super().__init__(message, next_step="")


def user_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


# -- the file's constants -----------------------------------------------------------------------


def _literal(node: ast.expr) -> int | tuple[int, ...] | None:
    """An integer (or a tuple of integers) written with literals only (`1024 * 2`)."""
    try:
        if isinstance(node, ast.Tuple):
            values = [evaluate(ast.unparse(e), {}) for e in node.elts]
            ints = [v for v in values if type(v) is int]
            return tuple(int(v) for v in ints) if len(ints) == len(values) else None
        value = evaluate(ast.unparse(node), {})
    except (ValueError, KeyError, SyntaxError, ZeroDivisionError):
        return None
    return value if type(value) is int else None  # type: ignore[return-value]


def _constants(source: str) -> tuple[dict[str, Any], set[str]]:
    """Module-level names bound to literal integers (or tuples of them), the last binding
    winning (None: computed from other names), and the names get_init_inputs() depends on."""
    tree = ast.parse(source)
    values: dict[str, Any] = {}
    deps: dict[str, set[str]] = {}
    init_names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_init_inputs":
            init_names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        names = assigned_names(node)
        value = getattr(node, "value", None)
        if not names or value is None:
            continue
        used = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        for n in names:
            deps.setdefault(n, set()).update(used)
        literal = _literal(value) if not used and not isinstance(node, ast.AugAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
        for t in targets:
            if isinstance(t, ast.Name):
                values[t.id] = literal
            elif isinstance(t, ast.Tuple | ast.List):
                names_ = [e.id if isinstance(e, ast.Name) else "" for e in t.elts]
                ok = isinstance(literal, tuple) and len(literal) == len(names_)
                for i, n in enumerate(names_):
                    values[n] = literal[i] if ok else None  # type: ignore[index]
    closure: set[str] = set()
    todo = list(init_names)
    while todo:
        n = todo.pop()
        if n not in closure:
            closure.add(n)
            todo += deps.get(n, ())
    return values, closure


def _is_size(v: Any) -> bool:
    if isinstance(v, tuple):
        return bool(v) and all(type(e) is int and e >= 1 for e in v) and max(v) > 1
    return type(v) is int and v > 1


def size_constants(source: str) -> dict[str, int | tuple[int, ...]]:
    """The module-level constants that may be sizes: integers (or tuples of them) above 1
    written with literals; a constructor argument (get_init_inputs() depends on it) only from
    MIN_INIT_SIZE on (below, a kernel size, a stride or a group count stays as written)."""
    values, init_fed = _constants(source)
    out = {}
    for k, v in values.items():
        if not k or not _is_size(v):
            continue
        if k in init_fed and max(v if isinstance(v, tuple) else (v,)) < MIN_INIT_SIZE:
            continue
        out[k] = v
    return out


def constructor_constants(source: str) -> set[str]:
    """The module-level names get_init_inputs() depends on (directly or through others)."""
    return _constants(source)[1]


@dataclass
class Sizes:
    """The dims that vary (named after the constants, with the file's values), how each varying
    constant is made of them, and which dims feed the Model's constructor."""

    dims: dict[str, int] = field(default_factory=dict)
    constants: dict[str, Dim | list[Dim]] = field(default_factory=dict)
    init_dims: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, consts: dict[str, Any], *, fixed: set[str], tie: bool, init_fed: set[str]) -> Sizes:
        out = cls()
        by_value: dict[int, str] = {}

        def dim_for(name: str, value: int) -> str:
            dim = by_value.get(value, name) if tie else name
            by_value.setdefault(value, dim)
            out.dims[dim] = value
            return dim

        for name, v in consts.items():
            if name in fixed:
                continue
            if isinstance(v, int):
                out.constants[name] = dim_for(name, v)
            else:
                out.constants[name] = [
                    dim_for(name if len(v) == 1 else f"{name}_{i}", e) if e > 1 else e
                    for i, e in enumerate(v)
                ]
            if name in init_fed:
                m = out.constants[name]
                out.init_dims |= {
                    e for e in (m if isinstance(m, list) else [m]) if isinstance(e, str)
                }
        return out

    def values(self, dims: dict[str, int]) -> dict[str, int | tuple[int, ...]]:
        """The module constants for these dims (what load_source substitutes)."""
        out: dict[str, int | tuple[int, ...]] = {}
        for name, m in self.constants.items():
            if isinstance(m, list):
                out[name] = tuple(int(evaluate(e, dims)) for e in m)
            else:
                out[name] = int(evaluate(m, dims))
        return out

    def runs(self, which: int) -> list[dict[str, int]]:
        """The file's dims, then RUN_SETS[which]'s perturbed dims."""
        base, step, unit = RUN_SETS[which]
        runs = [dict(self.dims)]
        for off in (lambda i: 0, lambda i: unit, lambda i: unit * (3 + i)):
            runs.append({k: base + step * i + off(i) for i, k in enumerate(self.dims)})
        return runs


def fit(values: list[Any], runs: list[dict[str, int]]) -> Dim | None:
    """A size (or a bound) seen at each run as a literal, a dim, `a*dim + b`, or None."""
    if all(v == values[0] for v in values):
        return values[0]
    if not all(type(v) is int for v in values):
        return None
    for k in runs[0]:
        if all(v == r[k] for v, r in zip(values, runs, strict=True)):
            return k
    for k in runs[0]:
        step = runs[2][k] - runs[1][k]
        if not step or (values[2] - values[1]) % step:
            continue
        a = (values[2] - values[1]) // step
        b = values[1] - a * runs[1][k]
        if a and all(v == a * r[k] + b for v, r in zip(values, runs, strict=True)):
            expr = k if a == 1 else f"{a}*{k}"
            return expr if not b else f"{expr} {'+' if b > 0 else '-'} {abs(b)}"
    return None


# -- one run of the file ------------------------------------------------------------------------


class _Made:
    """Which torch factory made each tensor get_inputs() returns (rand, randn, randint and its
    bounds), seen through a TorchFunctionMode."""

    def __init__(self) -> None:
        from torch.overrides import TorchFunctionMode

        made: dict[int, tuple[str, list[Any]]] = {}
        self.made = made

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                name = getattr(func, "__name__", "")
                if name in ("rand", "randn", "randint"):
                    nums = [a for a in args if type(a) is int]
                    nums += [kwargs[k] for k in ("low", "high") if k in kwargs]
                    made[id(out)] = (name, nums)
                return out

        self.mode = Mode


@dataclass
class Seen:
    """One run: get_inputs(), the constructor's arguments, the Model's weights and output."""

    inputs: list[Any]
    made: dict[int, tuple[str, list[Any]]]
    init: dict[str, Any]
    model: Any
    weights: dict[str, Any]
    out: Any


def constructor(model_cls: Any, values: list[Any]) -> dict[str, Any]:
    """The constructor's arguments by name (get_init_inputs() gives them in order)."""
    import inspect

    try:
        sig = inspect.signature(model_cls.__init__)
    except (TypeError, ValueError):
        sig = None
    params = [
        p.name
        for p in (sig.parameters.values() if sig else [])
        if p.name != "self" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(values) > len(params):
        raise Refused(
            f"get_init_inputs() gives {len(values)} values, Model.__init__ takes {len(params)}"
        )
    scalar = (int, float, bool, str)
    for k, v in zip(params, values, strict=False):
        ok = isinstance(v, scalar) or (
            isinstance(v, (tuple, list)) and all(isinstance(e, scalar) for e in v)
        )
        if not ok:
            raise Refused(
                f"constructor argument {k} is a {type(v).__name__}, not a number, a string or a tuple of them"
            )
    return {
        k: list(v) if isinstance(v, (tuple, list)) else v
        for k, v in zip(params, values, strict=False)
    }


def build(model_cls: Any, init: dict[str, Any], train: bool, *, meta: bool) -> Any:
    """Model(**init) as the task's reference builds it: seed 0, fp32, train or eval mode."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device("meta" if meta else "cpu"):
            model = model_cls(**{k: init_value(v) for k, v in init.items()})
    return model.float().train(train)


def forward(model: Any, args: list[Any]) -> Any:
    import torch

    with torch.no_grad():
        out = model(*args)
    if not isinstance(out, torch.Tensor):
        raise Refused(f"Model.forward returns a {type(out).__name__}, not one tensor")
    return out


def see(path: Path, model_cls: Any, sizes: Sizes, dims: dict[str, int], train: bool, *,
        meta: bool) -> Seen:  # fmt: skip
    """The file re-run with its constants at `dims`: its inputs (seed 0), its constructor's
    arguments, the Model (the original file's class, as the task's reference loads it) and
    its output, on meta tensors or real ones."""
    import torch

    capture = _Made()
    with warnings.catch_warnings():  # the user's ops warning about sizes the import tries
        warnings.simplefilter("ignore")
        mod = load_source(path, f"_hl_kb_{next(_counter)}", sizes.values(dims))
        init = constructor(model_cls, list(mod.get_init_inputs()))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            with torch.device("meta" if meta else "cpu"), capture.mode():
                inputs = list(mod.get_inputs())
        model = build(model_cls, init, train, meta=meta)
        weights = dict(model.named_parameters())
        if not train:
            weights |= dict(model.named_buffers())
        return Seen(inputs, capture.made, init, model, weights, forward(model, inputs))


# -- the search ---------------------------------------------------------------------------------


@dataclass
class Analysis:
    """What the file's sizes are: the dims, each input's and weight's shape over them, the
    constructor's arguments (literal, or over dims), and the output's shape."""

    sizes: Sizes
    runs_dims: list[dict[str, int]]
    runs: list[Seen]
    names: list[str]
    shapes: list[list[Dim]]
    weights: dict[str, list[Dim]]
    init: dict[str, Any]
    init_dims: dict[str, Dim | list[Dim]]
    out_shape: list[Dim] | str


class _Unfit(Exception):
    pass


def _analyse(path: Path, model_cls: Any, sizes: Sizes, names: list[str], train: bool) -> Analysis:
    error: BaseException | None = None
    for which in range(len(RUN_SETS)):
        runs_dims = sizes.runs(which)
        try:
            runs = [see(path, model_cls, sizes, d, train, meta=True) for d in runs_dims]
        except Refused:
            raise
        except Exception as exc:  # the user's op refused these sizes: the next set
            error = exc
            continue
        return _fitted(sizes, runs_dims, runs, names)
    raise _Unfit(user_error(error) if error else "no run")


def _fitted(
    sizes: Sizes, runs_dims: list[dict[str, int]], runs: list[Seen], names: list[str]
) -> Analysis:
    import torch

    n = len(runs[0].inputs)
    names = (names[:n] + [f"x{i}" for i in range(len(names), n)])[:n]
    shapes = []
    for i, name in enumerate(names):
        if not isinstance(runs[0].inputs[i], torch.Tensor):
            raise Refused(
                f"get_inputs() gives {name} as a {type(runs[0].inputs[i]).__name__}, not a tensor (non-tensor inputs are not supported)"
            )
        shapes.append(_axes([r.inputs[i].shape for r in runs], runs_dims, f"input {name}"))
    weights = {
        w: _axes([r.weights[w].shape for r in runs], runs_dims, f"weight {w}")
        for w in runs[0].weights
    }
    init: dict[str, Any] = {}
    init_dims: dict[str, Dim | list[Dim]] = {}
    for k, v in runs[0].init.items():
        seen = [r.init[k] for r in runs]
        if isinstance(v, list):
            elems = [fit([s[j] for s in seen], runs_dims) for j in range(len(v))]
            if None in elems:
                raise _Unfit(f"constructor argument {k}")
            if any(isinstance(e, str) for e in elems):
                init_dims[k] = elems  # type: ignore[assignment]
            else:
                init[k] = v
            continue
        got = fit(seen, runs_dims)
        if got is None:
            raise _Unfit(f"constructor argument {k}")
        if isinstance(got, str):
            init_dims[k] = got
        else:
            init[k] = v
    out_axes = [
        fit([int(r.out.shape[j]) for r in runs], runs_dims) for j in range(runs[0].out.dim())
    ]
    out_shape: list[Dim] | str = "reference" if None in out_axes else out_axes  # type: ignore[assignment]
    return Analysis(sizes, runs_dims, runs, names, shapes, weights, init, init_dims, out_shape)


def _axes(shapes: list[Any], runs_dims: list[dict[str, int]], what: str) -> list[Dim]:
    out = []
    for j in range(len(shapes[0])):
        seen = [int(s[j]) for s in shapes]
        axis = fit(seen, runs_dims)
        if axis is None:
            raise _Unfit(f"{what}'s axis {j} ({seen} at the sizes tried)")
        out.append(axis)
    return out


def _named(a: Analysis) -> set[str]:
    """The dims some input or weight axis names (a call's dims are read back from them)."""
    exprs = [e for s in [*a.shapes, *a.weights.values()] for e in s if isinstance(e, str)]
    return {
        n.id for e in exprs for n in ast.walk(ast.parse(e, mode="eval")) if isinstance(n, ast.Name)
    }


def analyse(path: Path, source: str, model_cls: Any, names: list[str], train: bool) -> Analysis:
    """The sizes of the file: every candidate constant varying if the Model takes it, else
    with equal constants tied, else with the constructor's constants fixed (then released one
    by one where the Model allows), else one more constant fixed; a dim no input or weight
    shows is fixed too (a call's dims are read back from its tensors)."""
    consts = size_constants(source)
    init_fed = constructor_constants(source)
    tried: dict[tuple[frozenset[str], bool], Analysis | str] = {}

    def attempt(fixed: set[str], tie: bool) -> Analysis | None:
        key = (frozenset(fixed), tie)
        if key not in tried:
            sizes = Sizes.of(consts, fixed=fixed, tie=tie, init_fed=init_fed)
            try:
                a = _analyse(path, model_cls, sizes, names, train)
                unseen = set(sizes.dims) - _named(a)
                if unseen:  # fix the constants behind dims nothing shows
                    more = {c for c, m in sizes.constants.items()
                            if set(m if isinstance(m, list) else [m]) & unseen}  # fmt: skip
                    got = attempt(fixed | more, tie)
                    tried[key] = got if got is not None else "unseen dims"
                else:
                    tried[key] = a
            except _Unfit as exc:
                tried[key] = str(exc)
        found = tried[key]
        return found if isinstance(found, Analysis) else None

    for tie in (False, True):
        if (a := attempt(set(), tie)) is not None:
            return a
    init_c = {c for c in consts if c in init_fed}
    for extra in [set(), *({c} for c in consts if c not in init_fed)]:
        for tie in (False, True):
            fixed = init_c | extra
            if (a := attempt(fixed, tie)) is None:
                continue
            for c in sorted(init_c):  # release what the Model allows
                if (b := attempt(fixed - {c}, tie)) is not None:
                    fixed, a = fixed - {c}, b
            return a
    reasons = sorted({v for v in tried.values() if isinstance(v, str)})
    raise Refused(
        f"its sizes cannot vary apart from the file's values ({'; '.join(reasons)[:300]})"
    )


__all__ = [
    "Analysis",
    "Refused",
    "Seen",
    "Sizes",
    "analyse",
    "build",
    "constructor",
    "constructor_constants",
    "fit",
    "forward",
    "see",
    "size_constants",
    "user_error",
]
