"""The checks of a CUDA launch (tools/gpu/cuda_cpp/harnesslab_cuda.py), one rule at a time and
at its boundaries: the launch configuration, grid and block limits, dynamic shared memory per
architecture, each argument against its declared type (exact bits for floats), which device
runs it. No NVRTC and no GPU: the kernel is a stand-in (cuda_support.fake_kernel) and a GPU
tensor is an object that says it is one."""

from __future__ import annotations

import math
import struct
from types import SimpleNamespace

import pytest
import torch

from harnesslab.tests.tools.gpu.cuda_support import GpuTensor, fake_kernel, staged

hc = staged("harnesslab_cuda")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list:
    seen: list = []
    monkeypatch.setattr(hc, "_launch", seen.append)
    return seen


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """torch as the launcher sees it on a host with a GPU: device 0, stream 777."""
    cuda = SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                           current_stream=lambda: SimpleNamespace(cuda_stream=777))  # fmt: skip
    fake = SimpleNamespace(cuda=cuda)
    monkeypatch.setattr(hc, "_torch", lambda: fake)
    return fake


def test_a_launch_is_configured_with_a_grid_a_block_and_optional_shared_bytes(launches) -> None:
    k = fake_kernel("ptr")
    x = torch.zeros(4)
    k[3, 32](x)
    k[(3, 2), (32, 2), 100](x)
    k.launch(5, 64, x, shared=8)
    k.launch(1, 1, x)
    assert [(ln.grid, ln.block, ln.shared) for ln in launches] == [
        ((3, 1, 1), (32, 1, 1), 0), ((3, 2, 1), (32, 2, 1), 100), ((5, 1, 1), (64, 1, 1), 8),
        ((1, 1, 1), (1, 1, 1), 0),
    ]  # fmt: skip
    for bad in ((1,), (1, 2, 3, 4)):
        with pytest.raises(
            hc.LaunchError, match=r"k\[grid, block\] or \[grid, block, shared_bytes\]"
        ):
            k[bad]
    with pytest.raises(hc.LaunchError):
        k[4]


@pytest.mark.parametrize(
    ("value", "what", "want"),
    [
        (5, "grid", (5, 1, 1)), ([2, 3], "grid", (2, 3, 1)), ((2, 3, 4), "grid", (2, 3, 4)),
        (0, "grid", (0, 1, 1)), ((2**31 - 1, 65535, 65535), "grid", (2**31 - 1, 65535, 65535)),
        ((1024, 1, 1), "block", (1024, 1, 1)), ((1, 1024, 64), "block", (1, 1024, 64)),
    ],
)  # fmt: skip
def test_grid_and_block_take_up_to_three_ints_within_the_hardware_limits(value, what, want) -> None:
    limit, low = (hc.MAX_GRID, 0) if what == "grid" else (hc.MAX_BLOCK, 1)
    assert hc._dims(value, what, limit, low) == want


@pytest.mark.parametrize(
    ("value", "what", "match"),
    [
        ((), "grid", r"grid \(\): an int or a tuple of up to 3 ints"),
        ((1, 1, 1, 1), "grid", "a tuple of up to 3"),
        (True, "grid", "an int or"), ((1, 2.0), "grid", "an int or"), ("3", "block", "an int or"),
        (2**31, "grid", r"grid.x = 2147483648: must be in 0..2147483647"),
        ((1, 65536), "grid", r"grid.y = 65536: must be in 0..65535"),
        ((1, 1, 65536), "grid", r"grid.z = 65536: must be in 0..65535"),
        (-1, "grid", r"grid.x = -1: must be in 0"),
        (1025, "block", r"block.x = 1025: must be in 1..1024"),
        ((1, 1025), "block", r"block.y = 1025: must be in 1..1024"),
        ((1, 1, 65), "block", r"block.z = 65: must be in 1..64"),
        ((1, 0), "block", r"block.y = 0: must be in 1"),
    ],
)  # fmt: skip
def test_grid_and_block_outside_the_limits_are_refused(value, what, match) -> None:
    limit, low = (hc.MAX_GRID, 0) if what == "grid" else (hc.MAX_BLOCK, 1)
    with pytest.raises(hc.LaunchError, match=match):
        hc._dims(value, what, limit, low)


def test_a_block_has_at_most_1024_threads(launches) -> None:
    k = fake_kernel("ptr")
    k[1, (32, 32, 1)](None)
    with pytest.raises(hc.LaunchError, match=r"block \(513, 2, 1\): 1026 threads, at most 1024"):
        k[1, (513, 2)](None)
    with pytest.raises(hc.LaunchError, match=r"block \(41, 25, 1\): 1025 threads"):
        k[1, (41, 25)](None)
    assert len(launches) == 1


