"""The replayer's parsing of a recorded program (tools/gpu/verify/replay.py) without a GPU: scalars packed
as Triton's launcher packs them, every buffer address checked against its arena (a recorded
offset never reaches past it), memsets and launch parameters resolved per call binding, and a
parameter layout the kernel does not take refused. The replay itself on a GPU is
tests/tools/gpu/test_guard_record_cuda.py."""

from __future__ import annotations

import ctypes
import struct

import pytest

from harnesslab.tools.gpu.verify import replay


def test_scalars_are_packed_as_tritons_launcher_packs_them() -> None:
    assert replay.pack_scalar("i32", 7).value == 7 and isinstance(
        replay.pack_scalar("i32", 7), ctypes.c_int32
    )
    assert replay.pack_scalar("i8", -1).value == -1
    assert replay.pack_scalar("u8", 255).value == 255
    assert replay.pack_scalar("i64", True).value == 1
    assert replay.pack_scalar("u64", 3.0).value == 3
    assert replay.pack_scalar("fp16", 1.0).value == 0x3C00
    assert replay.pack_scalar("bf16", 1.0).value == 0x3F80
    assert (
        replay.pack_scalar("bf16", 1.0 + 3 * 2**-9).value == 0x3F80
    )  # truncated (rounding: 0x3F81)
    assert replay.pack_scalar("fp32", 1.5).value == struct.unpack("<I", struct.pack("<f", 1.5))[0]
    assert replay.pack_scalar("f32", 1.5).value == replay.pack_scalar("fp32", 1.5).value
    assert replay.pack_scalar("fp64", 1.5).value == struct.unpack("<Q", struct.pack("<d", 1.5))[0]
    assert isinstance(replay.pack_scalar("fp64", 1.5), ctypes.c_uint64)
    with pytest.raises(ValueError, match="unsupported scalar type 'f8'"):
        replay.pack_scalar("f8", 1)


def replayer(param_sizes: list[int] | None = None, lang: str = "triton") -> replay.Replayer:
    """A Replayer without a driver: one arena of 1024 bytes at 0x10000, one kernel."""
    r = object.__new__(replay.Replayer)
    r.drv = None  # nothing here reaches the driver
    r.arenas = {"a": (0x10000, 1024)}
    r.kernels = {"k": {"function": 1, "lang": lang, "optin": 48 << 10, "shared": 64,
                       "block": 128, "param_sizes": param_sizes}}  # fmt: skip
    r.programs = {}
    return r


BINDING = {"x": ("a", 256, 512), "y": ("a", 0, 1024)}


def test_an_address_is_its_arenas_base_plus_offsets_within_the_buffer() -> None:
    r = replayer()
    assert r._addr(BINDING, "x", 0) == 0x10000 + 256
    assert r._addr(BINDING, "x", 512) == 0x10000 + 768  # one past the end: a length's end
    assert r._addr(BINDING, "y", 1024) == 0x10000 + 1024


@pytest.mark.parametrize(
    ("binding", "offset"),
    [
        ({"x": ("a", 256, 512)}, 513),  # past the buffer
        ({"x": ("a", 256, 512)}, -1),  # before it
        ({"x": ("a", -1, 512)}, 0),  # a buffer before the arena
        ({"x": ("a", 513, 512)}, 0),  # a buffer past the arena's end
        ({"x": ("a", 0, 1025)}, 0),  # larger than the arena
    ],
)
def test_an_address_outside_its_buffer_or_arena_is_refused(binding, offset) -> None:
    with pytest.raises(ValueError, match="buffer x out of its arena"):
        replayer()._addr(binding, "x", offset)


def test_a_memset_covers_its_whole_span_inside_the_buffer() -> None:
    r = replayer()
    step = {"op": "memset", "buf": "x", "offset": 8, "width": 4, "count": 126, "value": 7}
    assert r._resolve(step, BINDING) == ["memset", 0x10000 + 256 + 8, 4, 7, 126]
    with pytest.raises(ValueError, match="out of its arena"):  # 8 + 4 * 127 > 512
        r._resolve({**step, "count": 127}, BINDING)


def launch(params: list[dict], **step) -> dict:
    return {"op": "launch", "kernel": "k", "params": params, "grid": [2, 1, 1], **step}


