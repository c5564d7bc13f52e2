"""step_schema.validate's bounds, each at its limit: what sits exactly on it passes, one past it
is refused with its code and its words (the words are what the agent reads). Hand-made
recordings (a real one forged field by field: test_step_record.py); no torch."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from harnesslab.tools.gpu.verify import step_schema
from harnesslab.tools.gpu.verify.guard_schema import UNREPLAYABLE, Bad
from harnesslab.tools.task import load_task

OUT = {"t": "arena", "o": 0, "s": [4], "st": [1], "d": "float16"}
SIZE = "a tensor's size is not an integer in 0..2147483648"  # 1 << 31
STRIDE = "a tensor's stride is not an integer in 0..1099511627776"  # 1 << 40
OFFSET = "a storage offset is not an integer in 0..1099511627776"
# The largest tensor from host data kept by value, as the task tells the agent ("up to 64 KiB").
KIB = int(re.search(r"up to\s+(\d+)\s+KiB", load_task("decode_step").brief_path().read_text())[1])


def recording(*ops: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"ops": list(ops), "kernels": [], "unsupported": [], "output": dict(OUT), **fields}


def op(*args: Any, **fields: Any) -> dict[str, Any]:
    return {"op": "aten", "fn": "add.Tensor", "args": list(args), "kwargs": {}, "new": [],
            **fields}  # fmt: skip


def refused(rec: dict[str, Any], device: str = "cpu") -> Bad:
    with pytest.raises(Bad) as exc:
        step_schema.validate(rec, device, {})
    return exc.value


def forged(rec: dict[str, Any], words: str) -> None:
    exc = refused(rec)
    assert (exc.code, str(exc)) == ("forged_recording", words)


def passes_as_it_came(arg: Any) -> None:
    assert step_schema.validate(recording(op(arg)), "cpu", {})["ops"][0]["args"] == [arg]


def t(**fields: Any) -> dict[str, Any]:
    return {"t": "arena", "o": 0, "s": [2], "st": [1], "d": "float16", **fields}


# -- tensors of the step's storages -------------------------------------------------------------
@pytest.mark.parametrize(
    ("at", "past", "words"),
    [
        (t(s=[1 << 31]), t(s=[(1 << 31) + 1]), SIZE),
        (t(s=[0]), t(s=[-1]), SIZE),  # a size of 0: an empty view of a storage
        (t(st=[1 << 40]), t(st=[(1 << 40) + 1]), STRIDE),
        (t(o=1 << 40), t(o=(1 << 40) + 1), OFFSET),
        (t(s=[1] * 8, st=[1] * 8), t(s=[1] * 9, st=[1] * 9),
         "a tensor's shape and strides do not match"),
    ],
)  # fmt: skip
def test_a_tensor_of_the_steps_storages_is_bounded_at_each_limit(at, past, words: str) -> None:
    passes_as_it_came(at)
    forged(recording(op(past)), words)


def test_an_empty_tensor_is_bounded_and_reads_at_most_eight_sizes() -> None:
    passes_as_it_came({"empty": [0, 1 << 31], "d": "bool"})
    forged(recording(op({"empty": [0, (1 << 31) + 1], "d": "bool"})), SIZE)
    # a ninth size is never read: a zero there leaves no zero in the sizes the replay takes
    forged(
        recording(op({"empty": [1] * 8 + [0], "d": "bool"})), "an empty tensor with no zero size"
    )


# -- tensors kept by value ----------------------------------------------------------------------
def const(nbytes: int, shape: list[int], dtype: str = "uint8") -> dict[str, Any]:
    return {"const": base64.b64encode(bytes(nbytes)).decode(), "s": shape, "d": dtype}


def test_the_task_states_the_limit_its_refusal_names() -> None:
    assert KIB * 1024 == step_schema.CONST_BYTES
    assert f"over {KIB} KiB" in step_schema.STEP_UNREPLAYABLE["foreign_tensor"]


@pytest.mark.parametrize(("shape", "dtype"), [([2, KIB * 512], "uint8"), ([KIB * 256], "float32")])
def test_a_tensor_kept_by_value_holds_at_most_the_tasks_limit(shape, dtype: str) -> None:
    """Any shape: each size is within the limit here, their product is not past it."""
    passes_as_it_came(const(KIB * 1024, shape, dtype))
    past = [*shape[:-1], shape[-1] + 1]
    itemsize = 4 if dtype == "float32" else 1
    nbytes = KIB * 1024 + itemsize * (shape[0] if len(shape) == 2 else 1)
    forged(
        recording(op(const(nbytes, past, dtype))), "a tensor recorded by value has the wrong size"
    )


def test_a_tensor_kept_by_value_may_hold_no_elements() -> None:
    passes_as_it_came(const(0, [0, 3], "float16"))


def test_a_tensor_kept_by_value_reads_at_most_eight_sizes() -> None:
    forged(recording(op(const(2, [1] * 8 + [2]))), "a tensor recorded by value has the wrong size")


def test_a_tensor_kept_by_value_is_strict_base64() -> None:
    """A character outside the alphabet is refused, even where dropping it (as a lenient
    decoder does) would leave bytes of the right size."""
    raw = "AAAA!AAAA"
    assert len(base64.b64decode(raw)) == 6  # what a lenient decode makes of it
    forged(recording(op({"const": raw, "s": [6], "d": "uint8"})),
           "a tensor recorded by value is malformed")  # fmt: skip


def test_a_tensor_kept_by_value_is_refused_by_its_length_before_it_is_decoded(monkeypatch) -> None:
    """Bounded work on a hostile recording: a string longer than twice CONST_BYTES (no honest
    one comes near: base64 is 4/3 of the bytes) is never decoded."""
    decoded: list[int] = []
    decode = base64.b64decode

    def spy(raw: Any, validate: bool = False) -> bytes:
        decoded.append(len(raw))
        return decode(raw, validate=validate)

    monkeypatch.setattr(base64, "b64decode", spy)
    n = 2 * step_schema.CONST_BYTES
    forged(recording(op({"const": "A" * (n + 4), "s": [1], "d": "uint8"})),
           "a tensor recorded by value is malformed")  # fmt: skip
    assert decoded == []
    forged(recording(op({"const": "A" * n, "s": [1], "d": "uint8"})),
           "a tensor recorded by value has the wrong size")  # fmt: skip
    assert decoded == [n]


# -- other arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arg", "words"),
    [
        ({}, "an argument of no known kind"),
        ({"f": 5}, "a tensor's dtype is not one the replay knows"),  # a float is a hex string
        ({"x": 1}, "a tensor's dtype is not one the replay knows"),
    ],
)
def test_an_object_of_no_argument_kind_is_forged(arg: Any, words: str) -> None:
    forged(recording(op(arg)), words)


@pytest.mark.parametrize("fmt", ["contiguous_format", "preserve_format", "channels_last"])
def test_each_memory_format_torch_gives_a_dense_tensor_passes(fmt: str) -> None:
    passes_as_it_came({"memory_format": fmt})


# -- operator calls -----------------------------------------------------------------------------
def test_a_step_of_20000_operator_calls_passes_and_one_more_is_forged() -> None:
    """The cap the recorder stops at (step_record.py): a recording past it was not made by the
    recorder."""
    assert len(step_schema.validate(recording(*[op()] * 20000), "cpu", {})["ops"]) == 20000
    forged(recording(*[op()] * 20001), "bad operator list")


@pytest.mark.parametrize("ops", [None, 5, "ops"])
def test_an_operator_list_that_is_not_a_list_is_forged(ops: Any) -> None:
    forged(recording(ops=ops), "bad operator list")


@pytest.mark.parametrize("args", [5, "ab", None])
def test_arguments_that_are_not_a_list_are_forged(args: Any) -> None:
    forged(recording(op(args=args)), "an operator call's arguments are malformed")


def test_a_call_takes_at_most_32_keywords_each_named_in_at_most_64_characters() -> None:
    kwargs = {f"k{i}": i for i in range(31)} | {"n" * 65: 1}
    prog = step_schema.validate(recording(op(kwargs=kwargs)), "cpu", {})
    assert prog["ops"][0]["kwargs"] == {f"k{i}": i for i in range(31)} | {"n" * 64: 1}
    forged(recording(op(kwargs=kwargs | {"k31": 1})),
           "an operator call's arguments are malformed")  # fmt: skip


NEW = "a storage made by an operator is malformed"


def test_a_call_that_makes_no_storage_may_say_nothing_of_it() -> None:
    call = op()
    del call["new"]
    assert step_schema.validate(recording(call), "cpu", {})["ops"][0]["new"] == []


@pytest.mark.parametrize(
    "new",
    [[{"a": 0, "b": "v900"}], [[0, "v"]], [[0, "v1234567"]], [[0, "v900"], [1, "v900"]]],
    ids=["not a pair", "no number", "seven digits", "made twice"],
)
def test_a_storage_a_call_makes_is_a_fresh_name_v_and_up_to_six_digits(new) -> None:
    assert step_schema.validate(recording(op(new=[[0, "v123456"]])), "cpu", {})
    forged(recording(op(new=new)), NEW)


def test_one_storage_is_made_by_one_call() -> None:
    forged(recording(op(new=[[0, "v900"]]), op(new=[[0, "v900"]])), NEW)


@pytest.mark.parametrize(
    "output",
    [{"empty": [0], "d": "float16"}, {"const": "AAA=", "s": [1], "d": "float16"}],
)
def test_the_steps_result_is_a_tensor_of_its_storages(output) -> None:
    forged(recording(output=output), "the step's result is not a tensor of its storages")


def test_a_launch_in_a_cpu_recording_is_forged() -> None:
    launch = {"op": "launch", "kernel": "k0", "grid": [1, 1, 1], "params": []}
    forged(recording(launch), "a kernel launch in a recording on the CPU")


def test_a_launch_with_no_scratch_bytes_names_no_scratch_buffer() -> None:
    kernel = {"id": "k0_fn", "name": "fn", "cubin": "AAAA", "shared": 0, "num_warps": 4}
    launch = {"op": "launch", "kernel": "k0_fn", "grid": [1, 1, 1],
              "params": [{"k": "scratch", "which": "global", "nbytes": 0}]}  # fmt: skip
    prog = step_schema.validate(recording(launch, kernels=[kernel]), "cuda", {})
    assert prog["ops"][0]["scratch"] == {} and prog["ops"][0]["params"][0]["buf"] is None


# -- what the recorder could not record ---------------------------------------------------------
@pytest.mark.parametrize("unsupported", [None, [], [[1], {"a": 1}, 7, "unknown"]])
def test_nothing_the_harness_knows_unsupported_leaves_the_ops_to_check(unsupported) -> None:
    """Absent, empty, or only entries that name no code (of any JSON type): the recording is
    checked on its calls."""
    rec = recording(op())
    if unsupported is None:
        del rec["unsupported"]
    else:
        rec["unsupported"] = unsupported
    assert len(step_schema.validate(rec, "cpu", {})["ops"]) == 1


def test_foreign_memory_in_a_step_is_told_where_a_steps_memory_comes_from() -> None:
    """Not the kernel verify's words (memory "allocated before the call"): a step's launches may
    use the State and what the step made."""
    exc = refused(recording(unsupported=["foreign_memory"]))
    assert exc.code == "unreplayable" and str(exc) != UNREPLAYABLE["foreign_memory"]
    assert "the State" in str(exc) and "make itself" in str(exc)


DENIED = {  # the replay's refusals (step_schema's docstring): which, and why
    "_local_scalar_dense": "a host read", "item": "a host read",
    "set_": "a storage swap", "resize_": "a resize in place", "resize_as_": "a resize in place",
    "record_stream": "stream bookkeeping", "_assert_async": "an assertion that syncs",
    "_assert_scalar": "an assertion that syncs", "_print": "a host write",
    "_nested_tensor_from_mask": "a host read of the mask",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DENIED))
def test_an_operator_the_replay_does_not_run_is_refused_by_name(name: str) -> None:
    exc = refused(recording(op(), op(fn=f"{name}.default")))
    assert exc.code == "unreplayable"
    assert str(exc) == f"the step called {name}, which the replay does not run"
