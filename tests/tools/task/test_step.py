"""A step task's `[step]` table (tools/task/step.py): the model's sizes on a GPU and in the
interpreter, and the dev traces, refused where task.toml is parsed when no trace could be built
at either size; each trace's parameters at one size (the interpreter's overrides applied) and
the runner's request; the shipped decode_step's traces build at both sizes with
tools/gpu/step_trace.py."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import ValidationError

from harnesslab.tools.errors import UsageError
from harnesslab.tools.gpu import step_trace
from harnesslab.tools.gpu.runner import load_module
from harnesslab.tools.task.spec import load_task, parse_task
from harnesslab.tools.task.step import StepModel, StepSpec, StepTrace

STEP_TOML = textwrap.dedent(
    """
    name = "dec"
    summary = "s"
    kind = "step"
    entry = "kernel.py:step"
    editable = ["kernel.py"]
    dtypes = ["float16"]
    [tolerances.float16]
    atol = 0.02
    rtol = 0.01
    [step]
    model = { hidden = 256, heads = 4, kv_heads = 2, layers = 2, max_seq = 128, batch = 2, vocab = 64 }
    interpreter = { hidden = 64, heads = 4, kv_heads = 2, layers = 2, max_seq = 64, batch = 2, vocab = 64 }
    [[step.traces]]
    name = "fixed"
    dtype = "float16"
    kind = "fixed"
    length = 100
    steps = 8
    interpreter = { length = 20, steps = 4 }
    """
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("length = 100", "length = 125"), "length \\+ steps is past max_seq 128"),
        (("length = 20,", "length = 61,"), "\\(interpreter\\): length \\+ steps is past max_seq"),
        (("steps = 4 }", "steps = 4, vocab = 3 }"), "interpreter may set length"),
        (
            (
                "heads = 4, kv_heads = 2, layers = 2, max_seq = 128",
                "heads = 3, kv_heads = 3, layers = 2, max_seq = 128",
            ),
            "must split into 3 heads",
        ),
        (('dtype = "float16"\nkind', 'dtype = "bfloat16"\nkind'), "not one of the task's dtypes"),
        (("[step]", None), "need a \\[step\\] table"),  # the table and all after it cut
    ],
)
def test_a_step_table_that_no_trace_can_be_built_from_is_refused_where_it_is_parsed(
    tmp_path, change, message
):
    parse_task(STEP_TOML, tmp_path)  # the table as written is valid
    old, new = change
    assert old in STEP_TOML
    text = STEP_TOML[: STEP_TOML.index(old)] if new is None else STEP_TOML.replace(old, new)
    with pytest.raises(UsageError, match=message):
        parse_task(text, tmp_path)


DYNAMIC = """
[[step.traces]]
name = "dyn"
dtype = "float16"
kind = "dynamic"
buckets = [32, 64, 128]
steps_per_segment = 8
segments_per_bucket = 2
interpreter = { buckets = [16, 32, 64], steps_per_segment = 4, segments_per_bucket = 1 }
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("buckets = [32, 64, 128]", "buckets = [32, 64, 256]"), "must ascend up to max_seq 128"),
        (("buckets = [32, 64, 128]", "buckets = [64, 32, 128]"), "must ascend up to max_seq 128"),
        (("buckets = [32, 64, 128]", "buckets = [32, 32, 128]"), "must ascend up to max_seq 128"),
        (("buckets = [32, 64, 128]", "buckets = [0, 64, 128]"), "must ascend up to max_seq 128"),
        (("buckets = [32, 64, 128]", "buckets = [32, 36, 128]"), "at least 8 steps wide"),
        (("steps_per_segment = 4,", "steps_per_segment = 17,"), "\\(interpreter\\): every bucket"),
        (("segments_per_bucket = 2\n", "\n"), "needs buckets, steps_per_segment and segments"),
        (('name = "dyn"', 'name = "fixed"'), "names must differ"),
    ],
)
def test_a_dynamic_trace_needs_ascending_buckets_each_wide_enough_for_a_segment(
    tmp_path, change, message
):
    text = STEP_TOML + DYNAMIC
    parse_task(text, tmp_path)
    old, new = change
    assert old in text
    with pytest.raises(UsageError, match=message):
        parse_task(text.replace(old, new, 1), tmp_path)