def test_launch_parameters_are_resolved_per_binding_and_checked_against_the_kernel() -> None:
    params = [
        {"k": "ptr", "buf": "x", "offset": 16},
        {"k": "ptr", "null": True},
        {"k": "scratch", "buf": "y"},
        {"k": "scratch"},
        {"k": "scalar", "type": "i32", "value": 5},
    ]
    r = replayer(param_sizes=[8, 8, 8, 8, 4])
    out = r._resolve(launch(params), BINDING)
    assert out[0] == "launch" and out[1] is r.kernels["k"] and out[2] == (2, 1, 1)
    assert (out[5], out[6]) == (128, 64)  # a Triton kernel's block and shared memory
    values = [v.value for v in out[4][:5]]
    assert values == [0x10000 + 256 + 16, 0, 0x10000, 0, 5]
    pointers = out[3]
    assert [pointers[i] for i in range(5)] == [ctypes.addressof(v) for v in out[4][:5]]
    with pytest.raises(ValueError, match=r"parameter layout \[8, 8, 8, 8, 4\] does not match"):
        replayer(param_sizes=[8, 8, 8, 8, 8])._resolve(launch(params), BINDING)
    assert replayer(param_sizes=None)._resolve(launch(params), BINDING)[0] == "launch"
    with pytest.raises(ValueError, match="out of its arena"):
        r._resolve(launch([{"k": "ptr", "buf": "x", "offset": 513}]), BINDING)
    with pytest.raises(ValueError, match="unknown parameter kind 'blob'"):
        r._resolve(launch([{"k": "blob"}]), BINDING)
    empty = replayer(param_sizes=[])._resolve(launch([]), BINDING)
    assert len(empty[3]) == 1  # a kernel of no parameters still gets an array


def test_a_cuda_kernel_takes_its_block_and_shared_memory_from_the_step() -> None:
    allowed = []
    r = replayer(lang="cuda")
    r.drv = type("D", (), {"allow_shared": lambda self, fn, n: allowed.append((fn, n))})()
    out = r._resolve(launch([], block=[64, 2, 1], shared=1024), BINDING)
    assert (out[5], out[6]) == ((64, 2, 1), 1024) and allowed == []
    out = r._resolve(launch([], block=[64, 1, 1], shared=(48 << 10) + 1), BINDING)
    assert allowed == [(1, (48 << 10) + 1)] and r.kernels["k"]["optin"] == (48 << 10) + 1
    r._resolve(launch([], block=[64, 1, 1], shared=48 << 10), BINDING)
    assert len(allowed) == 1  # opted in once: no second call for less


def test_a_program_is_its_steps_resolved_once_per_call() -> None:
    r = replayer()
    step = {"op": "memset", "buf": "x", "offset": 0, "width": 1, "count": 4, "value": 0}
    calls = [BINDING, {"x": ("a", 512, 512)}]
    assert r.program("p", [step, step], calls) == {"calls": 2}
    assert [[s[1] for s in call] for call in r.programs["p"]] == [
        [0x10000 + 256] * 2,
        [0x10000 + 512] * 2,
    ]


def test_a_cuda_kernel_at_exactly_48_kib_needs_no_opt_in() -> None:
    allowed = []
    r = replayer(lang="cuda")
    r.drv = type("D", (), {"allow_shared": lambda self, fn, n: allowed.append(n)})()
    r._resolve(launch([], block=[64, 1, 1], shared=48 << 10), BINDING)
    assert allowed == []


def test_a_tma_descriptor_is_encoded_in_128_bytes_at_the_buffers_address() -> None:
    encoded = []
    r = replayer(param_sizes=[128, 4])
    r.drv = type("D", (), {"encode_tma": lambda self, *a: encoded.append(a)})()
    tma = {"k": "tma", "buf": "x", "offset": 32, "elem_type": 6, "shape": [4, 8],
           "strides": [64], "block": [2, 8], "elem_size": 4, "swizzle": 0, "nan": True}  # fmt: skip
    out = r._resolve(launch([tma, {"k": "scalar", "type": "i32", "value": 1}]), BINDING)
    ((addr, elem, gaddr, shape, strides, block, size, swizzle, nan),) = encoded
    assert addr % 64 == 0 and (elem, gaddr) == (6, 0x10000 + 256 + 32)
    assert (shape, strides, block, size, swizzle, nan) == ([4, 8], [64], [2, 8], 4, 0, True)
    params = out[3]
    assert params[0] == addr  # the descriptor's own address, then the scalar's
    assert params[1] == ctypes.addressof(out[4][2]) and len(params) == 2
    with pytest.raises(ValueError, match="out of its arena"):
        r._resolve(launch([{**tma, "offset": 600}]), BINDING)
