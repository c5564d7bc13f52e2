"""The rules of the task scaffolder (tools/authoring/scaffold.py) that `task new` and
`task import-kernelbench` share, one at a time: importing the user's file, FILE.py:NAME, the
declarations inferred from an example, the task.toml and task.md it writes (read back whole),
what stays of a failed write, the baseline check's record, and the generated baseline."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from harnesslab.tools.authoring.scaffold import (
    CHECK_FILE,
    DEFAULT_SPACE,
    DISTINCT_SIZES,
    InputSpec,
    TaskPlan,
    TaskRow,
    _default_range,
    _toml_value,
    baseline_source,
    draw_example,
    eval_dim,
    failed_check,
    infer_inputs,
    load_user_module,
    output_shape,
    record_check,
    render_brief,
    render_toml,
    signature_names,
    split_ref,
    write_task,
)
from harnesslab.tools.errors import UsageError

OP = "import torch\n\n\ndef scale(x, w, k=2.0):\n    return x * w * k\n"


def plan(tmp_path: Path, **over) -> TaskPlan:
    ref = tmp_path / "op.py"
    if not ref.exists():
        ref.write_text(OP)
    fields = {
        "name": "scale",
        "summary": "x times w",
        "reference_file": ref,
        "reference_name": "scale",
        "inputs": [
            InputSpec(name="x", shape=["n", 1]),
            InputSpec(name="w", shape=["n", 1], dtype="int32", distribution="randint", high=5),
        ],
        "scalars": {"k": 2.0},
        "output_shape": ["n", 1],
        "dims": {"n": 64},
        "dtypes": ["float16", "float32"],
        "entry_function": "scale_fast",
    }
    return TaskPlan(**{**fields, **over})


# -- the user's file ---------------------------------------------------------------------------


def test_the_users_file_is_imported_under_a_private_name_it_can_find_itself_by(tmp_path) -> None:
    # a dataclass looks its module up in sys.modules while the file runs
    src = "from dataclasses import dataclass\n\n@dataclass\nclass P:\n    a: int = 1\n\nP()\n"
    for i in range(200):  # a path whose hash is negative: the name still has no minus sign
        f = tmp_path / f"u{i}.py"
        if hash(str(f.resolve())) < 0:
            break
    f.write_text(src)
    mod = load_user_module(f, "ref")
    assert mod.__name__.startswith("_hl_user_ref_") and mod.__name__.isidentifier()
    assert sys.modules[mod.__name__] is mod and mod.P().a == 1
    (tmp_path / "other.py").write_text(src)
    assert load_user_module(tmp_path / "other.py", "ref").__name__ != mod.__name__


def test_a_missing_unimportable_or_failing_file_is_a_usage_error(tmp_path) -> None:
    with pytest.raises(UsageError, match="does not exist") as err:
        load_user_module(tmp_path / "none.py", "ref")
    assert "FILE.py:NAME" in err.value.next_step
    (tmp_path / "op.txt").write_text("x = 1\n")
    with pytest.raises(UsageError, match="cannot import"):
        load_user_module(tmp_path / "op.txt", "ref")
    (tmp_path / "bad.py").write_text("1 / 0\n")
    with pytest.raises(
        UsageError, match="importing .* failed: ZeroDivisionError: division by"
    ) as err:
        load_user_module(tmp_path / "bad.py", "ref")
    assert isinstance(err.value.__cause__, ZeroDivisionError)  # the user's traceback is kept


def test_a_reference_is_file_colon_name() -> None:
    assert split_ref("op.py:fused", "--reference") == (Path("op.py"), "fused")
    assert split_ref("c:/a:b.py:f", "--kernel") == (Path("c:/a:b.py"), "f")
    for bad in ("op.py", ":fused", "op.py:", "op.py:1x", "op.py:a-b"):
        with pytest.raises(UsageError, match=f"--kernel {bad!r} is not FILE.py:NAME") as err:
            split_ref(bad, "--kernel")
        assert err.value.next_step == "e.g. --kernel op.py:fused"


def test_signature_names_are_the_positional_parameters() -> None:
    def f(a, /, b, *args, c, d=1, **kw):
        return a

    assert signature_names(f) == ["a", "b"]
    assert signature_names(max) == [] and signature_names(42) == []  # type: ignore[arg-type]


# -- inference from an example -----------------------------------------------------------------


def test_inferred_axes_take_named_sizes_first_then_new_dims_per_distinct_size() -> None:
    named = [("a", torch.zeros(5, 6, 1)), ("b", torch.zeros(6, 7, 5))]
    decls, dims = infer_inputs(named, {"n": 5, "m": 5})
    assert [d.shape for d in decls] == [["n", "d0", 1], ["d0", "d1", "n"]]
    assert dims == {"n": 5, "d0": 6, "d1": 7}
    assert [(d.dtype, d.distribution) for d in decls] == [("case", "normal")] * 2
    _, only_new = infer_inputs([("a", torch.zeros(3, 1, 4))], {})
    assert only_new == {"d0": 3, "d1": 4}


def test_an_integer_example_keeps_its_dtype_drawn_in_its_value_range() -> None:
    t = torch.tensor([[3, 9], [4, 5]], dtype=torch.int64)
    (d,) = infer_inputs([("idx", t)], {})[0]
    assert (d.dtype, d.distribution, d.low, d.high, d.shape) == (
        "int64",
        "randint",
        3,
        10,
        ["d0"] * 2,
    )
    (e,) = infer_inputs([("idx", torch.zeros(0, dtype=torch.int32))], {})[0]
    assert (e.dtype, e.low, e.high, e.shape) == ("int32", 0, 2, ["d0"])


def test_an_example_argument_that_is_no_tensor_or_of_an_unknown_dtype_is_refused() -> None:
    with pytest.raises(UsageError, match="input k of the example is float, not a tensor") as err:
        infer_inputs([("k", 2.0)], {})
    assert "--scalar" in err.value.next_step
    with pytest.raises(UsageError, match="input q has dtype uint8"):
        infer_inputs([("q", torch.zeros(2, dtype=torch.uint8))], {})


def test_output_axes_are_the_first_dim_of_their_size_and_ones_stay_literal() -> None:
    assert output_shape((5, 1, 9, 5), {"n": 5, "m": 5, "one": 1}) == ["n", 1, 9, "n"]


def test_an_example_draw_is_seeded_at_the_given_dims() -> None:
    inputs = [
        InputSpec(name="x", shape=["n", 2]),
        InputSpec(name="i", shape=["n"], dtype="int64", distribution="randint", low=3, high=6),
    ]
    x, i = draw_example(inputs, {"n": 4000})
    assert x.shape == (4000, 2) and x.dtype == torch.float32 and x.std() > 0.9
    assert i.shape == (4000,) and set(i.tolist()) == {3, 4, 5}
    again = draw_example(inputs, {"n": 4000})
    assert torch.equal(x, again[0]) and torch.equal(i, again[1])


def test_a_dim_is_a_literal_or_a_known_name() -> None:
    assert eval_dim(3, {}) == 3 and eval_dim("n", {"n": 8}) == 8
    with pytest.raises(UsageError, match=r"unknown dim 'm' \(dims: n, k\)") as err:
        eval_dim("m", {"n": 8, "k": 2})
    assert "--dims" in err.value.next_step
    with pytest.raises(UsageError, match=r"\(dims: none\)"):
        eval_dim("m", {})


# -- task.toml ---------------------------------------------------------------------------------


def test_toml_values_are_written_by_type() -> None:
    assert [_toml_value(v) for v in (True, False, 3, 0.5, 'a"b')] == ["true", "false", "3", "0.5",
                                                                      '"a\\"b"']  # fmt: skip
    assert _toml_value((1, [2, "x"])) == '[1, [2, "x"]]'
    assert _toml_value({"a": 1, "b": {"c": False}}) == "{ a = 1, b = { c = false } }"
    with pytest.raises(TypeError, match="cannot write None"):
        _toml_value(None)


def test_hidden_sizes_range_from_half_to_twice_the_dev_size() -> None:
    assert [_default_range(v) for v in (1, 2, 3, 64)] == [(1, 2), (1, 4), (1, 6), (32, 128)]


def test_a_plain_task_toml_reads_back_whole(tmp_path) -> None:
    got = tomllib.loads(render_toml(plan(tmp_path), "kernel.py:scale_fast"))
    assert got == {
        "name": "scale", "summary": "x times w", "kind": "kernel", "entry": "kernel.py:scale_fast",
        "config_file": "kernel_config.json", "editable": ["kernel.py", "kernel_config.json"],
        "dtypes": ["float16", "float32"],
        "tolerances": {"float16": {"atol": 1e-3, "rtol": 1e-2}, "float32": {"atol": 1e-4, "rtol": 1e-3}},
        "space": {"num_warps": [1, 2, 4, 8], "block_size": [64, 128, 256, 512, 1024]},
        "dev_cases": [{"name": "64_float16", "dtype": "float16", "shape": {"n": 64}},
                      {"name": "64_float32", "dtype": "float32", "shape": {"n": 64}}],
        "final": {"count": 4, "dtypes": ["float16", "float32"], "ranges": {"n": {"min": 32, "max": 128}}},
        "declare": {
            "reference": "op.py:scale", "reference_kind": "function", "scalars": {"k": 2.0},
            "output": {"shape": ["n", 1], "dtype": "case"},
            "inputs": [{"name": "x", "shape": ["n", 1], "dtype": "case"},
                       {"name": "w", "shape": ["n", 1], "dtype": "int32", "distribution": "randint",
                        "low": 0.0, "high": 5.0}],
        },
    }  # fmt: skip


def test_every_optional_declaration_is_written_when_given(tmp_path) -> None:
    (tmp_path / "reference.py").write_text(OP)
    p = plan(
        tmp_path, reference_file=tmp_path / "reference.py", reference_name="Model",
        reference_kind="module", module_params=["w"], module_mode="eval",
        inputs=[InputSpec(name="x", shape=["n", "m"], mean=1.5, scale=0.5),
                InputSpec(name="y", shape=[3], mean=1.5)],
        inputs_from={"file": "reference.py", "function": "get_inputs"}, scalars={"eps": 1e-5},
        scalar_dims={"size": "n"}, init_order=["w"], interpreter={"n": 8}, bytes_formula="n*4",
        flops_formula="n", dims={"n": 64, "m": 3}, dtypes=["bfloat16"],
        tolerances={"bfloat16": {"atol": 0.5, "rtol": 0.25}}, ranges={"n": (16, 32)},
        output_shape="reference", output_dtype="float32", space={"num_warps": [4]},
    )  # fmt: skip
    got = tomllib.loads(render_toml(p, "kern.py:fast"))
    assert got["editable"] == ["kern.py", "kernel_config.json"]
    assert got["tolerances"] == {"bfloat16": {"atol": 0.5, "rtol": 0.25}}
    assert got["dev_cases"] == [
        {"name": "64x3_bfloat16", "dtype": "bfloat16", "shape": {"n": 64, "m": 3}}
    ]
    assert got["final"]["ranges"] == {"n": {"min": 16, "max": 32}, "m": {"min": 1, "max": 6}}
    assert got["declare"] == {
        "reference": "user_reference.py:Model", "reference_kind": "module", "module_params": ["w"],
        "module_mode": "eval", "inputs_from": {"file": "reference.py", "function": "get_inputs"},
        "scalars": {"eps": 1e-5}, "scalar_dims": {"size": "n"}, "init_order": ["w"],
        "interpreter": {"n": 8}, "bytes": "n*4", "flops": "n",
        "output": {"shape": "reference", "dtype": "float32"},
        "inputs": [{"name": "x", "shape": ["n", "m"], "dtype": "case", "mean": 1.5, "scale": 0.5},
                   {"name": "y", "shape": [3], "dtype": "case", "mean": 1.5, "scale": 1.0}],
    }  # fmt: skip
    bare = plan(tmp_path, dims={}, space={}, dtypes=["bfloat16"],
                inputs=[InputSpec(name="u", shape=[2], distribution="uniform")])  # fmt: skip
    no_dims = tomllib.loads(render_toml(bare, "k.py:f"))
    assert no_dims["dev_cases"][0]["name"] == "scalar_bfloat16" and no_dims["space"] == {}
    assert no_dims["tolerances"] == {"bfloat16": {"atol": 1e-2, "rtol": 2e-2}}
    assert no_dims["declare"]["inputs"] == [
        {
            "name": "u",
            "shape": [2],
            "dtype": "case",
            "distribution": "uniform",
            "low": 0.0,
            "high": 1.0,
        }
    ]


def test_task_toml_reads_as_a_person_would_write_it(tmp_path) -> None:
    """Every table after a blank line, and a newline at the end: the file is for editing."""
    p = plan(
        tmp_path,
        inputs=[InputSpec(name="x", shape=["n"], mean=2.0), InputSpec(name="y", shape=["n"])],
    )
    lines = render_toml(p, "kernel.py:f").split("\n")
    assert lines[-1] == "" and lines[-2] != ""
    assert all(lines[i - 1] == "" for i, line in enumerate(lines) if line.startswith("["))


def test_the_distinct_sizes_tell_axes_apart() -> None:
    """Distinct odd primes: the sum or double of two sizes is even and a product of two is over
    47, so an output axis of that size is never taken for a dim. Twelve of them: a task with
    more dims learns its output at the dev sizes."""
    assert len(set(DISTINCT_SIZES)) == len(DISTINCT_SIZES) == 12 and max(DISTINCT_SIZES) < 7 * 7
    assert all(n % 2 and all(n % d for d in range(2, n)) for n in DISTINCT_SIZES)


# -- task.md -----------------------------------------------------------------------------------


def test_the_brief_says_the_entry_inputs_scalars_output_and_shows_the_reference(tmp_path) -> None:
    p = plan(tmp_path, scalar_dims={"size": "n"}, brief="Mind the zeros.")
    assert (
        render_brief(p, "kernel.py:scale_fast", "x, w, k=2.0, size=n")
        == f"""# scale

