"""What the recorder (tools/gpu/verify/guard_record.py) writes down of a call, rule by rule, on the CPU:
which buffer a pointer names (an input, an allocation of the call, or memory that existed before:
not replayable), fills as memset steps, a launch's kernel, parameters and scratch, and the
recording it hands over. A Recorder is built without its __init__ (which wraps Triton's launcher
and needs a GPU build of Triton): each test sets what the method reads. Pointers are plain
integers, tensors are CPU tensors (their storages' addresses). The recorder runs on a GPU in
tests/tools/gpu/test_guard_record_cuda.py.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu.verify import guard_record as gr


def recorder(inputs: list[tuple[int, int]] | None = None) -> gr.Recorder:
    rec = gr.Recorder.__new__(gr.Recorder)
    rec.torch = torch
    rec.obs = Obs()
    rec.active, rec.by_function, rec.kernels = False, {}, {}
    rec.steps, rec.allocs, rec.unsupported = [], [], set()
    rec.inputs = inputs or []
    return rec


class Obs:
    def __init__(self) -> None:
        self.launched: list[Any] = []

    def launch(self, fn: Any) -> None:
        self.launched.append(fn)

    def launch_at(self, path: str, stream: Any) -> None:
        self.launched.append((path, stream))


# -- pointers -----------------------------------------------------------------------------------------
def test_a_pointer_names_an_input_or_an_allocation_with_its_offset() -> None:
    rec = recorder([(1000, 64), (5000, 0)])
    rec.allocs = [{"base": 9000, "nbytes": 16}]
    assert rec.ref(1000) == {"buf": "in0", "offset": 0}
    assert rec.ref(1063) == {"buf": "in0", "offset": 63}
    assert rec.ref(5000) == {"buf": "in1", "offset": 0}  # an empty input still has its address
    assert rec.ref(9015) == {"buf": "a0", "offset": 15}
    assert rec.unsupported == set()


@pytest.mark.parametrize("ptr", [999, 1064, 5001, 9016, 8999])
def test_memory_from_before_the_call_is_not_replayable(ptr: int) -> None:
    """Rule: a pointer just outside every input and allocation is foreign memory."""
    rec = recorder([(1000, 64), (5000, 0)])
    rec.allocs = [{"base": 9000, "nbytes": 16}]
    assert rec.ref(ptr) == {"null": True}
    assert rec.unsupported == {"foreign_memory"}


def test_null_pointers_and_pointer_objects() -> None:
    rec = recorder([(0, 64)])
    assert rec.ref(None) == {"null": True} and rec.ref(0) == {"null": True}
    assert rec.unsupported == set()  # a null pointer is not foreign memory, even at address 0

    class Bad:
        def data_ptr(self) -> int:
            raise RuntimeError("no")

    assert rec.ref(Bad()) == {"null": True} and rec.unsupported == {"pointer_object"}
    t = torch.ones(4)
    rec = recorder([(t.untyped_storage().data_ptr(), 16)])
    assert rec.ref(t[1:]) == {"buf": "in0", "offset": 4}


def test_begin_starts_a_clean_recording_of_these_inputs() -> None:
    rec = recorder()
    rec.steps, rec.allocs, rec.unsupported = [{"op": "x"}], [{"base": 1, "nbytes": 1}], {"fill"}
    a, b = torch.ones(3), torch.zeros(2, 2)
    rec.begin([a, b[1]])
    assert rec.active is True
    assert (rec.steps, rec.allocs, rec.unsupported) == ([], [], set())
    assert rec.inputs == [
        (a.untyped_storage().data_ptr(), 12),
        (b.untyped_storage().data_ptr(), 16),
    ]


# -- allocations and fills ---------------------------------------------------------------------------
def test_an_allocation_is_recorded_once_and_filled_unless_poisoned() -> None:
    rec = recorder()
    t = torch.empty(4, dtype=torch.float32)
    rec.on_alloc(t, 1.0, t.dtype)
    rec.on_alloc(t, 1.0, t.dtype)  # the same storage again: nothing new
    base = t.untyped_storage().data_ptr()
    assert rec.allocs == [{"base": base, "nbytes": 16}]
    assert rec.steps == [{"op": "memset", "buf": "a0", "offset": 0, "width": 4,
                          "value": 0x3F800000, "count": 4}]  # fmt: skip
    p = torch.empty(2, dtype=torch.float16)
    rec.on_alloc(p, "poison", p.dtype)
    assert len(rec.allocs) == 2 and len(rec.steps) == 1
    rec.on_alloc(torch.empty(0), 0.0, torch.float32)
    assert len(rec.allocs) == 2


def test_a_fill_outside_the_calls_buffers_is_not_a_step() -> None:
    rec = recorder()
    rec.on_fill(torch.zeros(3), 0.0)
    assert rec.steps == [] and rec.unsupported == {"foreign_memory"}


@pytest.mark.parametrize(
    "make, value",
    [
        (lambda: torch.zeros(4, 4).t(), 0.0),  # not contiguous
        (lambda: torch.zeros(4, dtype=torch.float64), 0.0),  # 8-byte elements
        (lambda: torch.zeros(4, dtype=torch.float32), "x"),  # not a number
    ],
)
def test_a_fill_a_memset_cannot_do_is_unsupported(make: Any, value: Any) -> None:
    t = make()
    rec = recorder([(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())])
    rec.on_fill(t, value)
    assert rec.steps == [] and rec.unsupported == {"fill"}


def test_a_fill_of_part_of_an_input() -> None:
    t = torch.zeros(8, dtype=torch.int16)
    rec = recorder([(t.untyped_storage().data_ptr(), 16)])
    rec.on_fill(t[2:5], -1)
    assert rec.steps == [{"op": "memset", "buf": "in0", "offset": 4, "width": 2,
                          "value": 0xFFFF, "count": 3}]  # fmt: skip


@pytest.mark.parametrize(
    "value, dtype, bits",
    [
        (1.0, torch.float16, 0x3C00),
        (-2.0, torch.float16, 0xC000),
        (1.0, torch.bfloat16, 0x3F80),
        (1.0, torch.float32, 0x3F800000),
        (-1, torch.int32, 0xFFFFFFFF),
        (-1, torch.int16, 0xFFFF),
        (-1, torch.int8, 0xFF),
        (300, torch.uint8, 44),
        (True, torch.bool, 1),
        (1.0, torch.float64, None),
        ("x", torch.float32, None),
        (None, torch.float32, None),
    ],
)
def test_fill_bits(value: Any, dtype: Any, bits: int | None) -> None:
    """Rule: the memset value is the element's own bit pattern, at the element's width."""
    assert gr._bits(torch, value, dtype) == bits


# -- launches -----------------------------------------------------------------------------------------
def test_flatten_expands_tuple_parameters() -> None:
    ft: list[Any] = []
    fv: list[Any] = []
    gr._flatten(["*fp32", ("i32", ("i64", "i1")), ("i32", "i32"), "fp32"],
                [1, [2, (3, 4)], 5, 6.0], ft, fv)  # fmt: skip
    assert ft == ["*fp32", "i32", "i64", "i1", "i32", "i32", "fp32"]
    assert fv == [1, 2, 3, 4, 5, 5, 6.0]


def test_params_pointers_scalars_and_constexprs() -> None:
    """Rule: a constexpr is not a parameter; a pointer names its buffer; a scalar is a plain
    number (a tensor's item is taken), anything else is unsupported."""
    rec = recorder([(1000, 64)])
    got = rec.params(["*fp32", "constexpr", "i32", "fp32", "i1", "i64"],
                     [1008, 128, torch.tensor(7), 0.5, True, "x"], None)  # fmt: skip
    assert got == [
        {"k": "ptr", "buf": "in0", "offset": 8},
        {"k": "scalar", "type": "i32", "value": 7},
        {"k": "scalar", "type": "fp32", "value": 0.5},
        {"k": "scalar", "type": "i1", "value": True},
        {"k": "scalar", "type": "i64", "value": 0},
    ]
    assert rec.unsupported == {"scalar"}
    assert isinstance(got[1]["value"], int)


def desc(base: int, padding: str = "zero") -> Any:
    return types.SimpleNamespace(base=base, shape=[4, 8], strides=[8, 1], padding=padding)


def test_a_host_tensor_descriptor_without_metadata() -> None:
    rec = recorder([(1000, 256)])
    got = rec.tensordesc(desc(1000, "nan"), None)
    i64 = [{"k": "scalar", "type": "i64", "value": v} for v in (4, 8, 8, 1)]
    assert got == [
        {"k": "ptr", "buf": "in0", "offset": 0}, *i64,
        {"k": "scalar", "type": "i1", "value": True},
        {"k": "scalar", "type": "i32", "value": 4}, {"k": "scalar", "type": "i32", "value": 8},
        {"k": "scalar", "type": "i64", "value": 8}, {"k": "scalar", "type": "i64", "value": 1},
    ]  # fmt: skip
    assert rec.tensordesc(desc(1000), None)[5] == {"k": "scalar", "type": "i1", "value": False}


def test_a_tma_descriptor_with_metadata() -> None:
    """Triton's device dtype codes 8, 9, 10 become the host's; an fp4-padded last dim doubles."""
    rec = recorder([(1000, 256)])
    meta = {"elem_type": 8, "elem_size": 2, "swizzle": 3, "block_size": [2, 4]}
    got = rec.tensordesc(desc(1000), meta)
    assert got[0] == {"k": "tma", "buf": "in0", "offset": 0, "elem_type": 10, "elem_size": 2,
                      "swizzle": 3, "block": [2, 4], "shape": [4, 8], "strides": [8, 1],
                      "nan": False}  # fmt: skip
    assert [s["value"] for s in got[1:]] == [4, 8, 8, 1]
    assert rec.tensordesc(desc(1000), {**meta, "elem_type": 9})[0]["elem_type"] == 8
    assert rec.tensordesc(desc(1000), {**meta, "elem_type": 10})[0]["elem_type"] == 9
    assert rec.tensordesc(desc(1000), {**meta, "elem_type": 5})[0]["elem_type"] == 5
    fp4 = rec.tensordesc(desc(1000), {**meta, "fp4_padded": True})
    assert fp4[0]["shape"] == [4, 16]
    assert [s["value"] for s in fp4[1:]] == [4, 16, 8, 1]


def test_params_take_each_descriptors_own_metadata() -> None:
    rec = recorder([(1000, 256)])
    metas = [{"elem_type": 8, "elem_size": 2, "swizzle": 0, "block_size": [1]},
             {"elem_type": 9, "elem_size": 4, "swizzle": 1, "block_size": [2]}]  # fmt: skip
    got = rec.params(["tensordesc", "tensordesc"], [desc(1000), desc(1000)], metas)
    tmas = [p for p in got if p["k"] == "tma"]
    assert [t["elem_type"] for t in tmas] == [10, 8]


def kernel(name: str, cubin: Any) -> Any:
    meta = types.SimpleNamespace(name=name, shared=128, num_warps=4, num_ctas=1)
    src = types.SimpleNamespace(fn=types.SimpleNamespace(fn="jit-fn"),
                                signature={"x": "*fp32", "n": "i32"})  # fmt: skip
    return types.SimpleNamespace(metadata=meta, asm={"cubin": cubin}, src=src)


def launcher(**kw: Any) -> Any:
    return types.SimpleNamespace(**kw)


def test_a_launch_records_its_kernel_once_its_params_and_scratch() -> None:
    """Rule: one kernel entry per binary; the grid; the parameters after Triton's four leading
    arguments; each scratch sized per program of the grid (times its CTAs)."""
    rec = recorder([(1000, 64)])
    cubin = b"\x7fELF"
    rec.by_function = {11: kernel("add", cubin)}
    ln = launcher(global_scratch_size=16, global_scratch_align=8, num_ctas=2,
                  launch_cooperative_grid=True)  # fmt: skip
    rec.on_launch(ln, (3, 2, 1), 0, 11, ("m", "lm", "h1", "h2", 1004, 9))
    rec.on_launch(ln, (1, 1, 1), 0, 11, ("m", "lm", "h1", "h2", 1000, 1))
    assert rec.obs.launched == ["jit-fn", "jit-fn"]
    assert list(rec.kernels) == ["k0_add"]
    k = rec.kernels["k0_add"]
    assert (k["name"], k["shared"], k["num_warps"], k["num_ctas"]) == ("add", 128, 4, 1)
    assert k["coop"] is True and k["pdl"] is False
    assert k["cubin"] == "f0VMRg=="
    first = rec.steps[0]
    assert first["op"] == "launch" and first["kernel"] == "k0_add" and first["grid"] == [3, 2, 1]
    assert first["params"] == [
        {"k": "ptr", "buf": "in0", "offset": 4},
        {"k": "scalar", "type": "i32", "value": 9},
        {"k": "scratch", "which": "global", "nbytes": 16 * 6 * 2, "align": 8},
        {"k": "scratch", "which": "profile", "nbytes": 0, "align": 1},
    ]
    assert rec.steps[1]["params"][2]["nbytes"] == 32
    rec.by_function[12] = kernel("add", b"\x7fELF-other")
    rec.on_launch(ln, (1, 1, 1), 0, 12, ("m", "lm", "h1", "h2", 1000, 1))
    assert list(rec.kernels) == ["k0_add", "k1_add"]


def test_a_launch_the_recorder_cannot_replay() -> None:
    rec = recorder()
    rec.on_launch(launcher(), (1, 1, 1), 0, 99, ())
    assert rec.unsupported == {"unknown_kernel"} and rec.steps == []
    rec = recorder()
    rec.by_function = {5: kernel("k", "not bytes")}
    rec.on_launch(launcher(), (1, 1, 1), 0, 5, ())
    assert rec.unsupported == {"no_binary"} and rec.steps == [] and rec.kernels == {}


def test_a_cuda_launch_is_recorded_by_harnesslab_cuda() -> None:
    rec = recorder()
    seen: list[Any] = []
    rec.cuda = types.SimpleNamespace(
        record_launch=lambda ln, kernels, ref: seen.append((ln, kernels, ref)) or {"op": "launch"}
    )
    ln = types.SimpleNamespace(kernel=types.SimpleNamespace(path="/c/k.cu"), stream=3)
    rec.on_cuda_launch(ln)
    assert rec.obs.launched == [("/c/k.cu", 3)]
    assert rec.steps == [{"op": "launch"}]
    assert seen == [(ln, rec.kernels, rec.ref)]


# -- the recording ------------------------------------------------------------------------------------
def test_finish_hands_over_what_the_replay_needs() -> None:
    """Rule: kernels no step launched are left out and no binary object travels; allocations
    by size only; the output as a buffer, an offset, a shape, strides and a dtype."""
    out = torch.zeros(2, 3)
    rec = recorder([(out.untyped_storage().data_ptr(), 24)])
    rec.active = True
    rec.kernels = {"k0_a": {"id": "k0_a", "_cubin": b"1"}, "k1_b": {"id": "k1_b", "_cubin": b"2"}}
    rec.steps = [{"op": "memset"}, {"op": "launch", "kernel": "k1_b"}]
    rec.allocs = [{"base": 50, "nbytes": 8}]
    rec.unsupported = {"scalar", "fill"}
    got = rec.finish(out[1])
    assert rec.active is False
    assert got["kernels"] == [{"id": "k1_b"}]
    assert got["allocs"] == [{"nbytes": 8}]
    assert got["steps"] == rec.steps
    assert got["unsupported"] == ["fill", "scalar"]
    assert got["output"] == {"buf": "in0", "offset": 12, "shape": [3], "strides": [1],
                             "dtype": "float32"}  # fmt: skip


def test_finish_an_empty_a_foreign_or_no_tensor_output() -> None:
    rec = recorder()
    empty = torch.zeros(0, 4, dtype=torch.float16)
    assert rec.finish(empty)["output"] == {"empty": True, "shape": [0, 4], "strides": [4, 1],
                                           "dtype": "float16"}  # fmt: skip
    assert rec.finish(torch.ones(2))["output"] is None  # memory from before the call
    assert rec.finish([1.0])["output"] is None

    class Sub(torch.Tensor):
        pass

    assert rec.finish(torch.ones(0).as_subclass(Sub))["output"] is None


def test_a_fill_of_one_byte_elements() -> None:
    t = torch.zeros(4, dtype=torch.uint8)
    rec = recorder([(t.untyped_storage().data_ptr(), 4)])
    rec.on_fill(t, 7)
    assert rec.steps == [{"op": "memset", "buf": "in0", "offset": 0, "width": 1, "value": 7,
                          "count": 4}]  # fmt: skip
    assert rec.unsupported == set()


def test_a_kernel_of_a_bytearray_binary_and_a_long_name() -> None:
    """The id is the kernel's index and name, cut at 120 characters; a bytearray binary is a
    binary."""
    rec = recorder([(1000, 64)])
    rec.by_function = {1: kernel("n" * 200, bytearray(b"\x7fELF"))}
    rec.on_launch(launcher(), (1, 1, 1), 0, 1, ("m", "lm", "h1", "h2", 1000, 1))
    (kid,) = rec.kernels
    assert kid == ("k0_" + "n" * 200)[:120] and len(kid) == 120
    assert rec.kernels[kid]["id"] == kid and rec.kernels[kid]["cubin"] == "f0VMRg=="


def test_a_bare_launcher_and_kernel_take_the_defaults() -> None:
    """A launcher without scratch, cooperative or PDL attributes and a kernel without num_ctas:
    no scratch bytes, alignment 1, one CTA, neither cooperative nor PDL."""
    rec = recorder([(1000, 64)])
    ck = kernel("k", b"bin")
    del ck.metadata.num_ctas
    rec.by_function = {1: ck}
    rec.on_launch(launcher(), (2, 2, 2), 0, 1, ("m", "lm", "h1", "h2", 1000, 1))
    k = rec.kernels["k0_k"]
    assert (k["num_ctas"], k["coop"], k["pdl"]) == (1, False, False)
    assert rec.steps[0]["params"][2:] == [
        {"k": "scratch", "which": "global", "nbytes": 0, "align": 1},
        {"k": "scratch", "which": "profile", "nbytes": 0, "align": 1},
    ]


def test_scratch_is_sized_for_every_program_of_a_3d_grid() -> None:
    rec = recorder([(1000, 64)])
    rec.by_function = {1: kernel("k", b"bin")}
    ln = launcher(global_scratch_size=None, global_scratch_align=None,
                  profile_scratch_size=8, profile_scratch_align=0)  # fmt: skip
    rec.on_launch(ln, (3, 2, 2), 0, 1, ("m", "lm", "h1", "h2", 1000, 1))
    assert rec.steps[0]["params"][2:] == [
        {"k": "scratch", "which": "global", "nbytes": 0, "align": 1},
        {"k": "scratch", "which": "profile", "nbytes": 8 * 12, "align": 1},
    ]


def test_three_descriptors_take_their_metadata_in_order() -> None:
    rec = recorder([(1000, 256)])
    metas = [{"elem_type": t, "elem_size": 2, "swizzle": 0, "block_size": [1]} for t in (1, 2, 3)]
    got = rec.params(["tensordesc"] * 3, [desc(1000)] * 3, metas)
    assert [p["elem_type"] for p in got if p["k"] == "tma"] == [1, 2, 3]


def test_values_past_the_signature_are_not_parameters() -> None:
    """The signature names the parameters: values past its end (or types past the values')
    are dropped, not refused."""
    ft: list[Any] = []
    fv: list[Any] = []
    gr._flatten(["i32"], [1, 2], ft, fv)
    assert (ft, fv) == (["i32"], [1])
    rec = recorder()
    assert rec.params(["i32", "i64"], [5], None) == [{"k": "scalar", "type": "i32", "value": 5}]