def test_a_bucket_as_wide_as_a_segment_and_a_fixed_trace_that_just_fits_are_valid(tmp_path):
    text = (STEP_TOML + DYNAMIC).replace("buckets = [32, 64, 128]", "buckets = [8, 16, 128]")
    parse_task(text.replace("length = 100", "length = 120"), tmp_path)  # 120 + 8 = max_seq


def test_a_fixed_trace_with_buckets_past_max_seq_is_refused(tmp_path):
    text = STEP_TOML.replace("steps = 8\n", "steps = 8\nbuckets = [64, 256]\n")
    with pytest.raises(UsageError, match="must ascend up to max_seq 128"):
        parse_task(text, tmp_path)


def test_a_traces_parameters_take_the_interpreters_overrides_only_when_interpreting(tmp_path):
    step = parse_task(STEP_TOML + DYNAMIC, tmp_path).step
    assert step is not None
    dyn = step.trace("dyn")
    assert dyn.params(False)["buckets"] == [32, 64, 128] and dyn.params(False)["seed"] == 0
    assert (
        dyn.params(True)["buckets"] == [16, 32, 64] and dyn.params(True)["steps_per_segment"] == 4
    )
    assert "interpreter" not in dyn.params(True)
    request = step.request(["dyn"])
    assert request["model"]["max_seq"] == 128 and request["interpreter"]["max_seq"] == 64
    assert [t["name"] for t in request["traces"]] == ["dyn"]
    assert [t["name"] for t in step.request()["traces"]] == ["fixed", "dyn"]
    with pytest.raises(KeyError):
        step.request(["nope"])


@pytest.mark.parametrize("interpret", [False, True], ids=["gpu", "interpreter"])
def test_every_shipped_trace_builds_at_both_sizes_and_each_step_falls_in_a_bucket(interpret):
    task = load_task("decode_step")
    ref = load_module(task.reference_path, "decode_step_reference_test_step")
    assert task.step is not None
    sizes = task.step.interpreter if interpret else task.step.model
    for trace in task.step.traces:
        config = ref.Config(**sizes.model_dump(), dtype=trace.dtype)
        built = step_trace.build(config, trace.params(interpret))
        lengths = [0] * config.batch
        for segment in built["segments"]:
            lengths = [
                n if new is None else new
                for n, new in zip(lengths, segment["lengths"], strict=True)
            ]
            for _ in segment["tokens"]:
                step_trace.bucket_of(max(lengths) + 1, built["buckets"])  # raises past the last
                lengths = [n + 1 for n in lengths]
        assert max(lengths) <= config.max_seq


BASE = {"hidden": 64, "heads": 4, "kv_heads": 2, "layers": 2, "max_seq": 64, "batch": 4, "vocab": 8}


@pytest.mark.parametrize(
    ("field", "ok", "bad"),
    [
        ("hidden", {"hidden": 2, "heads": 1, "kv_heads": 1}, {"hidden": 0}),
        ("heads", {"hidden": 2, "heads": 1, "kv_heads": 1}, {"heads": 0}),
        ("kv_heads", {"kv_heads": 1}, {"kv_heads": 0}),
        ("layers", {"layers": 1}, {"layers": 0}),
        ("max_seq", {"max_seq": 2}, {"max_seq": 1}),
        ("batch", {"batch": 1}, {"batch": 0}),
        ("vocab", {"vocab": 1}, {"vocab": 0}),
        ("head_dim", {"hidden": 8, "heads": 4}, {"hidden": 12, "heads": 4}),  # 2 even, 3 odd
        ("kv split", {"heads": 4, "kv_heads": 4}, {"heads": 4, "kv_heads": 3}),
        ("heads split", {"hidden": 64, "heads": 8, "kv_heads": 2}, {"hidden": 64, "heads": 6}),
    ],
)
def test_model_sizes_are_positive_and_split_into_even_heads_and_whole_groups(field, ok, bad):
    StepModel.model_validate({**BASE, **ok})
    with pytest.raises(ValidationError):
        StepModel.model_validate({**BASE, **bad})
    with pytest.raises(ValidationError):
        StepModel.model_validate({**BASE, "depth": 3})  # an unknown size is a typo