x times w

Write a faster `kernel.py:scale_fast` (a plain function whose work runs in Triton kernels: the guarded
verify rejects PyTorch math outside them) that returns what the
reference below returns:

    scale_fast(x, w, k=2.0, size=n) -> torch.Tensor

| input | shape | dtype |
|---|---|---|
| `x` | ['n', 1] | the case dtype |
| `w` | ['n', 1] | int32 |

Keyword arguments (passed to the reference and to your function alike): k=2.0, size=n (the case's size).
The output has shape ['n', 1] and dtype
the case dtype. Dev dims: {{'n': 64}};
dtypes float16, float32. Hidden final cases draw other sizes of the same dims (see
`inspect_context`), so do not specialise on the dev sizes. Launch parameters go in
`kernel_config.json` (knobs: num_warps, block_size).
Mind the zeros.
Correctness: |out - ref| <= atol + rtol * |ref| per dtype, the reference computed in fp32 from
the same inputs; NaN/Inf always fails; do not modify the inputs.

## The reference (`op.py`)

```python
{OP.rstrip()}
```
"""
    )


def test_a_module_briefs_kernelbench_and_a_reference_shaped_output(tmp_path) -> None:
    p = plan(tmp_path, reference_kind="module", output_shape="reference", output_dtype="float32",
             scalars={}, space={})  # fmt: skip
    text = render_brief(p, "k.py:f", "x, w")
    assert "(a plain function, or a KernelBench `ModelNew` class (below) whose" in text
    assert "Keyword arguments (passed to the reference and to your function alike): none." in text
    assert (
        "shape the one the reference returns for the inputs (it depends on the sizes) and" in text
    )
    assert "dtype\nfloat32. Dev" in text and "(knobs: none)" in text


# -- writing the folder ------------------------------------------------------------------------


def test_a_written_task_loads_with_its_reference_baseline_and_middle_knobs(tmp_path) -> None:
    space = {"num_warps": [1, 2, 4, 8], "stages": [1, 2], "one": [7]}
    task = write_task(plan(tmp_path, space=space), tmp_path / "t")
    assert task.name == "scale" and task.entry == "kernel.py:scale_fast"
    out = tmp_path / "t"
    assert (out / "op.py").read_text() == OP
    assert json.loads((out / "workspace" / "kernel_config.json").read_text()) == {
        "num_warps": 4, "stages": 2, "one": 7}  # fmt: skip
    assert (out / "workspace" / "kernel_config.json").read_text() == (
        '{\n "num_warps": 4,\n "stages": 2,\n "one": 7\n}\n'  # one knob a line
    )
    assert (out / "task.toml").read_text() == render_toml(plan(tmp_path, space=space), task.entry)
    brief = (out / "task.md").read_text()
    assert "    scale_fast(x, w, k=2.0) -> torch.Tensor" in brief
    base = plan(tmp_path, scalar_dims={"size": "n"})
    write_task(base, tmp_path / "u")
    assert (
        "    scale_fast(x, w, k=2.0, size=n) -> torch.Tensor"
        in (tmp_path / "u" / "task.md").read_text()
    )
    assert (tmp_path / "u" / "workspace" / "kernel.py").read_text() == baseline_source(base)


def test_a_given_kernel_or_baseline_text_is_the_workspace(tmp_path) -> None:
    (tmp_path / "fast.py").write_text("def scale_fast(x, w, k=2.0):\n    return x * w * k\n")
    task = write_task(plan(tmp_path, kernel_file=tmp_path / "fast.py"), tmp_path / "t")
    assert (
        task.entry == "fast.py:scale_fast"
        and not (tmp_path / "t" / "workspace" / "kernel.py").exists()
    )
    assert (tmp_path / "t" / "workspace" / "fast.py").read_text().startswith("def scale_fast")
    write_task(plan(tmp_path, baseline="# mine\n"), tmp_path / "u")
    assert (tmp_path / "u" / "workspace" / "kernel.py").read_text() == "# mine\n"


def test_a_reference_named_reference_py_is_copied_as_user_reference(tmp_path) -> None:
    (tmp_path / "reference.py").write_text(OP)
    p = plan(tmp_path, reference_file=tmp_path / "reference.py")
    assert (
        p.reference_in_task == "user_reference.py" and plan(tmp_path).reference_in_task == "op.py"
    )
    write_task(p, tmp_path / "t")
    assert (tmp_path / "t" / "user_reference.py").read_text() == OP
    assert not (tmp_path / "t" / "reference.py").exists()


def test_rewriting_a_task_in_place_keeps_its_reference_and_forgets_its_check(tmp_path) -> None:
    write_task(plan(tmp_path), tmp_path / "t")
    record_check(tmp_path / "t", "failed", ["x"])
    again = plan(tmp_path, reference_file=tmp_path / "t" / "op.py")
    write_task(again, tmp_path / "t", force=True)
    assert (tmp_path / "t" / "op.py").read_text() == OP and not (
        tmp_path / "t" / CHECK_FILE
    ).exists()


def test_a_bad_name_or_dtype_is_refused_before_anything_is_written(tmp_path) -> None:
    with pytest.raises(UsageError, match="task name 'Bad' must match") as err:
        write_task(plan(tmp_path, name="Bad"), tmp_path / "t")
    assert "lowercase" in err.value.next_step
    with pytest.raises(UsageError, match="dtype 'int8' is not one of float16, bfloat16, float32"):
        write_task(plan(tmp_path, dtypes=["float16", "int8"]), tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_a_folder_with_files_is_written_only_when_forced(tmp_path) -> None:
    out = tmp_path / "t"
    out.mkdir()
    (out / "notes").write_text("mine")
    with pytest.raises(UsageError, match="is not empty") as err:
        write_task(plan(tmp_path), out)
    assert "--force" in err.value.next_step and not (out / "task.toml").exists()
    write_task(plan(tmp_path), out, force=True)
    assert (out / "notes").read_text() == "mine" and (out / "task.toml").is_file()
    (tmp_path / "empty").mkdir()
    write_task(plan(tmp_path), tmp_path / "empty")  # an empty folder is no one's work
    assert (tmp_path / "empty" / "task.toml").is_file()


def test_nothing_of_a_failed_task_stays_but_an_old_folder_is_left_alone(tmp_path) -> None:
    bad = plan(tmp_path, inputs=[InputSpec(name="x", shape=["nope"])])  # load_task refuses it
    with pytest.raises(Exception, match="nope"):
        write_task(bad, tmp_path / "fresh" / "t")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="workspace"):  # its own error, not the cleanup's
        write_task(plan(tmp_path), tmp_path / "file" / "t")
    assert not (tmp_path / "fresh" / "t").exists() and (tmp_path / "fresh").is_dir()
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="nope"):
        write_task(bad, tmp_path / "empty")
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes").write_text("mine")
    with pytest.raises(Exception, match="nope"):
        write_task(bad, tmp_path / "old", force=True)
    assert (tmp_path / "old" / "notes").read_text() == "mine" and (
        tmp_path / "old" / "task.toml"
    ).exists()


# -- the baseline check's record, and the baseline ---------------------------------------------


def test_a_plan_defaults_to_a_function_with_no_keywords_and_the_default_knobs(tmp_path) -> None:
    p = TaskPlan(name="t", summary="", reference_file=tmp_path / "op.py", reference_name="f",
                 inputs=[], output_shape=[1], dims={}, dtypes=["float32"], entry_function="f")  # fmt: skip
    assert (p.reference_kind, p.scalars, p.scalar_dims, p.space) == (
        "function",
        {},
        {},
        DEFAULT_SPACE,
    )
    assert p.space is not DEFAULT_SPACE  # a plan's knobs are its own


def test_a_row_is_written_or_refused_with_nothing_else_said_by_default() -> None:
    row = TaskRow(file="op.py", task="op", status="refused", reason="no tensor")
    assert row.model_dump() == {"file": "op.py", "task": "op", "status": "refused", "folder": "",
                                "reason": "no tensor", "baseline": "", "failing": [], "seconds": 0.0}  # fmt: skip


def test_a_failed_check_says_why_with_at_most_three_reasons(tmp_path) -> None:
    record_check(tmp_path, "failed", ["a", "b", "c", "d"])
    assert failed_check(tmp_path) == "a; b; c"
    assert (tmp_path / CHECK_FILE).read_text() == json.dumps(
        {"baseline": "failed", "failing": ["a", "b", "c", "d"]}, indent=1) + "\n"  # fmt: skip
    record_check(tmp_path, "failed", [])
    assert failed_check(tmp_path) == "it failed"
    (tmp_path / CHECK_FILE).write_text('{"baseline": "failed"}')
    assert failed_check(tmp_path) == "it failed"


@pytest.mark.parametrize(
    "text", [None, "{not json", "[1]", '{"baseline": "passed", "failing": ["a"]}']
)
def test_a_passed_missing_or_unreadable_check_is_no_failure(tmp_path, text) -> None:
    if text is not None:
        (tmp_path / CHECK_FILE).write_text(text)
    assert failed_check(tmp_path) is None


def test_the_baseline_calls_the_reference_with_its_scalars_as_keywords(tmp_path) -> None:
    ns: dict = {}
    exec(baseline_source(plan(tmp_path, entry_function="scale")), ns)  # the entry shadows the ref
    x, w = torch.ones(3), torch.full((3,), 2.0)
    assert torch.equal(ns["scale"](x, w), x * w * 2.0) and torch.equal(
        ns["scale"](x, w, k=3.0), x * w * 3.0
    )
    with pytest.raises(TypeError):
        ns["scale"](x, w, 3.0)  # keyword-only, as the verify passes it
    src = baseline_source(plan(tmp_path, scalars={}))
    assert src.startswith(
        '"""Baseline: the reference itself, in PyTorch. Replace `scale_fast` with a '
    )
    assert "def scale_fast(x, w):\n    return _reference_scale(x, w)\n" in src