@pytest.mark.parametrize(
    ("arch", "limit"),
    [("sm_75", 65536), ("sm_80", 166912), ("sm_86", 101376), ("sm_87", 166912), ("sm_89", 101376),
     ("sm_90", 232448), ("sm_90a", 232448), ("sm_100a", 232448), ("sm_120", 101376), ("sm_99", 232448)],
)  # fmt: skip
def test_dynamic_shared_memory_is_bytes_up_to_the_architectures_opt_in(
    launches, arch, limit
) -> None:
    k = fake_kernel("ptr", arch=arch)
    k[1, 32, limit](None)
    k[1, 32, 0](None)
    for bad in (limit + 1, -1, True, 1.0):
        with pytest.raises(hc.LaunchError, match=f"dynamic shared memory {bad!r}: bytes"):
            k[1, 32, bad](None)
    assert [ln.shared for ln in launches] == [limit, 0]


def test_a_launch_takes_exactly_the_declared_arguments(launches) -> None:
    k = fake_kernel("const __half*, i32")
    with pytest.raises(
        hc.LaunchError, match=r"k.cu:k takes 2 arguments \(const __half\*, i32\), got 1"
    ):
        k[1, 32](None)
    with pytest.raises(hc.LaunchError, match="got 3"):
        k[0, 32](None, 1, 2)  # checked even when the grid is empty
    assert launches == []


def test_an_empty_grid_on_any_axis_launches_nothing(launches) -> None:
    k = fake_kernel("i32")
    for grid in ((0, 1, 1), (1, 0), (1, 1, 0)):
        k[grid, 32](1)
    assert launches == []


def test_pointers_are_tensors_of_the_declared_element_type_or_none(launches) -> None:
    k = fake_kernel("const __half*, float*, int*, ptr")
    h, f = torch.zeros(2, dtype=torch.float16), torch.zeros(2)
    k[1, 1](h, f, f, h)  # int* and ptr name no dtype the launcher checks
    k[1, 1](None, None, None, None)
    first, nulls = (ln.args for ln in launches)
    assert [(a.kind, a.type, a.value, a.obj, a.c_type) for a in first] == [
        ("ptr", "ptr", h.data_ptr(), h, "const __half*"), ("ptr", "ptr", f.data_ptr(), f, "float*"),
        ("ptr", "ptr", f.data_ptr(), f, "int*"), ("ptr", "ptr", h.data_ptr(), h, "ptr"),
    ]  # fmt: skip
    assert [(a.value, a.obj) for a in nulls] == [(0, None)] * 4
    with pytest.raises(
        hc.LaunchError, match=r"k parameter 1 \(float\*\): a float16 tensor for a float\*"
    ):
        k[1, 1](h, h, f, h)
    with pytest.raises(
        hc.LaunchError, match=r"k parameter 0 \(const __half\*\): pass a torch tensor .*got int"
    ):
        k[1, 1](h.data_ptr(), f, f, h)


def test_float_scalars_are_numbers_passed_as_their_exact_bits(launches) -> None:
    k = fake_kernel("float, double, __half, __nv_bfloat16")
    k[1, 1](2.5, 3, 1.5, -2.0)
    assert [(a.kind, a.type, a.value, a.obj) for a in launches[0].args] == [
        ("scalar", "u32", 0x40200000, 2.5), ("scalar", "u64", 0x4008000000000000, 3),
        ("scalar", "u16", 0x3E00, 1.5), ("scalar", "u16", 0xC000, -2.0),
    ]  # fmt: skip
    for bad, match in ((True, "pass a float, got bool"), ("1", "pass a float, got str"),
                       (torch.tensor(1.0), "pass a Python number, not a tensor")):  # fmt: skip
        with pytest.raises(hc.LaunchError, match=match):
            k[1, 1](bad, 1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("sig", "value"),
    [("float", 1e39), ("__half", 70000.0), ("__nv_bfloat16", 1e39), ("double", 10**400)],
)
def test_a_float_that_does_not_fit_its_type_is_refused(launches, sig, value) -> None:
    with pytest.raises(hc.LaunchError, match=f"does not fit {sig}"):
        fake_kernel(sig)[1, 1](value)
    fake_kernel(sig)[1, 1](65504.0)  # fp16's largest


