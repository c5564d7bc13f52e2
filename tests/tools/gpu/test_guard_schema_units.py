"""The schema check of a candidate's recording before replay (tools/gpu/verify/guard_schema.py) rule by
rule: what a valid recording becomes (exactly the fields the replay uses, nothing else of the
candidate's), every integer field at both ends of its range and one past each, every list at its
length limit and one past, each container of the wrong type, and each name the recorder may say
it could not record. tests/tools/integrity/test_recording.py holds the first cases (a forged
kernel name, a bool size, a recording's text never in a refusal).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from harnesslab.tools.gpu.verify import guard_schema as gs

FORGED = "forged_recording"


def full() -> dict[str, Any]:
    """A recording with one of each: kernel kinds, a memset, every parameter kind, a CUDA
    launch, an output, and keys the schema does not know (dropped)."""
    return {
        "kernels": [
            {"id": "k0_row", "name": "row_kernel", "cubin": "AAAA", "shared": 128,
             "num_warps": 4, "num_ctas": 2, "coop": 1, "pdl": "yes", "lang": "triton",
             "note": "dropped"},
            {"id": "cu1_rev", "name": "rev", "cubin": "BBBB", "shared": 0, "num_warps": 8,
             "lang": "cuda"},
        ],
        "allocs": [{"nbytes": 4096}, {"nbytes": 64}],
        "steps": [
            {"op": "memset", "buf": "a1", "offset": 8, "width": 4, "value": 7, "count": 14},
            {"op": "launch", "kernel": "k0_row", "grid": [8, 2, 1], "block": [1, 1, 1], "params": [
                {"k": "ptr", "buf": "in0", "offset": 0},
                {"k": "ptr", "buf": "a0", "offset": 16, "note": "dropped"},
                {"k": "ptr", "null": True, "buf": "a9"},  # names nothing: a null needs no buffer
                {"k": "scalar", "type": "i32", "value": 1024},
                {"k": "scalar", "type": "fp32", "value": 1e-5},
                {"k": "scratch", "which": "global", "nbytes": 256},
                {"k": "scratch", "which": "profile"},
                {"k": "tma", "buf": "in1", "offset": 32, "elem_type": 6, "elem_size": 2,
                 "swizzle": 3, "block": [64, 32], "shape": [1024, 2], "strides": [2048],
                 "nan": True},
            ]},
            {"op": "launch", "kernel": "cu1_rev", "grid": [1, 1, 1], "block": [256, 1, 1],
             "shared": 96, "params": [{"k": "ptr", "buf": "a1", "offset": 4}]},
        ],
        "output": {"buf": "a0", "offset": 0, "shape": [2, 1024], "strides": [1024, 1],
                   "dtype": "float16", "note": "dropped"},
        "unsupported": [],
        "note": "dropped",
    }  # fmt: skip


VALID = {
    "kernels": {
        "k0_row": {"id": "k0_row", "name": "row_kernel", "cubin": "AAAA", "shared": 128,
                   "num_warps": 4, "num_ctas": 2, "coop": True, "pdl": True, "lang": "triton"},
        "cu1_rev": {"id": "cu1_rev", "name": "rev", "cubin": "BBBB", "shared": 0, "num_warps": 8,
                    "num_ctas": 1, "coop": False, "pdl": False, "lang": "cuda"},
    },
    "sizes": {"in0": None, "in1": None, "a0": 4096, "a1": 64, "s1_global": 256},
    "steps": [
        {"op": "memset", "buf": "a1", "offset": 8, "width": 4, "value": 7, "count": 14},
        {"op": "launch", "kernel": "k0_row", "grid": [8, 2, 1], "params": [
            {"k": "ptr", "buf": "in0", "offset": 0},
            {"k": "ptr", "buf": "a0", "offset": 16},
            {"k": "ptr", "null": True},
            {"k": "scalar", "type": "i32", "value": 1024},
            {"k": "scalar", "type": "fp32", "value": 1e-5},
            {"k": "scratch", "buf": "s1_global"},
            {"k": "scratch", "buf": None},
            {"k": "tma", "buf": "in1", "offset": 32, "elem_type": 6, "elem_size": 2, "swizzle": 3,
             "block": [64, 32], "shape": [1024, 2], "strides": [2048], "nan": True},
        ]},
        {"op": "launch", "kernel": "cu1_rev", "grid": [1, 1, 1],
         "params": [{"k": "ptr", "buf": "a1", "offset": 4}], "block": [256, 1, 1], "shared": 96},
    ],
    "output": {"buf": "a0", "offset": 0, "shape": [2, 1024], "strides": [1024, 1],
               "dtype": "float16"},
}  # fmt: skip


def changed(path: tuple[Any, ...], value: Any, rec: dict[str, Any] | None = None) -> dict:
    """`full()` (or `rec`) with the field at `path` set to `value`."""
    rec = copy.deepcopy(full() if rec is None else rec)
    at: Any = rec
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return rec


def refused(rec: Any, n_inputs: int = 2) -> gs.Bad:
    with pytest.raises(gs.Bad) as err:
        gs.validate(rec, n_inputs)
    return err.value


def test_a_valid_recording_becomes_exactly_what_the_replay_uses() -> None:
    """Types normalized (flags to bools, an unknown language to Triton, num_ctas defaulting to
    1), a scratch buffer named by its step, a CUDA launch with its own block and shared memory,
    a Triton launch without; every key the schema does not know dropped."""
    assert gs.validate(full(), 2) == VALID


def test_an_empty_recording_is_an_empty_program() -> None:
    empty = {"kernels": {}, "sizes": {"in0": None}, "steps": [], "output": None}
    assert gs.validate({}, 1) == empty
    none = {"kernels": None, "allocs": None, "steps": None, "unsupported": None, "output": None}
    assert gs.validate(none, 1) == empty


def test_a_later_launch_may_use_an_earlier_steps_scratch_buffer() -> None:
    rec = changed(("steps", 2, "params", 0, "buf"), "s1_global")
    assert gs.validate(rec, 2)["steps"][2]["params"][0]["buf"] == "s1_global"
    assert refused(changed(("steps", 2, "params", 0, "buf"), "s1_profile")).code == FORGED


def test_a_refusal_carries_its_code_and_the_harnesss_own_sentence() -> None:
    err = refused(changed(("kernels", 0, "num_warps"), 33))
    assert (err.code, str(err)) == (FORGED, "num_warps is not an integer in 1..32")


# -- every integer field: both ends in, one past each end out, no bool, float or text ------------

RANGES = [
    (("kernels", 0, "shared"), 0, 1 << 20),
    (("kernels", 0, "num_warps"), 1, 32),
    (("kernels", 0, "num_ctas"), 1, 16),
    (("allocs", 0, "nbytes"), 1, 1 << 36),
    (("steps", 0, "offset"), 0, 1 << 40),
    (("steps", 0, "width"), 1, 4),
    (("steps", 0, "value"), 0, (1 << 32) - 1),
    (("steps", 0, "count"), 0, 1 << 36),
    (("steps", 1, "grid", 2), 0, (1 << 31) - 1),
    (("steps", 1, "params", 0, "offset"), 0, 1 << 40),
    (("steps", 1, "params", 5, "nbytes"), 0, 1 << 34),  # 0: no scratch buffer (a test below)
    (("steps", 1, "params", 7, "offset"), 0, 1 << 40),
    (("steps", 1, "params", 7, "elem_type"), 0, 32),
    (("steps", 1, "params", 7, "elem_size"), 1, 16),
    (("steps", 1, "params", 7, "swizzle"), 0, 8),
    (("steps", 1, "params", 7, "block", 1), 1, 256),
    (("steps", 1, "params", 7, "shape", 1), 1, 1 << 31),
    (("steps", 1, "params", 7, "strides", 0), 0, 1 << 40),
    (("steps", 2, "block", 0), 1, 1024),
    (("steps", 2, "shared"), 0, 1 << 20),
    (("output", "offset"), 0, 1 << 40),
    (("output", "shape", 0), 0, 1 << 31),
    (("output", "strides", 1), 0, 1 << 40),
]


@pytest.mark.parametrize(("path", "lo", "hi"), RANGES, ids=lambda v: str(v))
def test_an_integer_field_holds_its_range_and_nothing_else(path, lo: int, hi: int) -> None:
    for ok in (lo, hi):
        gs.validate(changed(path, ok), 2)
    for bad in (lo - 1, hi + 1, True, float(lo), str(lo), None):
        assert refused(changed(path, bad)).code == FORGED, bad


def test_the_scratch_size_defaults_to_none_and_a_fill_width_of_3_is_refused() -> None:
    for nbytes in (0, None):  # no size: no buffer
        rec = changed(("steps", 1, "params", 5, "nbytes"), nbytes)
        if nbytes is None:
            del rec["steps"][1]["params"][5]["nbytes"]
        valid = gs.validate(rec, 2)
        assert valid["steps"][1]["params"][5] == {"k": "scratch", "buf": None}
        assert "s1_global" not in valid["sizes"]
    for width in (1, 2, 4):
        assert gs.validate(changed(("steps", 0, "width"), width), 2)["steps"][0]["width"] == width
    assert refused(changed(("steps", 0, "width"), 3)).code == FORGED


# -- lengths ---------------------------------------------------------------------------------------


def kernel(i: int) -> dict[str, Any]:
    return {"id": f"k{i}", "name": f"k{i}", "cubin": "", "shared": 0, "num_warps": 1}


def memset(_: int) -> dict[str, Any]:
    return {"op": "memset", "buf": "a0", "offset": 0, "width": 1, "value": 0, "count": 1}


def scalar(_: int) -> dict[str, Any]:
    return {"k": "scalar", "type": "i32", "value": 0}


@pytest.mark.parametrize(
    ("path", "item", "limit"),
    [(("kernels",), kernel, 64), (("allocs",), lambda _: {"nbytes": 1}, 64),
     (("steps",), memset, 512), (("steps", 1, "params"), scalar, 1024)],
)  # fmt: skip
def test_a_list_holds_up_to_its_limit(path, item, limit: int) -> None:
    rec = full()
    if path == ("kernels",):
        rec["steps"] = rec["steps"][:1]
    gs.validate(changed(path, [item(i) for i in range(limit)], rec), 2)
    assert refused(changed(path, [item(i) for i in range(limit + 1)], rec)).code == FORGED


@pytest.mark.parametrize(
    ("path", "ok", "bad"),
    [
        (("kernels", 0, "id"), ["k" * 160], ["k" * 161, 5, ["k"], None]),
        (("kernels", 0, "cubin"), ["", "A" * (48 << 20)], ["A" * ((48 << 20) + 1), None, ["A"]]),
        (("steps", 1, "grid"), [[0, 0, 0]], [[1, 1], [1, 1, 1, 1], "811", None]),
        (("steps", 2, "block"), [[1, 1, 1]], [[1, 1], [1, 1, 1, 1], "abc", None]),
        (("steps", 1, "params", 7, "shape"), [[1], [1] * 5], [[], [1] * 6, "ab", None]),
    ],
)  # fmt: skip
def test_a_sized_field_holds_its_length_and_type(path, ok: list, bad: list) -> None:
    rec = full()
    if path[0] == "kernels":  # no launch names the renamed kernel
        rec["steps"] = rec["steps"][:1]
    for value in ok:
        gs.validate(changed(path, value, rec), 2)
    for value in bad:
        assert refused(changed(path, value, rec)).code == FORGED, value


# -- each container of the wrong type -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "why"),
    [
        ((), None, "the recording is not an object"),
        (("unsupported",), "copy", "bad 'unsupported' list"),
        (("kernels", 0), "k0_row", "a kernel entry is malformed"),
        (("kernels", 0, "name"), None, "a kernel name is malformed"),
        (("kernels", 0, "name"), "row kernel", "a kernel name is malformed"),
        (("allocs",), {"nbytes": 4}, "bad allocation list"),
        (("allocs", 1), 64, "bad allocation"),
        (("steps",), {"op": "memset"}, "bad step list"),
        (("steps", 0), "memset", "bad step"),
        (("steps", 0, "buf"), "a9", "a pointer names no buffer of the call"),
        (("steps", 1, "op"), "exec", "a launch names no recorded kernel"),
        (("steps", 1, "kernel"), "k9", "a launch names no recorded kernel"),
        (("steps", 1, "params", 0), "in0", "bad parameter"),
        (("steps", 1, "params", 0, "k"), "pointer", "unknown parameter kind"),
        (("steps", 1, "params", 0, "buf"), "in2", "a pointer names no buffer of the call"),
        (("steps", 1, "params", 2, "null"), 1, "a pointer names no buffer of the call"),
        (("steps", 1, "params", 7, "buf"), "a9", "a pointer names no buffer of the call"),
        (("steps", 2, "block"), [32, 33, 1], "more than 1024 threads in a block"),
        (("output",), ["a0"], "bad output"),
        (("output", "buf"), "a9", "a pointer names no buffer of the call"),
        (("output", "dtype"), "object", "bad output dtype"),
        (("output", "strides"), [1], "output rank mismatch"),
    ],
)  # fmt: skip
def test_each_malformed_part_is_forged_with_its_reason(path, value, why: str) -> None:
    rec = value if path == () else changed(path, value)
    err = refused(rec)
    assert (err.code, str(err)) == (FORGED, why)


@pytest.mark.parametrize(
    "ty",
    ["i1", "i8", "u1", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "fp16", "bf16", "fp32",
     "f32", "fp64"],
)  # fmt: skip
def test_each_scalar_type_the_launcher_packs_is_accepted(ty: str) -> None:
    rec = changed(("steps", 1, "params", 3, "type"), ty)
    assert gs.validate(rec, 2)["steps"][1]["params"][3]["type"] == ty


@pytest.mark.parametrize(("value", "ok"), [(3, True), (0.5, True), (False, True), ("3", False),
                                           (None, False), ([3], False)])  # fmt: skip
def test_a_scalar_value_is_a_number(value: Any, ok: bool) -> None:
    rec = changed(("steps", 1, "params", 3, "value"), value)
    if ok:
        assert gs.validate(rec, 2)["steps"][1]["params"][3]["value"] == value
    else:
        assert str(refused(rec)) == "bad scalar parameter"


def test_a_scalar_type_the_launcher_does_not_pack_is_refused() -> None:
    for ty in ("f8", None, "I32"):
        rec = changed(("steps", 1, "params", 3, "type"), ty)
        assert str(refused(rec)) == "bad scalar parameter"


@pytest.mark.parametrize(
    "dtype",
    ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
     "bool"],
)  # fmt: skip
def test_each_output_dtype_is_accepted_for_an_output_and_an_empty_one(dtype: str) -> None:
    assert gs.validate(changed(("output", "dtype"), dtype), 2)["output"]["dtype"] == dtype
    empty = {"empty": True, "shape": [0, 4], "dtype": dtype}
    assert gs.validate(changed(("output",), empty), 2)["output"] == empty


def test_an_empty_output_has_a_zero_extent_and_a_known_dtype() -> None:
    ok = {"empty": True, "shape": [3, 0, 1 << 31], "dtype": "float32", "buf": "a9"}
    assert gs.validate(changed(("output",), ok), 2)["output"] == {
        "empty": True, "shape": [3, 0, 1 << 31], "dtype": "float32"
    }  # fmt: skip
    for shape in ([2, 4], [], None, [0, (1 << 31) + 1], [0, -1], [0, True]):
        bad = {"empty": True, "shape": shape, "dtype": "float32"}
        assert refused(changed(("output",), bad)).code == FORGED, shape
    assert refused(changed(("output",), {"empty": True, "shape": [0], "dtype": "x"})).code == FORGED
    not_empty = {"empty": 1, "shape": [0], "dtype": "float32"}  # only `true` is the empty mark
    assert str(refused(changed(("output",), not_empty))) == "a pointer names no buffer of the call"


def test_a_scalar_output_has_no_shape_or_strides() -> None:
    out = {"buf": "a0", "offset": 0, "dtype": "float32"}
    scalar_out = {**out, "shape": [], "strides": []}
    assert gs.validate(changed(("output",), out), 2)["output"] == scalar_out


@pytest.mark.parametrize(
    ("block", "ok"),
    [([1024, 1, 1], True), ([512, 2, 1], True), ([16, 16, 4], True), ([16, 1, 64], True),
     ([2, 1024, 1], False), ([1024, 2, 1], False), ([16, 16, 5], False), ([41, 25, 1], False),
     ([1, 1, 65], False), ([32, 33, 1], False)],
)  # fmt: skip
def test_a_cuda_block_has_at_most_1024_threads_and_64_in_z(block: list[int], ok: bool) -> None:
    rec = changed(("steps", 2, "block"), block)
    if ok:
        assert gs.validate(rec, 2)["steps"][2]["block"] == block
    else:
        assert str(refused(rec)) == "more than 1024 threads in a block"


# -- what the recorder could not record ----------------------------------------------------------

NAMES = ["foreign_memory", "copy", "fill", "unknown_kernel", "unrecorded_launch", "no_binary",
         "pointer_object", "scalar"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_each_thing_the_recorder_could_not_record_is_unreplayable_in_its_own_words(name) -> None:
    err = refused(changed(("unsupported",), [name]))
    assert (err.code, str(err)) == ("unreplayable", gs.UNREPLAYABLE[name])


def test_several_are_said_once_each_sorted_and_unknown_entries_are_ignored() -> None:
    err = refused(changed(("unsupported",), ["scalar", "copy", "nope", 3, ["copy"], "copy"]))
    # sorted by sentence: "a scalar ..." before "the wrapper ..."
    assert str(err) == f"{gs.UNREPLAYABLE['scalar']}; {gs.UNREPLAYABLE['copy']}"
    assert gs.validate(changed(("unsupported",), ["nope", 3, ["copy"], {"copy": 1}]), 2) == VALID


def test_a_fill_width_of_3_is_refused_in_any_step() -> None:
    rec = full()
    rec["steps"].insert(1, {**rec["steps"][0], "width": 3})
    assert str(refused(rec)) == "fill width 3"


def test_a_launch_without_parameters_and_a_descriptor_without_box_or_strides_are_empty() -> None:
    rec = full()
    del rec["steps"][2]["params"]
    tma = rec["steps"][1]["params"][7]
    del tma["block"], tma["strides"]
    valid = gs.validate(rec, 2)
    assert valid["steps"][2]["params"] == []
    assert (
        valid["steps"][1]["params"][7]["block"] == [] == valid["steps"][1]["params"][7]["strides"]
    )
