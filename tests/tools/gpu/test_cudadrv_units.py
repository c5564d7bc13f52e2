"""The CUDA driver binding (tools/gpu/cudadrv.py) without a GPU: what each method asks of
libcuda (which entry point, with which arguments, in which order) and what it makes of the
answers, on a stand-in library that records the calls and fills the output arguments; a failed
call's error. The real driver: tests/gpu/test_cuda_replay_gpu.py (needs a GPU).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

import pytest

from harnesslab.tools.gpu import cudadrv as cd


def _value(arg: Any) -> Any:
    """A plain value for what the binding passed: the number in a ctypes scalar, the bytes of
    a buffer, the object behind a byref."""
    if isinstance(arg, ctypes._SimpleCData):
        return arg.value
    return arg


class Lib:
    """libcuda stand-in: each entry point records (name, args) and answers 0, or what
    `answers[name]` says (a code, or a function of the args that fills the outputs)."""

    def __init__(self, missing: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.answers: dict[str, int | Callable[..., int]] = {}
        self.missing = set(missing)
        self.looked_up: list[str] = []

    def __getattr__(self, sym: str) -> Any:
        if sym.startswith("_") or sym in self.missing:
            raise AttributeError(sym)
        self.looked_up.append(sym)

        def entry(*args: Any) -> int:
            self.calls.append((sym, args))
            answer = self.answers.get(sym, 0)
            return answer(*args) if callable(answer) else answer

        return entry


def out(ref: Any, value: Any) -> None:
    """Write `value` through a byref output argument."""
    ref._obj.value = value


@pytest.fixture
def lib() -> Lib:
    return Lib()


@pytest.fixture
def drv(lib: Lib) -> cd.Driver:
    d = cd.Driver.__new__(cd.Driver)
    d.lib, d._fns, d.device = lib, {}, 3
    return d


def names(lib: Lib) -> list[str]:
    return [name for name, _ in lib.calls]


def test_versioned_entry_points_are_used_and_looked_up_once(drv: cd.Driver, lib: Lib) -> None:
    assert drv.fn("cuMemAlloc") is drv.fn("cuMemAlloc")
    drv.fn("cuLaunchKernel")
    assert lib.looked_up == ["cuMemAlloc_v2", "cuLaunchKernel"]
    assert drv.fn("cuLaunchKernel").restype is ctypes.c_int


def test_an_entry_point_without_its_versioned_symbol_falls_back_to_the_plain_one() -> None:
    lib = Lib(missing=("cuMemFree_v2",))
    d = cd.Driver.__new__(cd.Driver)
    d.lib, d._fns = lib, {}
    d.fn("cuMemFree")
    assert lib.looked_up == ["cuMemFree"]


def test_a_failed_call_raises_with_the_function_the_code_and_the_drivers_text(
    drv: cd.Driver, lib: Lib
) -> None:
    text = ctypes.c_char_p(b"out of memory")

    def error_string(code: int, ref: Any) -> int:
        out(ref, text.value)
        return 0

    lib.answers = {"cuCtxSynchronize": 2, "cuGetErrorString": error_string}
    with pytest.raises(cd.CudaError) as err:
        drv.synchronize()
    assert (err.value.func, err.value.code) == ("cuCtxSynchronize", 2)
    assert str(err.value) == "cuCtxSynchronize failed: out of memory (2)"
    lib.answers = {"cuCtxSynchronize": 700}  # the driver has no text for it
    with pytest.raises(cd.CudaError, match=r"cuCtxSynchronize failed: unknown \(700\)"):
        drv.synchronize()
    assert names(lib)[-1] == "cuGetErrorString" and lib.calls[-1][1][0] == 700


def test_a_successful_call_asks_for_no_error_text(drv: cd.Driver, lib: Lib) -> None:
    drv.synchronize()
    assert names(lib) == ["cuCtxSynchronize"]


def test_the_primary_context_of_the_ordinal_is_made_current(drv: cd.Driver, lib: Lib) -> None:
    lib.answers["cuDeviceGet"] = lambda ref, ordinal: out(ref, ordinal + 10) or 0
    lib.answers["cuDevicePrimaryCtxRetain"] = lambda ref, dev: out(ref, 0xC0) or 0
    drv.init_primary(2)
    assert names(lib) == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    assert lib.calls[0][1] == (0,)
    assert drv.device == 12
    assert lib.calls[3][1][0].value == 0xC0
    assert drv.ctx.value == 0xC0  # the retained context's handle is kept
    drv.init_primary()
    assert lib.calls[-3][1][1] == 0  # the first device unless told


def test_device_queries_ask_about_this_device(drv: cd.Driver, lib: Lib) -> None:
    lib.answers["cuDeviceGetAttribute"] = lambda ref, attr, dev: out(ref, attr * 100 + dev) or 0
    assert drv.attribute(97) == 9703

    def name(buf: Any, size: int, dev: int) -> int:
        buf.value = b"Fake GPU %d" % dev
        return 0

    lib.answers["cuDeviceGetName"] = name
    assert drv.device_name() == "Fake GPU 3"

    def bad_name(buf: Any, size: int, dev: int) -> int:
        buf.value = b"GPU \xff"
        return 0

    lib.answers["cuDeviceGetName"] = bad_name
    assert drv.device_name() == "GPU \ufffd"  # not UTF-8: replaced, never an exception
    lib.answers["cuDeviceGetName"] = name
    drv.device_name()
    assert lib.calls[-1][1][1] == 256


def test_an_allocation_of_nothing_asks_for_one_byte(drv: cd.Driver, lib: Lib) -> None:
    lib.answers["cuMemAlloc_v2"] = lambda ref, size: out(ref, 0x1000 + size.value) or 0
    assert drv.alloc(0) == 0x1001
    assert drv.alloc(64) == 0x1040
    drv.free(0x1040)
    assert lib.calls[-1] == ("cuMemFree_v2", lib.calls[-1][1])
    assert lib.calls[-1][1][0].value == 0x1040


def test_an_ipc_handle_is_its_64_bytes_both_ways_nul_bytes_included(
    drv: cd.Driver, lib: Lib
) -> None:
    """The handle is opaque: a NUL in it is data (a c_char array field reads as a C string)."""
    handle = bytes([7, 0, 9, 0] * 16)

    def get(ref: Any, ptr: Any) -> int:
        ctypes.memmove(ctypes.addressof(ref._obj), handle, 64)
        return 0

    lib.answers["cuIpcGetMemHandle"] = get
    assert drv.ipc_handle(5) == handle
    seen: list[bytes] = []

    def open_(ref: Any, h: Any, flags: int) -> int:
        seen.append(ctypes.string_at(ctypes.addressof(h), 64))
        out(ref, 0xAB)
        return 0 if flags == cd.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS else 1

    lib.answers["cuIpcOpenMemHandle_v2"] = open_
    assert drv.ipc_open(handle[::-1]) == 0xAB
    assert seen == [handle[::-1]]
    calls = len(lib.calls)
    with pytest.raises(ValueError):  # never a read past a short handle
        drv.ipc_open(handle[:63])
    assert len(lib.calls) == calls
    drv.ipc_close(0xAB)
    assert names(lib)[-1] == "cuIpcCloseMemHandle"


def test_shareable_memory_is_rounded_to_the_granularity_and_mapped_read_write(
    drv: cd.Driver, lib: Lib
) -> None:
    props: list[bytes] = []

    def gran(ref: Any, prop: Any, flags: int) -> int:
        props.append(prop.raw)
        out(ref, 1 << 21)
        return 0

    lib.answers["cuMemGetAllocationGranularity"] = gran
    lib.answers["cuMemCreate"] = lambda ref, size, prop, flags: out(ref, 77) or 0
    lib.answers["cuMemExportToShareableHandle"] = lambda ref, h, kind, flags: out(ref, 9) or 0
    lib.answers["cuMemAddressReserve"] = lambda ref, size, *a: out(ref, 0x7000) or 0
    ptr, size, handle, fd = drv.alloc_shareable(3 << 20)
    assert (ptr, size, handle, fd) == (0x7000, 4 << 20, 77, 9)
    calls = dict(lib.calls)
    assert calls["cuMemGetAllocationGranularity"][2] == 0  # the minimum granularity
    assert calls["cuMemCreate"][3].value == 0
    assert calls["cuMemExportToShareableHandle"][2:3] == (1,)  # a POSIX file descriptor
    assert calls["cuMemExportToShareableHandle"][3].value == 0
    assert [a.value for a in calls["cuMemAddressReserve"][1:]] == [4 << 20, 0, 0, 0]
    assert [_value(a) for a in calls["cuMemMap"][1:]] == [4 << 20, 0, 77, 0]
    assert drv.alloc_shareable(4 << 20)[1] == 4 << 20  # a whole number of granules: as is
    assert drv.alloc_shareable((4 << 20) + 1)[1] == 6 << 20
    assert props[0] == struct.pack("iiiiQQ", 1, 1, 1, 3, 0, 0)
    create = calls["cuMemCreate"]
    assert create[1].value == 4 << 20
    access = calls["cuMemSetAccess"]
    assert access[2].raw == struct.pack("iii", 1, 3, 3) and access[3].value == 1
    mapped = calls["cuMemMap"]
    assert (mapped[1].value, mapped[3].value) == (4 << 20, 77)
    assert drv.alloc_shareable(1)[1] == 1 << 21  # at least one granule
    lib.calls.clear()
    lib.answers["cuMemImportFromShareableHandle"] = lambda ref, fd, kind: out(ref, 55) or 0
    assert drv.import_shareable(9, 4 << 20) == (0x7000, 55)
    assert lib.calls[0][1][1].value == 9 and lib.calls[0][1][2] == 1
    lib.calls.clear()
    drv.free_shareable(0x7000, 4 << 20, 55)
    assert names(lib) == ["cuMemUnmap", "cuMemAddressFree", "cuMemRelease"]
    assert lib.calls[2][1][0].value == 55


@pytest.mark.parametrize(
    ("width", "name", "ctype"),
    [(1, "cuMemsetD8Async", ctypes.c_uint8), (2, "cuMemsetD16Async", ctypes.c_uint16),
     (4, "cuMemsetD32Async", ctypes.c_uint32)],
)  # fmt: skip
def test_memset_sets_elements_of_its_width(
    drv: cd.Driver, lib: Lib, width: int, name: str, ctype: Any
) -> None:
    drv.memset(0x10, width, 0xFF, 8, 4)
    ((called, args),) = lib.calls
    assert called == name and type(args[1]) is ctype
    assert [_value(a) for a in args] == [0x10, 0xFF, 8, 4]


def test_a_function_asking_over_48_kib_of_shared_memory_opts_in_to_what_is_left(
    drv: cd.Driver, lib: Lib
) -> None:
    lib.answers["cuDeviceGetAttribute"] = lambda ref, attr, dev: out(ref, 232448) or 0
    lib.answers["cuFuncGetAttribute"] = lambda ref, attr, fn: out(ref, 1024) or 0
    lib.answers["cuModuleLoadData"] = lambda ref, buf: out(ref, 0x11) or 0
    lib.answers["cuModuleGetFunction"] = lambda ref, mod, name: out(ref, 0x22) or 0
    assert drv.load_function(b"cubin", "k", 49152) == (0x11, 0x22)
    assert "cuFuncSetAttribute" not in names(lib)  # 48 KiB needs no opt-in
    lib.calls.clear()
    drv.load_function(b"cubin", "k", 49153)
    calls = dict(lib.calls)
    assert calls["cuFuncSetCacheConfig"][1] == cd.CU_FUNC_CACHE_PREFER_SHARED
    assert calls["cuFuncGetAttribute"][1] == cd.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
    assert calls["cuFuncSetAttribute"][1:] == (
        cd.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        232448 - 1024,
    )
    assert calls["cuModuleGetFunction"][2] == b"k"
    lib.calls.clear()
    lib.answers["cuDeviceGetAttribute"] = lambda ref, attr, dev: out(ref, 49152) or 0
    drv.load_function(b"cubin", "k", 65536)  # a device without more: no opt-in
    assert "cuFuncSetAttribute" not in names(lib)
    lib.answers["cuDeviceGetAttribute"] = lambda ref, attr, dev: out(ref, 49153) or 0
    drv.load_function(b"cubin", "k", 65536)
    assert dict(lib.calls)["cuFuncSetAttribute"][2] == 49153 - 1024
    drv.allow_shared(0x22, 70000)
    assert lib.calls[-1][1][1:] == (cd.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 70000)


def test_parameter_sizes_are_read_until_the_driver_says_no_more() -> None:
    lib = Lib()
    d = cd.Driver.__new__(cd.Driver)
    d.lib, d._fns = lib, {}

    def info(fn: Any, i: int, off: Any, size: Any) -> int:
        if i >= 3:
            return 1
        out(size, [8, 4, 16][i])
        return 0

    lib.answers["cuFuncGetParamInfo"] = info
    assert d.param_sizes(0x22) == [8, 4, 16]
    old = cd.Driver.__new__(cd.Driver)
    old.lib, old._fns = Lib(missing=("cuFuncGetParamInfo",)), {}
    assert old.param_sizes(0x22) is None  # a driver before CUDA 12.4


def test_an_empty_grid_launches_nothing_and_a_plain_one_uses_cuLaunchKernel(
    drv: cd.Driver, lib: Lib
) -> None:
    for grid in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        drv.launch(0x22, grid, 128, 0, 0, None)
    assert lib.calls == []
    drv.launch(0x22, (2, 3, 4), 128, 512, 9, "params")
    ((name, args),) = lib.calls
    assert name == "cuLaunchKernel"
    assert [_value(a) for a in args] == [0x22, 2, 3, 4, 128, 1, 1, 512, 9, "params", None]
    lib.calls.clear()
    drv.launch(0x22, (1, 1, 1), (8, 4, 2), 0, 0, None)
    assert [_value(a) for a in lib.calls[0][1][4:7]] == [8, 4, 2]


def launch_ex(drv: cd.Driver, lib: Lib, **kw: Any) -> tuple[Any, list[tuple[int, bytes]]]:
    seen: list[Any] = []

    def ex(cfg_ref: Any, fn: Any, params: Any, extra: Any) -> int:
        cfg = cfg_ref._obj
        attrs = [
            (cfg.attrs[i].id, ctypes.string_at(ctypes.addressof(cfg.attrs[i]) + 8, 64))
            for i in range(cfg.numAttrs)
        ]  # the value field, NULs included
        seen.append(((cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX,
                      cfg.sharedMemBytes, cfg.hStream, fn.value), attrs))  # fmt: skip
        return 0

    lib.answers["cuLaunchKernelEx"] = ex
    drv.launch(0x22, (2, 3, 4), 128, 256, 7, None, **kw)
    return seen[0]


def pad(data: bytes) -> bytes:
    return data.ljust(64, b"\0")


def test_clusters_cooperative_and_pdl_launches_carry_their_attributes(
    drv: cd.Driver, lib: Lib
) -> None:
    dims, attrs = launch_ex(drv, lib, pdl=True)
    assert dims == (2, 3, 4, 128, 256, 7, 0x22)
    assert attrs == [(cd.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                      pad(struct.pack("i", 1)))]  # fmt: skip
    _, attrs = launch_ex(drv, lib, cooperative=True)
    assert attrs == [(cd.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, pad(struct.pack("i", 1)))]
    dims, attrs = launch_ex(drv, lib, num_ctas=2, pdl=True, cooperative=True)
    assert dims[0] == 4  # the grid counts clusters: x times the cluster size
    assert [a for a, _ in attrs] == [
        cd.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        cd.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, cd.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        cd.CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE]  # fmt: skip
    assert attrs[2][1] == pad(struct.pack("III", 2, 1, 1))
    assert attrs[3][1] == pad(struct.pack("i", cd.CU_CLUSTER_SCHEDULING_POLICY_SPREAD))
    assert "cuFuncSetAttribute" not in names(lib)
    launch_ex(drv, lib, num_ctas=16)  # over the portable 8: allowed first
    assert lib.calls[-2][0] == "cuFuncSetAttribute"
    assert lib.calls[-2][1][1:] == (cd.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)


def test_a_tma_descriptor_lists_dims_innermost_first_with_strides_in_bytes(
    drv: cd.Driver, lib: Lib
) -> None:
    drv.encode_tma(0x100, 7, 0x2000, [4, 8, 16], [128, 16, 1], [2, 4, 8], 2, 3, True)
    ((name, args),) = lib.calls
    assert name == "cuTensorMapEncodeTiled"
    assert (args[0].value, args[1], args[2], args[3].value) == (0x100, 7, 3, 0x2000)
    assert list(args[4])[:3] == [16, 8, 4]
    assert list(args[5]) == [32, 256, 0, 0, 0]  # dims 1..: bytes, innermost first
    assert list(args[6])[:3] == [8, 4, 2]
    assert list(args[7]) == [1, 1, 1, 1, 1]
    assert args[8:] == (0, 3, cd.CU_TENSOR_MAP_L2_PROMOTION_L2_128B, 1)
    drv.encode_tma(0x100, 7, 0x2000, [4], [1], [4], 2, 0, False)
    assert lib.calls[-1][1][-1] == 0


def test_streams_events_and_graphs(drv: cd.Driver, lib: Lib) -> None:
    lib.answers["cuStreamCreate"] = lambda ref, flags: out(ref, 0x51) or 0
    lib.answers["cuEventCreate"] = lambda ref, flags: out(ref, 0xE1) or 0
    lib.answers["cuEventElapsedTime"] = lambda ref, a, b: out(ref, 1.5) or 0
    lib.answers["cuStreamEndCapture"] = lambda s, ref: out(ref, 0x61) or 0
    lib.answers["cuGraphInstantiateWithFlags"] = lambda ref, g, f: out(ref, 0x71) or 0
    assert drv.stream() == 0x51 and lib.calls[-1][1][1] == cd.CU_STREAM_NON_BLOCKING
    assert drv.event() == 0xE1 and lib.calls[-1][1][1] == 0
    drv.record(0xE1, 0x51)
    assert lib.calls[-1][0] == "cuEventRecord"
    assert [a.value for a in lib.calls[-1][1]] == [0xE1, 0x51]
    assert drv.elapsed_ms(0xE0, 0xE1) == 1.5
    assert names(lib)[-2:] == ["cuEventSynchronize", "cuEventElapsedTime"]
    assert lib.calls[-2][1][0].value == 0xE1
    drv.stream_sync(0x51)
    assert lib.calls[-1][0] == "cuStreamSynchronize" and lib.calls[-1][1][0].value == 0x51
    drv.begin_capture(0x51)
    assert lib.calls[-1][1][1] == cd.CU_STREAM_CAPTURE_MODE_RELAXED
    lib.calls.clear()
    assert drv.end_capture(0x51) == 0x71
    assert names(lib) == ["cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphDestroy"]
    assert lib.calls[2][1][0].value == 0x61  # the graph, destroyed once instantiated
    assert lib.calls[1][1][2].value == 0  # no instantiation flags
    drv.graph_launch(0x71, 0x51)
    drv.graph_destroy(0x71)
    assert names(lib)[-2:] == ["cuGraphLaunch", "cuGraphExecDestroy"]


@pytest.mark.parametrize("align", [64, 128])
def test_an_aligned_buffer_holds_the_bytes_at_the_boundary(align: int) -> None:
    for n in (1, 100, 128):
        buf, addr = cd.aligned_buffer(n, align)
        assert addr % align == 0
        base = ctypes.addressof(buf)
        assert base <= addr and addr + n <= base + len(buf)
    assert cd.aligned_buffer(10)[1] % 128 == 0


def test_a_null_handle_from_the_driver_is_0(drv: cd.Driver) -> None:
    """The stand-in fills no output: every handle stays NULL (None in ctypes)."""
    assert drv.load_function(b"cubin", "k", 0) == (0, 0)
    assert (drv.stream(), drv.event(), drv.end_capture(0)) == (0, 0, 0)