@pytest.mark.parametrize(
    ("ok", "bad"),
    [
        ({"length": 0}, {"length": -1}),
        ({"steps": 1}, {"steps": 0}),
        ({"name": "a-b_9"}, {"name": "Fixed"}),
        ({"name": "a-b_9"}, {"name": "_x"}),
        ({"seed": 5}, {"colour": 1}),  # an unknown key is a typo
        ({}, {"length": None}),
        ({}, {"steps": None}),
    ],
)
def test_a_fixed_traces_fields_have_their_bounds(ok, bad):
    fixed = {"name": "f", "dtype": "float16", "kind": "fixed", "length": 4, "steps": 2}
    model = StepModel.model_validate(BASE)
    assert StepTrace.model_validate({**fixed, **ok}).problems(model, False) == []
    with pytest.raises((ValidationError, AssertionError)):
        assert StepTrace.model_validate({**fixed, **bad}).problems(model, False) == []


@pytest.mark.parametrize(
    ("ok", "bad"),
    [
        ({"steps_per_segment": 1, "buckets": [1, 2]}, {"steps_per_segment": 0}),
        ({"segments_per_bucket": 1}, {"segments_per_bucket": 0}),
        ({}, {"buckets": []}),
        ({}, {"steps_per_segment": None}),
        ({}, {"segments_per_bucket": None}),
        ({"buckets": [1, 64], "steps_per_segment": 1}, {"buckets": [0, 64]}),
    ],
)
def test_a_dynamic_traces_fields_have_their_bounds(ok, bad):
    dyn = {"name": "d", "dtype": "float16", "kind": "dynamic", "buckets": [8, 64],
           "steps_per_segment": 4, "segments_per_bucket": 2}  # fmt: skip
    model = StepModel.model_validate(BASE)
    assert StepTrace.model_validate({**dyn, **ok}).problems(model, False) == []
    with pytest.raises((ValidationError, AssertionError)):
        assert StepTrace.model_validate({**dyn, **bad}).problems(model, False) == []


def test_a_trace_without_interpreter_overrides_has_the_same_parameters_at_both_sizes():
    trace = StepTrace.model_validate(
        {"name": "f", "dtype": "float16", "kind": "fixed", "length": 4, "steps": 2}
    )
    assert trace.params(True) == trace.params(False) and trace.params(True)["length"] == 4


def test_a_step_table_needs_a_trace_and_knows_its_keys():
    sizes = {"model": BASE, "interpreter": BASE}
    with pytest.raises(ValidationError, match="at least 1"):
        StepSpec.model_validate({**sizes, "traces": []})
    trace = {"name": "f", "dtype": "float16", "kind": "fixed", "length": 4, "steps": 2}
    StepSpec.model_validate({**sizes, "traces": [trace]})
    with pytest.raises(ValidationError, match="Extra inputs"):
        StepSpec.model_validate({**sizes, "traces": [trace], "trace": []})


def test_a_traces_problem_names_the_trace_and_the_size_it_fails_at():
    model = StepModel.model_validate(BASE)
    fixed = StepTrace.model_validate({"name": "f", "dtype": "float16", "kind": "fixed", "steps": 2})
    assert fixed.problems(model, True) == [
        "step.traces 'f' (interpreter): a fixed trace needs length and steps"
    ]


def test_hidden_traces_are_drawn_from_the_secret_not_the_dev_seeds_and_build_at_both_sizes():
    step = load_task("decode_step").step
    assert step is not None
    drawn = step.hidden(1234)
    assert drawn == step.hidden(1234) and drawn != step.hidden(1235)  # same secret, same traces
    assert [t["name"] for t in drawn] == ["final0_float16", "final1_float16", "final2_bfloat16"]
    assert {t["seed"] for t in drawn}.isdisjoint({t.seed for t in step.traces})
    fixed = drawn[0]
    assert fixed["kind"] == "fixed" and fixed["steps"] == step.traces[0].steps
    lengths = {t["length"] for t in (step.hidden(s)[0] for s in range(20))}
    assert len(lengths) > 1 and max(lengths) + fixed["steps"] <= step.model.max_seq
    ref = load_module(load_task("decode_step").root / "reference.py", "_hl_ref_hidden_test")
    for interpret, sizes in ((False, step.model), (True, step.interpreter)):
        for t in drawn:
            params = {**t, **t["interpreter"]} if interpret else t
            config = ref.Config(**sizes.model_dump(), dtype=t["dtype"])
            assert step_trace.build(config, params)["segments"]
