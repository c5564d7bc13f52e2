"""The rules of `harnesslab task new` (tools/authoring/task_new.py), one at a time: how each flag
is read, what it refuses (a UsageError naming the flag, before the reference runs), and what the
plan says about the user's op (inputs, dtypes, output axes, knobs, the kernel's entry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnesslab.tools.authoring.scaffold import DEFAULT_SPACE
from harnesslab.tools.authoring.task_new import (
    MAX_DIM,
    MAX_ELEMENTS,
    REAL_RUN_ELEMENTS,
    parse_assignments,
    parse_dims,
    parse_input_flag,
    parse_ranges,
    plan_new,
)
from harnesslab.tools.errors import UsageError

ADD = 'def op(x, y):\n    """Adds two tensors.\n\n    More."""\n    return x + y\n'


def _ref(tmp_path: Path, text: str, name: str = "ref.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --input NAME:DIMS[:DTYPE]


def test_an_input_flag_reads_names_sizes_and_the_case_dtype() -> None:
    spec = parse_input_flag("x: rows , 3 ")
    assert (spec.name, spec.shape, spec.dtype) == ("x", ["rows", 3], "case")
    assert (spec.distribution, spec.high) == ("normal", 1.0)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_an_integer_input_is_drawn_as_small_integers(dtype) -> None:
    spec = parse_input_flag(f"idx:rows:{dtype}")
    assert (spec.dtype, spec.distribution, spec.high) == (dtype, "randint", 2.0)


def test_a_fixed_float_input_is_drawn_normal() -> None:
    spec = parse_input_flag("w:dim:float32")
    assert (spec.dtype, spec.distribution, spec.high) == ("float32", "normal", 1.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x", "is not NAME:DIM,DIM"),
        ("x:rows:float32:extra", "is not NAME:DIM,DIM"),
        ("2x:rows", "is not NAME:DIM,DIM"),
        ("x: ", "is not NAME:DIM,DIM"),
        ("x:rows,2d", "'2d' is neither"),
        ("x:rows,", "'' is neither"),
        ("x:rows:float8", "dtype 'float8'"),
    ],
)
def test_a_bad_input_flag_is_refused(text, message) -> None:
    with pytest.raises(UsageError, match=message) as err:
        parse_input_flag(text)
    assert "--input" in err.value.message


# NAME=VALUE, --dims, --range


def test_assignments_come_comma_separated_or_repeated_as_json_or_text() -> None:
    got = parse_assignments([" a=1, b=0.5,,", "c=true", "d=hello", "e=[1]"], "--scalar")
    assert got == {"a": 1, "b": 0.5, "c": True, "d": "hello", "e": [1]}


@pytest.mark.parametrize("item", ["a", "1a=2", "=3", "a b=1"])
def test_an_assignment_without_a_name_is_refused(item) -> None:
    with pytest.raises(UsageError, match=f"--knobby {item!r} is not NAME=VALUE"):
        parse_assignments([item], "--knobby")


def test_dims_are_positive_integers_up_to_what_a_gpu_can_index() -> None:
    assert parse_dims(["rows=1", f"dim={MAX_DIM}"]) == {"rows": 1, "dim": MAX_DIM}
    for bad in ["rows=0", "rows=-1", "rows=1.5", "rows=true", "rows=abc"]:
        with pytest.raises(UsageError, match="a size is a positive integer"):
            parse_dims([bad])
    with pytest.raises(UsageError, match="larger than any GPU case can index"):
        parse_dims([f"rows={MAX_DIM + 1}"])


def test_ranges_are_min_to_max_of_a_known_dim() -> None:
    dims = {"rows": 8, "dim": 4}
    got = parse_ranges(["rows=1:16384", f"dim=5:{MAX_DIM}"], dims)
    assert got == {"rows": (1, 16384), "dim": (5, MAX_DIM)}
    assert parse_ranges(["rows=7:7"], dims) == {"rows": (7, 7)}


@pytest.mark.parametrize(
    ("item", "message", "fix"),
    [
        ("cols=1:4", "expected DIM=MIN:MAX for one of rows, dim", "rows=64:16384"),
        ("rows=4", "expected DIM=MIN:MAX", "rows=64:16384"),
        ("rows=a:4", "expected DIM=MIN:MAX", "rows=64:16384"),
        ("rows=1:b", "expected DIM=MIN:MAX", "rows=64:16384"),
        ("rows=100:10", "MIN must be at least 1 and at most MAX", "--range rows=10:100"),
        ("rows=0:10", "MIN must be at least 1", "--range rows=1:10"),
        (f"rows=1:{MAX_DIM + 1}", "MIN must be at least 1", f"--range rows=1:{MAX_DIM + 1}"),
    ],
)
def test_a_bad_range_is_refused_with_its_fix(item, message, fix) -> None:
    with pytest.raises(UsageError, match=message) as err:
        parse_ranges([item], {"rows": 8, "dim": 4})
    assert fix in (err.value.next_step or "")


def test_a_range_with_no_dims_says_so() -> None:
    with pytest.raises(UsageError, match="for one of no dims"):
        parse_ranges(["rows=1:2"], {})


# plan_new: what it refuses before the reference runs


def test_dims_must_match_the_inputs_axes(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    with pytest.raises(UsageError, match="dim 'cols' has no size") as err:
        plan_new("t", ref, inputs=["x:rows", "y:cols"], dims=["rows=4"])
    assert err.value.next_step == "add --dims cols=SIZE"
    with pytest.raises(UsageError, match=r"has no size \(dims: none\)"):
        plan_new("t", ref, inputs=["x:rows", "y:rows"])
    with pytest.raises(UsageError, match="--dims cols: no --input has an axis named cols"):
        plan_new("t", ref, inputs=["x:rows", "y:rows"], dims=["rows=4,cols=2,zz=1"])


def test_an_input_may_have_at_most_max_elements(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    side = 2**17  # side * side == MAX_ELEMENTS
    assert side * side == MAX_ELEMENTS
    plan = plan_new("t", ref, inputs=["x:a,b", "y:a,b"], dims=[f"a={side},b={side}"])
    assert plan.output_shape == ["a", "b"]
    with pytest.raises(UsageError, match="--input x would have 3.44e\\+10 elements"):
        plan_new("t", ref, inputs=["x:a,b,2", "y:a"], dims=[f"a={side},b={side}"])
    with pytest.raises(UsageError, match="--input y would have"):
        plan_new("t", ref, inputs=["x:a", "y:a,b,2"], dims=[f"a={side},b={side}"])


def test_inputs_must_fit_the_references_signature(tmp_path) -> None:
    path = _ref(tmp_path, "def op(x, y, alpha=1.0, **kw):\n    return x\n", "kw.py")
    ref = _ref(tmp_path, "def op(x, y, alpha=1.0):\n    return x * alpha + y\n", "sig.py")
    with pytest.raises(UsageError, match="missing y") as err:
        plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"])
    assert "1 inputs given (x)" in err.value.message
    with pytest.raises(UsageError, match="3 inputs given .*alpha, which defaults to 1.0"):
        plan_new("t", f"{ref}:op", inputs=["x:n", "y:n", "z:n"], dims=["n=4"])
    with pytest.raises(UsageError, match="4 inputs given .*too many"):
        plan_new("t", f"{ref}:op", inputs=["x:n", "y:n", "z:n", "w:n"], dims=["n=4"])
    with pytest.raises(UsageError, match="--scalar beta: op takes no argument 'beta'"):
        plan_new("t", f"{ref}:op", inputs=["x:n", "y:n"], dims=["n=4"], scalars=["beta=2"])
    # a reference taking **kwargs accepts any scalar name
    plan = plan_new("t", f"{path}:op", inputs=["x:n", "y:n"], dims=["n=4"], scalars=["beta=2"])
    assert plan.scalars == {"beta": 2}
    # ... and a missing input of such a reference is named as missing, not as the scalar
    with pytest.raises(UsageError, match="missing y"):
        plan_new("t", f"{path}:op", inputs=["x:n"], dims=["n=4"], scalars=["beta=2"])


@pytest.mark.parametrize("default", ["1", "1.0", "'sum'"])
def test_an_input_may_not_take_a_scalars_place(tmp_path, default) -> None:
    ref = _ref(tmp_path, f"def op(x, w=None, k={default}):\n    return x\n")
    with pytest.raises(UsageError, match=f"argument k, which defaults to {default}"):
        plan_new("t", f"{ref}:op", inputs=["x:n", "w:n", "z:n"], dims=["n=4"])
    # an input may fill an argument that defaults to None (an optional tensor)
    plan = plan_new("t", f"{ref}:op", inputs=["x:n", "w:n"], dims=["n=4"], scalars=["k=2"])
    assert plan.scalars == {"k": 2}


def test_a_scalar_after_the_inputs_is_not_an_input(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x, y, alpha=1.0):\n    return x * alpha + y\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:n", "y:n"], dims=["n=4"], scalars=["alpha=2"])
    assert plan.scalars == {"alpha": 2} and plan.output_shape == ["n"]


def test_a_missing_argument_is_named_even_when_a_scalar_is_given(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x, y, alpha):\n    return x * alpha + y\n")
    with pytest.raises(UsageError, match="missing y$|missing y\\.") as err:
        plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"], scalars=["alpha=2"])
    assert "1 inputs given (x)" in err.value.message


def test_a_reference_without_a_signature_is_run_as_is(tmp_path) -> None:
    ref = _ref(tmp_path, "import torch\n\nop = torch.neg\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"])
    assert plan.output_shape == ["n"]


def test_the_reference_must_return_one_tensor(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x):\n    return 3\n")
    with pytest.raises(UsageError, match="returned int, not one tensor"):
        plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"])
    ref = _ref(tmp_path, "def op(x):\n    raise ValueError('boom\\nsecond line')\n", "raises.py")
    with pytest.raises(UsageError, match="raised ValueError: boom") as err:
        plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"])
    assert "second line" not in err.value.message and "at n=4" in err.value.message
    ref = _ref(tmp_path, "def op(x):\n    raise ValueError('a' * 400)\n", "long.py")
    with pytest.raises(UsageError) as err:
        plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"])
    assert f"raised ValueError: {'a' * 288} (called" in err.value.message  # 300 characters


def test_the_reference_runs_without_autograd(tmp_path) -> None:
    ref = _ref(tmp_path, "import torch\n\n\ndef op(x):\n"
                         "    assert not torch.is_grad_enabled()\n    return x\n")  # fmt: skip
    assert plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=4"]).output_shape == ["n"]


# plan_new: what the plan says


def test_a_plan_names_its_inputs_dtypes_output_and_summary(tmp_path) -> None:
    ref = _ref(tmp_path, ADD)
    plan = plan_new("add-2", f"{ref}:op", inputs=["x:rows,dim", "y:dim"],
                    dims=["rows=8", "dim=8"], ranges=["rows=1:64"],
                    bytes_formula="4*rows*dim", flops_formula="rows*dim")  # fmt: skip
    assert (plan.bytes_formula, plan.flops_formula) == ("4*rows*dim", "rows*dim")
    assert plan.name == "add-2" and plan.summary == "Adds two tensors."
    assert plan.dtypes == ["float16", "float32"]
    assert plan.output_shape == ["rows", "dim"] and plan.output_dtype == "case"
    assert plan.dims == {"rows": 8, "dim": 8} and plan.ranges == {"rows": (1, 64)}
    assert plan.space == DEFAULT_SPACE and plan.kernel_file is None
    assert (plan.reference_file, plan.reference_name, plan.entry_function) == (ref, "op", "op")
    assert plan.inputs[1].shape == ["dim"]
    undocumented = _ref(tmp_path, "def op(x):\n    return x\n", "plain.py")
    assert plan_new("t", f"{undocumented}:op", inputs=["x:n"], dims=["n=2"]).summary == (
        "op from plain.py"
    )


def test_an_integer_output_keeps_its_dtype(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x):\n    return x.argmax(-1)\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:rows,dim"], dims=["rows=4,dim=6"])
    assert plan.output_dtype == "int64" and plan.output_shape == ["rows"]


def test_dtypes_are_the_tasks_known_ones(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    plan = plan_new("t", ref, inputs=["x:n", "y:n"], dims=["n=4"], dtypes=["bfloat16"])
    assert plan.dtypes == ["bfloat16"]
    with pytest.raises(UsageError, match="--dtypes: 'float64' is not one of"):
        plan_new("t", ref, inputs=["x:n", "y:n"], dims=["n=4"], dtypes=["float32", "float64"])


@pytest.mark.parametrize("name", ["Op", "-op", "op task", "a" * 65, ""])
def test_a_task_name_is_lowercase_and_short(tmp_path, name) -> None:
    with pytest.raises(UsageError, match="task name"):
        plan_new(name, f"{_ref(tmp_path, ADD)}:op", inputs=["x:n", "y:n"], dims=["n=4"])


def test_knobs_are_one_per_flag_numbers_parsed(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    plan = plan_new("t", ref, inputs=["x:n", "y:n"], dims=["n=4"],
                    knobs=["block=64,128", "shift=-1,2", "order= row,col"])  # fmt: skip
    assert plan.space == {"block": [64, 128], "shift": [-1, 2], "order": [" row", "col"]}
    for bad in ["block", "2b=1", "block= "]:
        with pytest.raises(UsageError, match=f"--knob {bad!r} is not NAME=V1,V2"):
            plan_new("t", ref, inputs=["x:n", "y:n"], dims=["n=4"], knobs=[bad])


def test_inputs_are_named_once_and_declared(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    with pytest.raises(UsageError, match=r"names repeat \(x, x\)"):
        plan_new("t", ref, inputs=["x:n", "x:n"], dims=["n=4"])
    with pytest.raises(UsageError, match="no inputs declared"):
        plan_new("t", ref, dims=["n=4"])
    with pytest.raises(UsageError, match="defines no function nope"):
        plan_new("t", f"{tmp_path / 'ref.py'}:nope", inputs=["x:n"], dims=["n=4"])
    _ref(tmp_path, "op = 3\n", "notfn.py")
    with pytest.raises(UsageError, match="defines no function op"):
        plan_new("t", f"{tmp_path / 'notfn.py'}:op", inputs=["x:n"], dims=["n=4"])


# the output's axes


def test_output_axes_are_learned_at_distinct_sizes(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x):\n    return x.t().contiguous()\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:rows,dim"], dims=["rows=8,dim=8"])
    assert plan.output_shape == ["dim", "rows"]


def test_an_op_needing_related_sizes_is_learned_at_the_dev_sizes(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x, y):\n    return (x @ y)\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:m,k", "y:k2,n"], dims=["m=3,k=5,k2=5,n=4"])
    assert plan.output_shape == ["m", "n"]


def test_an_op_without_a_meta_kernel_runs_for_real_when_small(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x):\n    assert not x.is_meta\n    return x[:, :2] * 1\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:rows,dim"], dims=["rows=4,dim=9"])
    assert plan.output_shape == ["rows", 2]


def test_a_large_op_without_a_meta_kernel_trusts_the_small_run(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x):\n    assert not x.is_meta and x.numel() < 1 << 20\n"
                         "    return x.sum(-1)\n")  # fmt: skip
    plan = plan_new("t", f"{ref}:op", inputs=["x:rows,dim"], dims=["rows=2048,dim=4096"])
    assert plan.output_shape == ["rows"]
    # without a small run to fall back on, the dev-size failure is the user's answer
    both = _ref(tmp_path, "def op(x, y):\n    assert not x.is_meta and x.numel() < 1 << 20\n"
                          "    return x @ y\n", "mm.py")  # fmt: skip
    with pytest.raises(UsageError, match="raised AssertionError"):
        plan_new("t", f"{both}:op", inputs=["x:m,k", "y:k2,n"],
                 dims=["m=2048,k=4096,k2=4096,n=2"])  # fmt: skip


ROW_SCALE = "def op(x, y):\n    assert not x.is_meta\n    return x * y\n"


def test_an_op_without_a_meta_kernel_runs_for_real_up_to_real_run_elements(tmp_path) -> None:
    """No meta kernel, no small run (x's last axis must equal y's): the dev sizes run for real
    up to REAL_RUN_ELEMENTS input elements, and above that the meta failure is the answer."""
    ref = f"{_ref(tmp_path, ROW_SCALE)}:op"
    assert 4095 * 1024 + 1024 == REAL_RUN_ELEMENTS
    plan = plan_new("t", ref, inputs=["x:m,k", "y:k2"], dims=["m=4095,k=1024,k2=1024"])
    assert plan.output_shape == ["m", "k"]
    with pytest.raises(UsageError, match=r"raised AssertionError.*at m=4096"):
        plan_new("t", ref, inputs=["x:m,k", "y:k2"], dims=["m=4096,k=1024,k2=1024"])


def test_a_dev_run_that_disagrees_with_the_small_run_wins(tmp_path) -> None:
    # the output's length is fixed at 5 only when the input is large (meta at the dev sizes)
    ref = _ref(tmp_path, "def op(x):\n    return x[:5] * 1 if x.shape[0] > 100 else x * 1\n")
    plan = plan_new("t", f"{ref}:op", inputs=["x:n"], dims=["n=200"])
    assert plan.output_shape == [5]


# --example


EXAMPLE = "import torch\n\n\ndef make():\n    return {body}\n"


def test_an_example_call_gives_inputs_dims_and_scalars(tmp_path) -> None:
    ref = _ref(tmp_path, "def op(x, w, alpha=1.0):\n    return x * w * alpha\n")
    ex = _ref(tmp_path, EXAMPLE.format(body="(torch.ones(4, 6), torch.ones(6)), "
                                            "{'alpha': 2.0}"), "ex.py")  # fmt: skip
    plan = plan_new("t", f"{ref}:op", example=f"{ex}:make", scalars=["alpha=3"])
    assert [i.name for i in plan.inputs] == ["x", "w"]
    assert plan.scalars == {"alpha": 3}  # a --scalar wins over the example's keyword
    assert plan.output_shape == plan.inputs[0].shape and len(plan.output_shape) == 2
    plan = plan_new("t", f"{ref}:op", example=f"{ex}:make")
    assert plan.scalars == {"alpha": 2.0}
    assert plan.output_shape == plan.inputs[0].shape


def test_an_example_for_a_reference_without_a_signature_numbers_its_inputs(tmp_path) -> None:
    ref = _ref(tmp_path, "import torch\n\nop = torch.neg\n")
    ex = _ref(tmp_path, EXAMPLE.format(body="(torch.ones(3, 5),)"), "ex.py")
    plan = plan_new("t", f"{ref}:op", example=f"{ex}:make")
    assert [i.name for i in plan.inputs] == ["x0"] and len(plan.output_shape) == 2


def test_an_example_returning_a_list_is_its_arguments(tmp_path) -> None:
    ref = _ref(tmp_path, ADD)
    ex = _ref(tmp_path, EXAMPLE.format(body="[torch.ones(3), torch.ones(3)]"), "ex.py")
    plan = plan_new("t", f"{ref}:op", example=f"{ex}:make")
    assert [i.name for i in plan.inputs] == ["x", "y"] and plan.scalars == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("torch.ones(3)", "returned Tensor"),
        ("1 / 0", "raised ZeroDivisionError"),
        ("(torch.ones(3),)", "missing y"),
    ],
)
def test_a_bad_example_is_refused(tmp_path, body, message) -> None:
    ref = _ref(tmp_path, ADD)
    ex = _ref(tmp_path, EXAMPLE.format(body=body), "ex.py")
    with pytest.raises(UsageError, match=message):
        plan_new("t", f"{ref}:op", example=f"{ex}:make")


def test_an_example_is_a_function_and_excludes_inputs(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    ex = _ref(tmp_path, EXAMPLE.format(body="(torch.ones(3), torch.ones(3))"), "ex.py")
    with pytest.raises(UsageError, match="defines no function nope") as err:
        plan_new("t", ref, example=f"{ex}:nope")
    assert err.value.next_step == "check --example"
    for extra in ({"inputs": ["x:n"]}, {"dims": ["n=3"]}):
        with pytest.raises(UsageError, match="--example and --input/--dims both given"):
            plan_new("t", ref, example=f"{ex}:make", **extra)


# --kernel


def test_a_kernel_file_defines_its_entry(tmp_path) -> None:
    ref = f"{_ref(tmp_path, ADD)}:op"
    args = {"inputs": ["x:n", "y:n"], "dims": ["n=4"]}
    kernel = _ref(tmp_path, "import x\n\n\nclass K:\n    pass\n\n\ndef fast(a):\n    return a\n"
                            "\n\nalias = fast\nK.attr = 1\n", "kernel.py")  # fmt: skip
    for entry in ("fast", "K", "alias"):
        plan = plan_new("t", ref, kernel=f"{kernel}:{entry}", **args)
        assert (plan.kernel_file, plan.entry_function) == (kernel, entry)
    with pytest.raises(UsageError, match="defines no x"):
        plan_new("t", ref, kernel=f"{kernel}:x", **args)
    with pytest.raises(UsageError, match="does not exist"):
        plan_new("t", ref, kernel=f"{tmp_path / 'nope.py'}:fast", **args)
    bad = _ref(tmp_path, "def fast(:\n", "bad.py")
    with pytest.raises(UsageError, match=f"--kernel {bad}:1: "):
        plan_new("t", ref, kernel=f"{bad}:fast", **args)
