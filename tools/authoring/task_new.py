"""`harnesslab task new NAME --reference FILE.py:FN`: a plan for a declared kernel task from a
PyTorch reference function, its inputs given by flags (--input, --dims, --scalar) or inferred
from an example call (--example), optionally the user's existing kernel as the baseline.

Every flag is checked before anything is written or allocated, and a mistake is a UsageError
that names the flag and the fix (never a traceback): inputs against the reference's signature,
dims as positive sizes that fit a GPU, hidden ranges as MIN <= MAX. The reference runs once at
small distinct sizes (to tell its output's axes apart) and on meta tensors at the dev sizes,
never on full-size inputs on the CPU.

Host side, trusted: it imports the user's reference, as the user asked.
"""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..task import DTYPES
from ..task.declaration import INPUT_DTYPES
from ..task.spec import NAME_RE
from .scaffold import (
    DEFAULT_SPACE,
    DISTINCT_SIZES,
    InputSpec,
    TaskPlan,
    draw_example,
    eval_dim,
    infer_inputs,
    load_user_module,
    output_shape,
    signature_names,
    split_ref,
)

# A dev size beyond these cannot be a GPU case (int32 indexing; more than any GPU's memory).
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**34
# Below this many input elements the reference also runs for real at the dev sizes.
REAL_RUN_ELEMENTS = 1 << 22