@pytest.mark.parametrize(
    ("ty", "lo", "hi"),
    [("i1", 0, 1), ("i8", -128, 127), ("u8", 0, 255), ("i16", -(2**15), 2**15 - 1), ("u16", 0, 2**16 - 1),
     ("i32", -(2**31), 2**31 - 1), ("u32", 0, 2**32 - 1), ("i64", -(2**63), 2**63 - 1), ("u64", 0, 2**64 - 1)],
)  # fmt: skip
def test_an_integer_scalar_fits_its_type_exactly(launches, ty, lo, hi) -> None:
    k = fake_kernel(ty)
    k[1, 1](lo)
    k[1, 1](hi)
    assert [(a.kind, a.type, a.value) for ln in launches for a in ln.args] == [
        ("scalar", ty, lo), ("scalar", ty, hi)
    ]  # fmt: skip
    for bad in (lo - 1, hi + 1):
        with pytest.raises(
            hc.LaunchError, match=rf"k parameter 0 \({ty}\): {bad} does not fit {ty} \({lo}..{hi}\)"
        ):
            k[1, 1](bad)
    with pytest.raises(hc.LaunchError, match="pass an int, got float"):
        k[1, 1](float(lo))


def test_a_bool_is_an_integer_scalar_and_no_tensor_is() -> None:
    k = fake_kernel("bool")
    (arg,) = k.params
    assert arg.type == "i1"
    assert hc._convert(arg, True, k).value == 1
    with pytest.raises(hc.LaunchError, match="not a tensor"):
        hc._convert(arg, torch.tensor(1), k)


def test_float_bits_are_the_ieee_bytes_and_bf16_rounds_to_nearest_even() -> None:
    assert hc._float_bits("fp64", 0.1) == ("u64", struct.unpack("<Q", struct.pack("<d", 0.1))[0])
    assert hc._float_bits("fp32", 0.1) == ("u32", 0x3DCCCCCD)
    assert hc._float_bits("fp16", 0.1) == ("u16", 0x2E66)
    assert hc._float_bits("bf16", 1.0) == ("u16", 0x3F80)
    assert hc._float_bits("bf16", 1.0 + 2**-8) == ("u16", 0x3F80)  # a tie: the even one
    assert hc._float_bits("bf16", 1.0 + 3 * 2**-8) == ("u16", 0x3F82)  # a tie: the even one
    assert hc._float_bits("bf16", 1.0 + 2**-8 + 2**-20) == ("u16", 0x3F81)  # above half: up
    assert hc._float_bits("bf16", 2.0 - 2**-10) == ("u16", 0x4000)  # rounds into the exponent
    assert hc._float_bits("bf16", -math.inf) == ("u16", 0xFF80)
    assert hc._float_bits("bf16", math.nan) == hc._float_bits("bf16", -math.nan) == ("u16", 0x7FC0)


def test_tensors_are_told_by_their_types_module() -> None:
    class Ptr:
        def data_ptr(self) -> int:
            return 0

    assert hc._is_tensor(torch.zeros(1)) and hc._is_tensor(GpuTensor(16))
    assert not hc._is_tensor(Ptr()) and not hc._is_tensor(torch.float16) and not hc._is_tensor(3)


def test_aligned_asks_every_tensors_first_element_address() -> None:
    x = torch.zeros(64)
    assert hc.aligned(x) and hc.aligned(x[4:]) and hc.aligned()
    assert not hc.aligned(x, x[1:]) and hc.aligned(x[1:], to=4) and not hc.aligned(x[4:], to=32)


def test_cpu_tensors_are_checked_on_the_cpu(launches, monkeypatch) -> None:
    monkeypatch.setattr(hc, "_has_gpu", lambda: False)  # as here, also on a GPU host
    fake_kernel("ptr, i32")[1, 32](torch.zeros(2), 3)
    fake_kernel("i32")[1, 32](3)  # no tensor, no GPU here: the CPU
    assert [(ln.device, ln.stream) for ln in launches] == [("cpu", 0), ("cpu", 0)]


def test_gpu_tensors_launch_on_the_current_device_and_stream(launches, gpu) -> None:
    k = fake_kernel("ptr, ptr, i32")
    k[2, 64](GpuTensor(4096), None, 7)
    fake_kernel("i32")[1, 1](7)  # no tensor, a GPU here: the GPU
    (ln, bare) = launches
    assert (ln.device, ln.stream, ln.kernel, ln.args[0].value) == ("cuda", 777, k, 4096)
    assert (bare.device, bare.stream) == ("cuda", 777)
    with pytest.raises(hc.LaunchError, match="a tensor is not on cuda:0, the current device"):
        k[2, 64](GpuTensor(4096), GpuTensor(8192, index=1), 7)
    with pytest.raises(hc.LaunchError, match="some tensors are on the GPU, some on the CPU"):
        k[2, 64](GpuTensor(4096), torch.zeros(2), 7)
    assert len(launches) == 2
