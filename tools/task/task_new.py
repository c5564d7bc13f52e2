"""`harnesslab task new NAME --reference FILE.py:FN`: a plan for a declared kernel task from a
PyTorch reference function, its inputs given by flags (--input, --dims, --scalar) or inferred
from an example call (--example), optionally the user's existing kernel as the baseline.

Host side, trusted: it imports the user's reference, as the user asked.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .declaration import INPUT_DTYPES
from .scaffold import (
    DEFAULT_SPACE,
    DISTINCT_SIZES,
    InputSpec,
    TaskPlan,
    call_reference,
    draw_example,
    infer_inputs,
    load_user_module,
    output_shape,
    signature_names,
    split_ref,
)


def parse_input_flag(text: str) -> InputSpec:
    """`NAME:DIM,DIM[:DTYPE]`, e.g. `x:rows,dim`, `weight:dim`, `idx:rows:int64`."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0].isidentifier():
        raise UsageError(
            f"--input {text!r} is not NAME:DIM,DIM[:DTYPE].", next_step="e.g. --input x:rows,dim"
        )
    shape: list[int | str] = [
        int(d) if d.strip().isdigit() else d.strip() for d in parts[1].split(",")
    ]
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
) -> TaskPlan:
    """A plan from `task new`'s flags: inputs given (--input, --dims) or inferred from an
    example call (--example FILE.py:FN returning the positional arguments)."""
    ref_file, ref_name = split_ref(reference, "--reference")
    fn = getattr(load_user_module(ref_file, "ref"), ref_name, None)
    if not callable(fn):
        raise UsageError(
            f"{ref_file} defines no function {ref_name}.", next_step="check --reference"
        )
    kw = parse_assignments(list(scalars), "--scalar")
    if example:
        ex_file, ex_name = split_ref(example, "--example")
        got = getattr(load_user_module(ex_file, "example"), ex_name)()
        args, ex_kw = got if len(got) == 2 and isinstance(got[1], dict) else (got, {})
        kw = {**ex_kw, **kw}
        names = signature_names(fn) or [f"x{i}" for i in range(len(args))]
        decls, dim_sizes = infer_inputs(list(zip(names, args, strict=False)), {})
        example_args = list(args)
    else:
        if not inputs:
            raise UsageError(
                "no inputs declared.",
                next_step="add --input NAME:DIM,DIM for each tensor and --dims DIM=SIZE, or "
                "--example FILE.py:FN returning example arguments",
            )
        decls = [parse_input_flag(t) for t in inputs]
        dim_sizes = {k: int(v) for k, v in parse_assignments(list(dims), "--dims").items()}
        example_args = draw_example(decls, dim_sizes)
        # The output's axes are told apart at distinct small sizes (rows=dim=4096 would make
        # them ambiguous); an op that needs related sizes falls back to the dev sizes.
        distinct = dict(zip(dim_sizes, DISTINCT_SIZES, strict=False))
        if len(distinct) == len(dim_sizes):
            try:
                out = call_reference(fn, draw_example(decls, distinct), kw)
                shape = output_shape(tuple(out.shape), distinct)
                call_reference(fn, example_args, kw)  # and it runs at the dev sizes
                return _plan(name, fn, ref_file, ref_name, decls, kw, out, shape, dim_sizes,
                             dtypes, knobs, ranges, kernel)  # fmt: skip
            except UsageError:
                raise
            except Exception:  # the user's op refused these sizes: the dev sizes then
                pass
    out = call_reference(fn, example_args, kw)
    return _plan(name, fn, ref_file, ref_name, decls, kw, out,
                 output_shape(tuple(out.shape), dim_sizes), dim_sizes, dtypes, knobs, ranges,
                 kernel)  # fmt: skip


def _plan(
    name: str,
    fn: Callable[..., Any],
    ref_file: Path,
    ref_name: str,
    decls: list[InputSpec],
    kw: dict[str, Any],
    out: Any,
    out_shape: list[int | str],
    dim_sizes: dict[str, int],
    dtypes: list[str] | None,
    knobs: Sequence[str],
    ranges: Sequence[str],
    kernel: str | None,
) -> TaskPlan:
    space = dict(DEFAULT_SPACE)
    if knobs:
        space = {k: v if isinstance(v, list) else [v] for k, v in _knobs(list(knobs)).items()}
    hidden: dict[str, tuple[int, int]] = {}
    for key, value in parse_assignments(list(ranges), "--range").items():
        lo, sep, hi = str(value).partition(":")
        if key not in dim_sizes or not sep or not (lo.isdigit() and hi.isdigit()):
            raise UsageError(
                f"--range {key}={value}: expected DIM=MIN:MAX for one of "
                f"{', '.join(dim_sizes) or 'no dims'}.",
                next_step="e.g. --range rows=64:16384",
            )
        hidden[key] = (int(lo), int(hi))
    entry_fn = ref_name
    kernel_file = None
    if kernel:
        kernel_file, entry_fn = split_ref(kernel, "--kernel")
        if not kernel_file.is_file():
            raise UsageError(f"{kernel_file} does not exist.", next_step="check --kernel")
    return TaskPlan(
        name=name,
        summary=(inspect.getdoc(fn) or f"{ref_name} from {ref_file.name}").splitlines()[0],
        reference_file=ref_file,
        reference_name=ref_name,
        inputs=decls,
        scalars=kw,
        output_shape=out_shape,
        output_dtype="case" if out.is_floating_point() else str(out.dtype).removeprefix("torch."),
        dims=dim_sizes,
        ranges=hidden,
        dtypes=dtypes or ["float16", "float32"],
        space=space,
        entry_function=entry_fn,
        kernel_file=kernel_file,
    )


def _knobs(items: list[str]) -> dict[str, Any]:
    """`--knob block_size=64,128,256` (one knob per flag)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(
                f"--knob {item!r} is not NAME=V1,V2.", next_step="e.g. --knob num_warps=1,2,4"
            )
        out[key] = [
            json.loads(v) if v.strip().lstrip("-").isdigit() else v for v in values.split(",")
        ]
    return out


__all__ = ["parse_assignments", "parse_input_flag", "plan_new"]