def parse_input_flag(text: str) -> InputSpec:
    """`NAME:DIM,DIM[:DTYPE]`, e.g. `x:rows,dim`, `weight:dim`, `idx:rows:int64`."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0].isidentifier() or not parts[1].strip():
        raise UsageError(
            f"--input {text!r} is not NAME:DIM,DIM[:DTYPE].", next_step="e.g. --input x:rows,dim"
        )
    shape: list[int | str] = []
    for d in (d.strip() for d in parts[1].split(",")):
        if d.isdigit():
            shape.append(int(d))
        elif d.isidentifier():
            shape.append(d)
        else:
            raise UsageError(
                f"--input {text!r}: {d!r} is neither a dim name nor a size.",
                next_step="name each axis (rows, dim) or give a literal size (e.g. 3)",
            )
    dtype = parts[2] if len(parts) == 3 else "case"
    if dtype not in INPUT_DTYPES:
        raise UsageError(
            f"--input {text!r}: dtype {dtype!r} is not one of {', '.join(INPUT_DTYPES)}.",
            next_step="use 'case' (the case dtype) or a fixed dtype",
        )
    integer = dtype.startswith("int") or dtype == "bool"
    return InputSpec(
        name=parts[0],
        shape=shape,
        dtype=dtype,
        distribution="randint" if integer else "normal",
        high=2.0 if integer else 1.0,
    )


def parse_assignments(items: list[str], flag: str) -> dict[str, Any]:
    """`NAME=VALUE` pairs (comma-separated or repeated); values parsed as JSON when they can be."""
    out: dict[str, Any] = {}
    for item in (x for text in items for x in text.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(
                f"{flag} {item!r} is not NAME=VALUE.", next_step=f"e.g. {flag} rows=64"
            )
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def parse_dims(items: Sequence[str]) -> dict[str, int]:
    """`--dims rows=4096,dim=512`: positive integer sizes that a GPU case can have."""
    out: dict[str, int] = {}
    for key, value in parse_assignments(list(items), "--dims").items():
        if type(value) is not int or value < 1:
            raise UsageError(
                f"--dims {key}={value}: a size is a positive integer.",
                next_step=f"e.g. --dims {key}=4096",
            )
        if value > MAX_DIM:
            raise UsageError(
                f"--dims {key}={value} is larger than any GPU case can index ({MAX_DIM}).",
                next_step="give the dev case's real size (hidden sizes come from --range)",
            )
        out[key] = value
    return out


def parse_ranges(items: Sequence[str], dims: dict[str, int]) -> dict[str, tuple[int, int]]:
    """`--range rows=64:16384`: the hidden final sizes of a dim, MIN <= MAX, both positive."""
    hidden: dict[str, tuple[int, int]] = {}
    for key, value in parse_assignments(list(items), "--range").items():
        lo, sep, hi = str(value).partition(":")
        if key not in dims or not sep or not (lo.isdigit() and hi.isdigit()):
            raise UsageError(
                f"--range {key}={value}: expected DIM=MIN:MAX for one of "
                f"{', '.join(dims) or 'no dims'}.",
                next_step="e.g. --range rows=64:16384",
            )
        low, high = int(lo), int(hi)
        if not 1 <= low <= high or high > MAX_DIM:
            raise UsageError(
                f"--range {key}={value}: MIN must be at least 1 and at most MAX.",
                next_step=f"e.g. --range {key}={max(1, min(low, high))}:{max(low, high, 1)}",
            )
        hidden[key] = (low, high)
    return hidden


def _check_dims(decls: list[InputSpec], dims: dict[str, int]) -> None:
    """Every named axis has a dev size, every size an axis, and no input outgrows a GPU."""
    used = {e for d in decls for e in d.shape if isinstance(e, str)}
    for d in decls:
        for e in d.shape:
            if isinstance(e, str) and e not in dims:
                raise UsageError(
                    f"--input {d.name}: dim {e!r} has no size (dims: {', '.join(dims) or 'none'}).",
                    next_step=f"add --dims {e}=SIZE",
                )
    unused = sorted(set(dims) - used)
    if unused:
        raise UsageError(
            f"--dims {unused[0]}: no --input has an axis named {unused[0]}.",
            next_step="drop it, or name an input's axis after it",
        )
    for d in decls:
        n = _numel(d, dims)
        if n > MAX_ELEMENTS:
            raise UsageError(
                f"--input {d.name} would have {n:.3g} elements at the dev sizes: more than fits "
                "a GPU.",
                next_step="give smaller --dims",
            )


def _numel(decl: InputSpec, dims: dict[str, int]) -> int:
    n = 1
    for e in decl.shape:
        n *= int(eval_dim(e, dims))
    return n


def _check_call(fn: Callable[..., Any], names: list[str], kw: dict[str, Any], ref: str) -> None:
    """The inputs and scalars fit the reference's signature (missing, extra, unknown)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = [p.name for p in sig.parameters.values()]
    try:
        bound = sig.bind(*names, **kw)
    except TypeError as exc:
        text = str(exc)
        unknown = [k for k in kw if k not in sig.parameters]
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            raise UsageError(
                f"--scalar {unknown[0]}: {ref} takes no argument {unknown[0]!r} "
                f"(it takes {', '.join(params)}).",
                next_step="check the name, or drop the --scalar",
            ) from exc
        if "missing" in text:
            missing = [p for p in params[len(names) :] if p not in kw]
            raise UsageError(
                f"--input: {ref} takes {', '.join(params)}; {len(names)} inputs given "
                f"({', '.join(names) or 'none'}), missing {', '.join(missing) or text}.",
                next_step="add an --input NAME:DIMS for each tensor argument (or --scalar "
                "NAME=VALUE for a number)",
            ) from exc
        raise UsageError(
            f"--input: {ref} takes {', '.join(params)}; {len(names)} inputs given "
            f"({', '.join(names)}): {text}.",
            next_step="give one --input per tensor argument, in call order",
        ) from exc
    for i, (param, value) in enumerate(bound.arguments.items()):
        default = sig.parameters[param].default
        if i < len(names) and isinstance(default, (int, float, bool, str)):
            raise UsageError(
                f"--input: {ref} takes {', '.join(params)}; {len(names)} inputs given "
                f"({', '.join(names)}): {value} would be its argument {param}, which "
                f"defaults to {default!r}, not a tensor.",
                next_step=f"drop that --input; pass a number with --scalar {param}=VALUE",
            )


def _run(fn: Callable[..., Any], args: list[Any], kw: dict[str, Any], ref: str, where: str) -> Any:
    """The reference on `args`: its exception, or a non-tensor result, as a UsageError."""
    import torch

    try:
        with torch.no_grad():
            out = fn(*args, **kw)
    except Exception as exc:  # the user's reference, whatever it raises
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        raise UsageError(
            f"the reference {ref} raised {text} (called on inputs {where}).",
            next_step="fix the reference, or the --input shapes and --dims it is called with",
        ) from exc
    if not isinstance(out, torch.Tensor):
        raise UsageError(
            f"the reference {ref} returned {type(out).__name__}, not one tensor.",
            next_step="make the reference return a single torch.Tensor",
        )
    return out


