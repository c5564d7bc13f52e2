"""A declared task's checks (task/declaration.py): every field a declaration error can name,
each branch of each check, and the defaults the staged declaration.json carries. The model
alone, no task folder, no torch."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from harnesslab.tools.task import declaration
from harnesslab.tools.task.declaration import Declaration

DIMS = {"rows", "dim"}


def decl(**changes: Any) -> Declaration:
    data: dict[str, Any] = {
        "reference": "ref.py:f",
        "inputs": [{"name": "x", "shape": ["rows", "dim"]}, {"name": "w", "shape": ["dim"]}],
        "output": {"shape": ["rows", "dim"]},
    }
    data.update(changes)
    return Declaration.model_validate(data)


def problems(dims: set[str] = DIMS, **changes: Any) -> list[str]:
    return decl(**changes).problems(dims)


def test_a_valid_declaration_has_no_problems() -> None:
    assert problems() == []
    assert problems(bytes="rows*dim*dtype_bytes", flops="2*rows*dim") == []
    assert (
        problems(inputs=[{"name": "x", "shape": [0, "rows", "2*dim", "dim//2 + rows%3 - 1"]}]) == []
    )


def test_the_defaults_the_staged_declaration_carries() -> None:
    d = decl()
    x = d.inputs[0]
    assert (x.dtype, x.distribution, x.mean, x.scale, x.low, x.high) == (
        "case", "normal", 0.0, 1.0, 0.0, 1.0,
    )  # fmt: skip
    assert (d.reference_kind, d.seed, d.module_params, d.scalars) == ("function", 0, [], {})
    assert (d.bytes, d.flops, d.interpreter, d.interpreter_cap) == ("", "", {}, 64)
    assert d.output.dtype == "case"


@pytest.mark.parametrize(
    "changes",
    [
        {"inputs": []},
        {"interpreter_cap": 0},
        {"inputs": [{"name": "1x", "shape": ["rows"]}]},
        {"inputs": [{"name": "x-y", "shape": ["rows"]}]},
        {"inputs": [{"name": "x", "shape": ["rows"], "distribution": "cauchy"}]},
        {"inputs": [{"name": "x", "shape": ["rows"], "colour": "red"}]},
        {"output": {"shape": ["rows"], "strides": [1]}},
        {"reference_kind": "class"},
        {"surprise": 1},
    ],
    ids=[
        "no-inputs",
        "cap-0",
        "name-digit",
        "name-dash",
        "distribution",
        "input-extra",
        "output-extra",
        "reference-kind",
        "extra",
    ],
)
def test_the_model_refuses_what_it_cannot_hold(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        decl(**changes)


def test_an_input_name_may_start_with_an_underscore_and_the_cap_may_be_one() -> None:
    assert decl(inputs=[{"name": "_x1", "shape": ["rows"]}], interpreter_cap=1).problems(DIMS) == []


# -- the reference ---------------------------------------------------------------------------
@pytest.mark.parametrize("reference", ["ref.py", "ref.txt:f", "ref.py:1f", "ref.py:", ":f"])
def test_the_reference_must_be_file_py_colon_name(reference: str) -> None:
    assert problems(reference=reference) == [
        f"declare.reference: {reference!r} must be 'file.py:name'"
    ]


@pytest.mark.parametrize("reference", ["../ref.py:f", "sub/ref.py:f", "/abs/ref.py:f"])
def test_the_reference_must_be_a_file_of_the_task_folder_itself(reference: str) -> None:
    file_name = reference.partition(":")[0]
    assert problems(reference=reference) == [
        f"declare.reference: {file_name} must be a file of the task folder itself"
    ]


def test_a_kernelbench_model_reference_is_valid() -> None:
    assert problems(reference="level1.py:Model", reference_kind="module") == []


# -- dtypes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype", ["case", "float16", "bfloat16", "float32", "float64", "int32", "int64", "bool"]
)
def test_every_listed_dtype_is_accepted_for_inputs_and_the_output(dtype: str) -> None:
    inputs = [{"name": "x", "shape": ["rows"], "dtype": dtype}]
    assert problems(inputs=inputs, output={"shape": ["rows"], "dtype": dtype}) == []


def test_an_unknown_dtype_is_named_with_its_field() -> None:
    inputs = [{"name": "x", "shape": ["rows"]}, {"name": "y", "shape": ["rows"], "dtype": "float8"}]
    (problem,) = problems(inputs=inputs)
    assert problem.startswith("declare.inputs[1].dtype: 'float8' is not one of case, float16")
    (problem,) = problems(output={"shape": ["rows"], "dtype": "fp8"})
    assert problem.startswith("declare.output.dtype: 'fp8' is not one of case, float16")


# -- shapes and formulas ---------------------------------------------------------------------
def test_an_unknown_dim_is_named_with_its_field_and_the_known_dims() -> None:
    inputs = [{"name": "x", "shape": ["rows"]}, {"name": "y", "shape": ["rows", "cols"]}]
    assert problems(inputs=inputs) == [
        "declare.inputs[1].shape: unknown dim 'cols' (dims: dim, rows)"
    ]
    assert problems(output={"shape": ["2*cols"]}) == [
        "declare.output.shape: unknown dim 'cols' (dims: dim, rows)"
    ]
    assert decl(inputs=[{"name": "x", "shape": ["n"]}], output={"shape": [4]}).problems(set()) == [
        "declare.inputs[0].shape: unknown dim 'n' (dims: none)"
    ]


def test_a_negative_size_is_refused_and_zero_is_not() -> None:
    assert problems(output={"shape": [-1]}) == ["declare.output.shape: -1 is negative"]
    assert problems(inputs=[{"name": "x", "shape": [0, -3]}]) == [
        "declare.inputs[0].shape: -3 is negative"
    ]


def test_a_formula_that_does_not_parse_is_named() -> None:
    assert problems(output={"shape": ["rows*"]}) == [
        "declare.output.shape: 'rows*' is not an expression"
    ]
    for statement in ("import os", "rows; dim", "del rows"):
        assert problems(output={"shape": [statement]}) == [
            f"declare.output.shape: {statement!r} is not an expression"
        ]


@pytest.mark.parametrize("expr", ["rows(1)", "rows.real", "rows[0]", "dim.bit_length()"])
def test_calls_attributes_and_subscripts_are_refused_in_sizes(expr: str) -> None:
    (problem, *_) = problems(output={"shape": [expr]})
    assert problem == (
        f"declare.output.shape: {expr!r} may only use dims, numbers and + - * / // %"
    )


def test_formulas_know_dtype_bytes_only_for_bytes() -> None:
    assert problems(bytes="rows*dim*dtype_bytes") == []
    assert problems(flops="rows*dtype_bytes") == [
        "declare.flops: unknown dim 'dtype_bytes' (dims: dim, rows)"
    ]
    assert problems(output={"shape": ["dtype_bytes"]}) == [
        "declare.output.shape: unknown dim 'dtype_bytes' (dims: dim, rows)"
    ]
    assert problems(bytes="rows*cols") == ["declare.bytes: unknown dim 'cols' (dims: dim, rows)"]
    assert "declare.bytes: 'open(rows)' may only use dims, numbers and + - * / // %" in problems(
        bytes="open(rows)"
    )
    assert problems(flops="2*rows*") == ["declare.flops: '2*rows*' is not an expression"]


# -- inputs as a whole -----------------------------------------------------------------------
def test_input_names_must_not_repeat() -> None:
    inputs = [{"name": "x", "shape": ["rows"]}, {"name": "x", "shape": ["dim"]}]
    assert problems(inputs=inputs) == ["declare.inputs: names repeat (x, x)"]


def test_module_parameters_must_leave_at_least_one_input() -> None:
    assert problems(module_params=["w"]) == []  # two inputs, one parameter
    assert problems(module_params=["x", "w"]) == [
        "declare.module_params: more parameters than inputs"
    ]


def test_interpreter_sizes_may_only_name_dims() -> None:
    assert problems(interpreter={"rows": 8}) == []
    assert problems(interpreter={"rows": 8, "cols": 4}) == [
        "declare.interpreter: unknown dim 'cols' (dims: dim, rows)"
    ]


def test_every_problem_is_reported_not_only_the_first() -> None:
    found = problems(
        reference="ref.txt:f",
        inputs=[{"name": "x", "shape": ["cols"], "dtype": "fp8"}, {"name": "x", "shape": [-1]}],
        output={"shape": ["rows"], "dtype": "fp8"},
    )
    assert [p.split(":")[0] for p in found] == [
        "declare.reference",
        "declare.inputs[0].dtype",
        "declare.inputs[0].shape",
        "declare.inputs[1].shape",
        "declare.inputs",
        "declare.output.dtype",
    ]


# -- probes ----------------------------------------------------------------------------------
def test_a_declared_task_has_no_probes_of_its_own_but_the_generic_suites() -> None:
    # tools/gpu/declared.py runs on the GPU host without harnesslab: its edges and probes are
    # numerics.py's, like every task's; a list of its own would drift from the suite.
    staged = Path(declaration.__file__).parent.parent / "gpu" / "declared.py"
    names = {
        t.id
        for node in ast.parse(staged.read_text()).body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert not names & {"PROBES", "PROBE_KINDS", "PROBE_NOTES"}
    assert "BATCH_DIM" in names  # what the generic suite batches along
    assert not hasattr(declaration, "PROBE_KINDS")


# -- the folder ------------------------------------------------------------------------------
def test_the_folder_must_hold_the_reference_and_no_reference_py(tmp_path: Path) -> None:
    assert decl().folder_problems(tmp_path) == [
        f"declare.reference: ref.py is not a file of the task folder {tmp_path}"
    ]
    (tmp_path / "ref.py").mkdir()  # a folder is not a file
    assert len(decl().folder_problems(tmp_path)) == 1
    (tmp_path / "ref.py").rmdir()
    (tmp_path / "ref.py").write_text("def f(x, w): return x\n")
    assert decl().folder_problems(tmp_path) == []
    (tmp_path / "reference.py").write_text("")
    assert decl().folder_problems(tmp_path) == [
        "declare: a declared task has no reference.py (its reference is generated)"
    ]


# -- what is staged --------------------------------------------------------------------------
def test_the_staged_json_carries_the_declaration_the_reference_and_probe_dims() -> None:
    d = decl(reference="level1.py:Model", reference_kind="module", seed=7,
             module_params=["w"], scalars={"alpha": 0.5})  # fmt: skip
    staged = json.loads(d.staged_json({"rows": 3, "dim": 5}))
    assert staged["reference"] == {
        "entry": "level1.py:Model",
        "kind": "module",
        "seed": 7,
        "params": ["w"],
        "init": ["alpha"],  # the Model's constructor arguments, in order
        "mode": "train",  # a KernelBench Model as it is built: nn.Module's default
    }
    assert staged["probe_dims"] == {"rows": 3, "dim": 5}
    assert staged["inputs"][1] == {
        "name": "w", "shape": ["dim"], "dtype": "case", "distribution": "normal",
        "mean": 0.0, "scale": 1.0, "low": 0.0, "high": 1.0,
    }  # fmt: skip
    assert staged["scalars"] == {"alpha": 0.5} and staged["output"]["shape"] == ["rows", "dim"]


def test_the_constructor_order_is_init_order_when_given_else_scalars_then_size_scalars() -> None:
    d = decl(scalars={"alpha": 0.5}, scalar_dims={"features": "dim"})
    assert json.loads(d.staged_json({}))["reference"]["init"] == ["alpha", "features"]
    d = decl(scalars={"alpha": 0.5}, scalar_dims={"features": "dim"},
             init_order=["features", "alpha"])  # fmt: skip
    assert json.loads(d.staged_json({}))["reference"]["init"] == ["features", "alpha"]


# -- scalars, bounds, size scalars, inputs made by the reference file -----------------------
def test_scalars_keep_their_type() -> None:
    # Model(**scalars) gets them as written: True stays a bool, 3 an int, "mean" a string.
    scalars = {"flag": True, "k": 3, "eps": 1e-5, "mode": "mean", "shape": [2, True, "x", 0.5]}
    got = decl(scalars=scalars).scalars
    assert got == scalars
    assert [type(v) for v in got.values()] == [bool, int, float, str, list]
    assert [type(v) for v in got["shape"]] == [int, bool, str, float]


def test_an_inputs_bounds_may_be_numbers_or_formulas_over_dims() -> None:
    inputs = [{"name": "t", "shape": ["rows"], "distribution": "randint", "low": 0, "high": "dim"}]
    assert problems(inputs=inputs) == []
    inputs[0] |= {"low": "lo", "high": "dim*2"}
    assert problems(inputs=inputs) == ["declare.inputs[0].low: unknown dim 'lo' (dims: dim, rows)"]
    inputs[0] |= {"low": -4.5, "high": "hi(1)"}
    assert problems(inputs=inputs) == [
        "declare.inputs[0].high: 'hi(1)' may only use dims, numbers and + - * / // %",
        "declare.inputs[0].high: unknown dim 'hi' (dims: dim, rows)",
    ]


def test_size_scalars_are_formulas_over_dims_and_not_also_plain_scalars() -> None:
    assert problems(scalar_dims={"features": "dim", "kernel": ["rows", 3]}) == []
    assert problems(scalar_dims={"features": "cols", "kernel": ["rows", "k"]}) == [
        "declare.scalar_dims.features: unknown dim 'cols' (dims: dim, rows)",
        "declare.scalar_dims.kernel: unknown dim 'k' (dims: dim, rows)",
    ]
    assert problems(scalar_dims={"features": "dim"}, scalars={"features": 4, "other": 1}) == [
        "declare.scalar_dims.features: also in declare.scalars"
    ]


@pytest.mark.parametrize("call", ["gen.py:", "gen.py:1x", "../gen.py:get_inputs", "a/gen.py:f"])
def test_inputs_from_must_name_a_function_of_a_file_of_the_task_folder(call: str) -> None:
    assert problems(inputs_from={"call": call}) == [
        f"declare.inputs_from.call: {call!r} must be 'file.py:name' of the task folder"
    ]


def test_inputs_from_constants_are_dims_or_lists_of_them() -> None:
    inputs_from = {"call": "gen.py:get_inputs", "constants": {"N": "rows", "S": ["dim", 2]}}
    assert problems(inputs_from=inputs_from) == []
    inputs_from["constants"] = {"N": "n", "S": ["dim", "s"]}
    assert problems(inputs_from=inputs_from) == [
        "declare.inputs_from.constants.N: unknown dim 'n' (dims: dim, rows)",
        "declare.inputs_from.constants.S: unknown dim 's' (dims: dim, rows)",
    ]
    made = decl(inputs_from={"call": "gen.py:get_inputs"}).inputs_from
    assert made is not None and made.constants == {}
    with pytest.raises(ValidationError):
        decl(inputs_from={"call": "gen.py:get_inputs", "args": [1]})


def test_the_folder_must_hold_the_inputs_from_file(tmp_path: Path) -> None:
    (tmp_path / "ref.py").write_text("def f(x, w): return x\n")
    d = decl(inputs_from={"call": "gen.py:get_inputs"})
    assert d.folder_problems(tmp_path) == [
        "declare.inputs_from.call: gen.py is not a file of the task folder"
    ]
    (tmp_path / "get_inputs").write_text("")  # the function's name is not the file
    assert len(d.folder_problems(tmp_path)) == 1
    (tmp_path / "gen.py").write_text("def get_inputs(): return []\n")
    assert d.folder_problems(tmp_path) == []
