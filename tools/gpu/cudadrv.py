"""A small ctypes binding of the CUDA driver API: what the replay process needs to load kernel
binaries, launch them, capture and time CUDA graphs, and what the trusted parent needs to share
memory with it (legacy IPC handles).

Staged to the GPU host beside runner.py; standard library only (no torch, no triton), so the
replay process that runs agent-written device code never runs agent-written Python, nor any
library the agent could have influenced. Every call is checked: a failed call raises CudaError
naming the function and the driver's error string.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_RELAXED = 2
CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 11
CU_FUNC_CACHE_PREFER_SHARED = 2
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1
CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2

# Versioned entry points: the driver exports both; the unversioned ones are 32-bit legacy.
_V2 = {
    "cuMemAlloc", "cuMemFree", "cuMemGetAddressRange", "cuIpcOpenMemHandle", "cuMemsetD8",
    "cuStreamBeginCapture", "cuStreamDestroy", "cuEventDestroy", "cuDevicePrimaryCtxRelease",
    "cuModuleGetGlobal", "cuMemcpyHtoD", "cuMemcpyDtoH",
}  # fmt: skip


class CudaError(RuntimeError):
    def __init__(self, func: str, code: int, text: str) -> None:
        super().__init__(f"{func} failed: {text} ({code})")
        self.func, self.code = func, code


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint32),
        ("gridDimY", ctypes.c_uint32),
        ("gridDimZ", ctypes.c_uint32),
        ("blockDimX", ctypes.c_uint32),
        ("blockDimY", ctypes.c_uint32),
        ("blockDimZ", ctypes.c_uint32),
        ("sharedMemBytes", ctypes.c_uint32),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("numAttrs", ctypes.c_uint32),
    ]


def _set_attribute(attr: LaunchAttribute, ident: int, value: bytes) -> None:
    """`value` into the attribute's 64-byte value, NUL bytes included (assigning bytes to a
    c_char array field stops at the first NUL: a cluster of (2, 1, 1) became (2, 0, 0))."""
    attr.id = ident
    ctypes.memmove(ctypes.addressof(attr) + LaunchAttribute.value.offset, value, len(value))


def aligned_buffer(nbytes: int, align: int = 128) -> tuple[Any, int]:
    """(keep-alive buffer, address) of `nbytes` at an `align`-byte boundary (a CUtensorMap must
    be 64-byte aligned; ctypes gives no over-aligned types)."""
    buf = ctypes.create_string_buffer(nbytes + align)
    return buf, (ctypes.addressof(buf) + align - 1) & ~(align - 1)


class Driver:
    """libcuda.so.1 with checked calls. One instance per process."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._fns: dict[str, Any] = {}

    def fn(self, name: str) -> Any:
        f = self._fns.get(name)
        if f is None:
            sym = f"{name}_v2" if name in _V2 else name
            try:
                f = getattr(self.lib, sym)
            except AttributeError:
                f = getattr(self.lib, name)
            f.restype = ctypes.c_int
            self._fns[name] = f
        return f

    def call(self, name: str, *args: Any) -> None:
        code = self.fn(name)(*args)
        if code != 0:
            text = ctypes.c_char_p()
            self.fn("cuGetErrorString")(code, ctypes.byref(text))
            raise CudaError(name, code, (text.value or b"unknown").decode(errors="replace"))

    # -- context ---------------------------------------------------------------------------------
    def init_primary(self, ordinal: int = 0) -> None:
        """The device's primary context, current on this thread (what the runtime would use)."""
        self.call("cuInit", 0)
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        self.device = dev.value
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.call("cuCtxSetCurrent", ctx)
        self.ctx = ctx

    def attribute(self, attr: int) -> int:
        v = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(v), attr, self.device)
        return v.value

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.call("cuDeviceGetName", buf, 256, self.device)
        return buf.value.decode(errors="replace")

    def synchronize(self) -> None:
        self.call("cuCtxSynchronize")

    # -- memory ----------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        p = ctypes.c_uint64()
        self.call("cuMemAlloc", ctypes.byref(p), ctypes.c_size_t(max(nbytes, 1)))
        return p.value

    def free(self, ptr: int) -> None:
        self.call("cuMemFree", ctypes.c_uint64(ptr))

    def ipc_handle(self, ptr: int) -> bytes:
        h = IpcHandle()
        self.call("cuIpcGetMemHandle", ctypes.byref(h), ctypes.c_uint64(ptr))
        return bytes(h)  # all 64 bytes: `h.reserved` reads as a C string, cut at its first NUL

    def ipc_open(self, handle: bytes) -> int:
        h = IpcHandle.from_buffer_copy(handle)  # its 64 bytes; a shorter handle is refused
        p = ctypes.c_uint64()
        self.call("cuIpcOpenMemHandle", ctypes.byref(p), h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return p.value

    def ipc_close(self, ptr: int) -> None:
        self.call("cuIpcCloseMemHandle", ctypes.c_uint64(ptr))

    # -- memory shared through a file descriptor (virtual memory management API) ---------------
    def _prop(self) -> Any:
        # CUmemAllocationProp: type PINNED, handle type POSIX fd, location (DEVICE, ordinal),
        # win32 metadata, alloc flags: 32 bytes.
        return ctypes.create_string_buffer(struct.pack("iiiiQQ", 1, 1, 1, self.device, 0, 0), 32)

    def granularity(self) -> int:
        g = ctypes.c_size_t()
        self.call("cuMemGetAllocationGranularity", ctypes.byref(g), self._prop(), 0)
        return g.value

    def _map(self, handle: int, size: int) -> int:
        ptr = ctypes.c_uint64()
        self.call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(size),
                  ctypes.c_size_t(0), ctypes.c_uint64(0), ctypes.c_uint64(0))  # fmt: skip
        self.call("cuMemMap", ptr, ctypes.c_size_t(size), ctypes.c_size_t(0),
                  ctypes.c_uint64(handle), ctypes.c_uint64(0))  # fmt: skip
        desc = ctypes.create_string_buffer(struct.pack("iii", 1, self.device, 3), 12)  # RW
        self.call("cuMemSetAccess", ptr, ctypes.c_size_t(size), desc, ctypes.c_size_t(1))
        return ptr.value

    def alloc_shareable(self, nbytes: int) -> tuple[int, int, int, int]:
        """(pointer, size, allocation handle, file descriptor) of device memory another
        process maps by receiving the descriptor (works across PID namespaces)."""
        gran = self.granularity()
        size = max(gran, (nbytes + gran - 1) // gran * gran)
        handle = ctypes.c_uint64()
        self.call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), self._prop(),
                  ctypes.c_uint64(0))  # fmt: skip
        fd = ctypes.c_int()
        self.call("cuMemExportToShareableHandle", ctypes.byref(fd), handle, 1, ctypes.c_uint64(0))
        return self._map(handle.value, size), size, handle.value, fd.value

    def import_shareable(self, fd: int, size: int) -> tuple[int, int]:
        """(pointer, allocation handle) of memory exported by another process as `fd`."""
        handle = ctypes.c_uint64()
        self.call("cuMemImportFromShareableHandle", ctypes.byref(handle),
                  ctypes.c_void_p(fd), 1)  # fmt: skip
        return self._map(handle.value, size), handle.value

    def free_shareable(self, ptr: int, size: int, handle: int) -> None:
        self.call("cuMemUnmap", ctypes.c_uint64(ptr), ctypes.c_size_t(size))
        self.call("cuMemAddressFree", ctypes.c_uint64(ptr), ctypes.c_size_t(size))
        self.call("cuMemRelease", ctypes.c_uint64(handle))

    def memset(self, ptr: int, width: int, value: int, count: int, stream: int) -> None:
        """count elements of `width` bytes set to the bit pattern `value`, on `stream`."""
        name = {1: "cuMemsetD8Async", 2: "cuMemsetD16Async", 4: "cuMemsetD32Async"}[width]
        ctype = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32}[width]
        self.call(name, ctypes.c_uint64(ptr), ctype(value), ctypes.c_size_t(count),
                  ctypes.c_void_p(stream))  # fmt: skip

    # -- modules and launches --------------------------------------------------------------------
    def load_function(self, image: bytes, name: str, shared: int) -> tuple[int, int]:
        """(module, function) from a cubin; dynamic shared memory above 48 KiB opted in the way
        Triton's own loader does."""
        mod = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(image, len(image))
        self.call("cuModuleLoadData", ctypes.byref(mod), buf)
        fn = ctypes.c_void_p()
        self.call("cuModuleGetFunction", ctypes.byref(fn), mod, name.encode())
        optin = self.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        if shared > 49152 and optin > 49152:
            self.call("cuFuncSetCacheConfig", fn, CU_FUNC_CACHE_PREFER_SHARED)
            static = ctypes.c_int()
            self.call("cuFuncGetAttribute", ctypes.byref(static),
                      CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn)  # fmt: skip
            self.call("cuFuncSetAttribute", fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                      optin - static.value)  # fmt: skip
        return int(mod.value or 0), int(fn.value or 0)

    def allow_shared(self, function: int, nbytes: int) -> None:
        """Let `function` launch with `nbytes` of dynamic shared memory (over 48 KiB needs it)."""
        self.call("cuFuncSetAttribute", ctypes.c_void_p(function),
                  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)  # fmt: skip

    def param_sizes(self, function: int) -> list[int] | None:
        """Byte size of each kernel parameter (cuFuncGetParamInfo, CUDA >= 12.4), or None."""
        try:
            f = self.fn("cuFuncGetParamInfo")
        except AttributeError:
            return None
        sizes = []
        off, size = ctypes.c_size_t(), ctypes.c_size_t()
        for i in range(4096):
            if f(ctypes.c_void_p(function), i, ctypes.byref(off), ctypes.byref(size)) != 0:
                break
            sizes.append(size.value)
        return sizes

    def launch(self, function: int, grid: tuple[int, int, int],
               block: int | tuple[int, int, int], shared: int, stream: int, params: Any, *,
               num_ctas: int = 1, cooperative: bool = False, pdl: bool = False) -> None:  # fmt: skip
        """`block`: threads (Triton's 1-D blocks) or (x, y, z) (CUDA C++ kernels)."""
        gx, gy, gz = grid
        bx, by, bz = (block, 1, 1) if isinstance(block, int) else block
        if gx * gy * gz == 0:
            return
        if num_ctas == 1 and not cooperative and not pdl:
            self.call("cuLaunchKernel", ctypes.c_void_p(function), gx, gy, gz, bx, by, bz,
                      shared, ctypes.c_void_p(stream), params, None)  # fmt: skip
            return
        attrs = (LaunchAttribute * 4)()
        n = 0
        if pdl:
            _set_attribute(attrs[n], CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                           struct.pack("i", 1))  # fmt: skip
            n += 1
        if cooperative:
            _set_attribute(attrs[n], CU_LAUNCH_ATTRIBUTE_COOPERATIVE, struct.pack("i", 1))
            n += 1
        if num_ctas != 1:
            _set_attribute(attrs[n], CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                           struct.pack("III", num_ctas, 1, 1))  # fmt: skip
            n += 1
            _set_attribute(attrs[n], CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                           struct.pack("i", CU_CLUSTER_SCHEDULING_POLICY_SPREAD))  # fmt: skip
            n += 1
            if num_ctas == 16:
                self.call("cuFuncSetAttribute", ctypes.c_void_p(function),
                          CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)  # fmt: skip
        cfg = LaunchConfig(gx * num_ctas, gy, gz, bx, by, bz, shared, stream, attrs, n)
        self.call("cuLaunchKernelEx", ctypes.byref(cfg), ctypes.c_void_p(function), params, None)

    def encode_tma(self, out_addr: int, elem_type: int, addr: int, shape: list[int],
                   strides_elems: list[int], block: list[int], elem_size: int, swizzle: int,
                   nan_padding: bool) -> None:  # fmt: skip
        """cuTensorMapEncodeTiled exactly as Triton's fill_tma_descriptor calls it (dims
        innermost first, strides in bytes, element strides 1, L2 promotion 128 B)."""
        rank = len(shape)
        dims = (ctypes.c_uint64 * 5)(*[int(shape[rank - 1 - i]) for i in range(rank)])
        strides = (ctypes.c_uint64 * 5)()
        for i in range(rank - 1):
            strides[rank - 2 - i] = elem_size * int(strides_elems[i])
        box = (ctypes.c_uint32 * 5)(*[int(block[rank - 1 - i]) for i in range(rank)])
        ones = (ctypes.c_uint32 * 5)(1, 1, 1, 1, 1)
        self.call("cuTensorMapEncodeTiled", ctypes.c_void_p(out_addr), elem_type, rank,
                  ctypes.c_void_p(addr), dims, strides, box, ones, 0, swizzle,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B, 1 if nan_padding else 0)  # fmt: skip

    # -- streams, events, graphs -----------------------------------------------------------------
    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.call("cuStreamCreate", ctypes.byref(s), CU_STREAM_NON_BLOCKING)
        return int(s.value or 0)

    def event(self) -> int:
        e = ctypes.c_void_p()
        self.call("cuEventCreate", ctypes.byref(e), 0)
        return int(e.value or 0)

    def record(self, event: int, stream: int) -> None:
        self.call("cuEventRecord", ctypes.c_void_p(event), ctypes.c_void_p(stream))

    def elapsed_ms(self, start: int, end: int) -> float:
        self.call("cuEventSynchronize", ctypes.c_void_p(end))
        ms = ctypes.c_float()
        self.call("cuEventElapsedTime", ctypes.byref(ms), ctypes.c_void_p(start),
                  ctypes.c_void_p(end))  # fmt: skip
        return float(ms.value)

    def stream_sync(self, stream: int) -> None:
        self.call("cuStreamSynchronize", ctypes.c_void_p(stream))

    def begin_capture(self, stream: int) -> None:
        self.call("cuStreamBeginCapture", ctypes.c_void_p(stream), CU_STREAM_CAPTURE_MODE_RELAXED)

    def end_capture(self, stream: int) -> int:
        """The captured graph, instantiated (graph and exec both kept by the caller)."""
        graph = ctypes.c_void_p()
        self.call("cuStreamEndCapture", ctypes.c_void_p(stream), ctypes.byref(graph))
        exe = ctypes.c_void_p()
        self.call("cuGraphInstantiateWithFlags", ctypes.byref(exe), graph, ctypes.c_uint64(0))
        self.call("cuGraphDestroy", graph)
        return int(exe.value or 0)

    def graph_launch(self, exe: int, stream: int) -> None:
        self.call("cuGraphLaunch", ctypes.c_void_p(exe), ctypes.c_void_p(stream))

    def graph_destroy(self, exe: int) -> None:
        self.call("cuGraphExecDestroy", ctypes.c_void_p(exe))


__all__ = ["CudaError", "Driver", "aligned_buffer"]