def _meta(inputs: list[InputSpec], dims: dict[str, int]) -> list[Any]:
    import torch

    out = []
    for i in inputs:
        shape = [int(eval_dim(e, dims)) for e in i.shape]
        dtype = torch.float32 if i.dtype == "case" else getattr(torch, i.dtype)
        out.append(torch.empty(shape, dtype=dtype, device="meta"))
    return out


def _shown(dims: dict[str, int]) -> str:
    return "at " + ", ".join(f"{k}={v}" for k, v in dims.items()) if dims else "as given"


def _output(fn: Callable[..., Any], decls: list[InputSpec], dims: dict[str, int],
            kw: dict[str, Any], ref: str) -> tuple[Any, list[int | str]]:  # fmt: skip
    """The reference's output and its axes as dims: learned at small distinct sizes (rows=dim
    would be ambiguous), then checked at the dev sizes on meta tensors (no memory), or for real
    when the dev inputs are small or the op has no meta kernel and the sizes allow it."""
    distinct = dict(zip(dims, DISTINCT_SIZES, strict=False))
    learned = None
    if len(distinct) == len(dims):
        try:
            out = _run(fn, draw_example(decls, distinct), kw, ref, _shown(distinct))
            learned = out, output_shape(tuple(out.shape), distinct)
        except UsageError:  # the op needs related sizes: learn at the dev sizes instead
            pass
    elements = sum(_numel(d, dims) for d in decls)
    try:
        dev = _run(fn, _meta(decls, dims), kw, ref, _shown(dims))
    except UsageError:
        if elements > REAL_RUN_ELEMENTS:
            if learned is not None:
                return learned  # no meta kernel and too large to run here: trust the small run
            raise
        dev = _run(fn, draw_example(decls, dims), kw, ref, _shown(dims))
    if learned is not None:
        want = [int(eval_dim(e, dims)) for e in learned[1]]
        if list(dev.shape) == want:
            return learned
    return dev, output_shape(tuple(dev.shape), dims)


def plan_new(
    name: str,
    reference: str,
    *,
    kernel: str | None = None,
    inputs: Sequence[str] = (),
    dims: Sequence[str] = (),
    scalars: Sequence[str] = (),
    example: str | None = None,
    dtypes: list[str] | None = None,
    knobs: Sequence[str] = (),
    ranges: Sequence[str] = (),
    bytes_formula: str = "",
    flops_formula: str = "",
) -> TaskPlan:
    """A plan from `task new`'s flags: inputs given (--input, --dims) or inferred from an
    example call (--example FILE.py:FN returning the positional arguments)."""
    if not NAME_RE.match(name):
        raise UsageError(
            f"task name {name!r} must match {NAME_RE.pattern}.",
            next_step="use lowercase letters, digits, _ and -",
        )
    dtypes = dtypes or ["float16", "float32"]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise UsageError(
            f"--dtypes: {bad[0]!r} is not one of {', '.join(DTYPES)}.", next_step="fix --dtypes"
        )
    space = _knobs(list(knobs)) if knobs else dict(DEFAULT_SPACE)
    ref_file, ref_name = split_ref(reference, "--reference")
    fn = getattr(load_user_module(ref_file, "ref"), ref_name, None)
    if not callable(fn):
        raise UsageError(
            f"{ref_file} defines no function {ref_name}.", next_step="check --reference"
        )
    kernel_file, entry_fn = _kernel(kernel, ref_name)
    kw = parse_assignments(list(scalars), "--scalar")
    if example:
        if inputs or dims:
            raise UsageError(
                "--example and --input/--dims both given.",
                next_step="use one: --example infers the inputs from an example call",
            )
        decls, dim_sizes, out = _from_example(fn, example, kw, ref_name)
        shape = output_shape(tuple(out.shape), dim_sizes)
    else:
        if not inputs:
            raise UsageError(
                "no inputs declared.",
                next_step="add --input NAME:DIM,DIM for each tensor and --dims DIM=SIZE, or "
                "--example FILE.py:FN returning example arguments",
            )
        decls = [parse_input_flag(t) for t in inputs]
        names = [d.name for d in decls]
        if len(set(names)) != len(names):
            raise UsageError(
                f"--input: names repeat ({', '.join(names)}).", next_step="name each input once"
            )
        dim_sizes = parse_dims(dims)
        _check_dims(decls, dim_sizes)
        _check_call(fn, names, kw, ref_name)
        out, shape = _output(fn, decls, dim_sizes, kw, ref_name)
    hidden = parse_ranges(ranges, dim_sizes)
    return TaskPlan(
        name=name,
        summary=(inspect.getdoc(fn) or f"{ref_name} from {ref_file.name}").splitlines()[0],
        reference_file=ref_file,
        reference_name=ref_name,
        inputs=decls,
        scalars=kw,
        output_shape=shape,
        output_dtype="case" if out.is_floating_point() else str(out.dtype).removeprefix("torch."),
        dims=dim_sizes,
        ranges=hidden,
        dtypes=dtypes,
        space=space,
        entry_function=entry_fn,
        kernel_file=kernel_file,
        bytes_formula=bytes_formula,
        flops_formula=flops_formula,
    )


def _from_example(
    fn: Callable[..., Any], example: str, kw: dict[str, Any], ref: str
) -> tuple[list[InputSpec], dict[str, int], Any]:
    ex_file, ex_name = split_ref(example, "--example")
    make = getattr(load_user_module(ex_file, "example"), ex_name, None)
    if not callable(make):
        raise UsageError(f"{ex_file} defines no function {ex_name}.", next_step="check --example")
    try:
        got = make()
    except Exception as exc:  # the user's example, whatever it raises
        raise UsageError(
            f"--example {example} raised {type(exc).__name__}: {exc}.", next_step="fix it"
        ) from exc
    if not isinstance(got, (tuple, list)):
        raise UsageError(
            f"--example {example} returned {type(got).__name__}.",
            next_step="return the positional arguments (a tuple), or (args, kwargs)",
        )
    args, ex_kw = got if len(got) == 2 and isinstance(got[1], dict) else (got, {})
    kw.update({k: v for k, v in ex_kw.items() if k not in kw})
    names = signature_names(fn) or [f"x{i}" for i in range(len(args))]
    decls, dim_sizes = infer_inputs(list(zip(names, args, strict=False)), {})
    _check_call(fn, [d.name for d in decls], kw, ref)
    return decls, dim_sizes, _run(fn, list(args), kw, ref, "from --example")


def _kernel(kernel: str | None, ref_name: str) -> tuple[Path | None, str]:
    """--kernel FILE.py:FN: the file exists and defines FN (read, not imported)."""
    if not kernel:
        return None, ref_name
    kernel_file, entry_fn = split_ref(kernel, "--kernel")
    if not kernel_file.is_file():
        raise UsageError(f"{kernel_file} does not exist.", next_step="check --kernel")
    try:
        tree = ast.parse(kernel_file.read_text(), str(kernel_file))
    except SyntaxError as exc:
        raise UsageError(
            f"--kernel {kernel_file}:{exc.lineno}: {exc.msg}.", next_step="fix the kernel file"
        ) from exc
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}  # fmt: skip
    if entry_fn not in defined:
        raise UsageError(
            f"--kernel: {kernel_file} defines no {entry_fn}.", next_step="check --kernel"
        )
    return kernel_file, entry_fn


def _knobs(items: list[str]) -> dict[str, list[Any]]:
    """`--knob block_size=64,128,256` (one knob per flag)."""
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.isidentifier() or not values.strip():
            raise UsageError(
                f"--knob {item!r} is not NAME=V1,V2.", next_step="e.g. --knob num_warps=1,2,4"
            )
        out[key] = [
            json.loads(v) if v.strip().lstrip("-").isdigit() else v for v in values.split(",")
        ]
    return out


__all__ = ["parse_assignments", "parse_dims", "parse_input_flag", "parse_ranges", "plan_new"]
