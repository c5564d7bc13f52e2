"""The replay process of the guarded verify: it launches the candidate's recorded kernels on the
trusted parent's buffers and times them with its own clock.

Runs sandboxed (sandbox.py), started by guard.py; standard library + ctypes (cudadrv.py) only:
no torch, no triton, no agent-written Python. What the candidate's process recorded for a call
(kernel binaries, grids, scalar arguments, which buffer each pointer names, fills, scratch) is a
claim; this process turns it into driver launches on memory the parent owns (shared through CUDA
IPC) and never reads a result from it. The parent, in another CUDA context, fills fresh inputs,
poisons outputs, and compares every output with expected values that never exist here: the
candidate's device code runs in this context and can write anywhere in it, so nothing in this
context decides anything except the timing, measured with events around a CUDA-graph replay of
K calls (whole context synchronised inside the window).

Protocol (wire.py frames on stdin / a private stdout): hello, kernels, arena, program, run,
capture, time, drop, exit; every reply is {"ok": true, ...} or {"error": "..."} with text this
file composes (driver error strings included).
"""

from __future__ import annotations

import base64
import ctypes
import os
import struct
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script: its siblings

if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from .. import wire
    from ..cudadrv import CudaError, Driver, aligned_buffer
else:
    import wire
    from cudadrv import CudaError, Driver, aligned_buffer

SPIN_S = 0.02  # busy-wait for the next request before blocking (keeps wake-ups out of timing)
SCALARS: dict[str, tuple[Any, str]] = {
    "i1": (ctypes.c_int8, "int"), "i8": (ctypes.c_int8, "int"), "u1": (ctypes.c_uint8, "int"),
    "u8": (ctypes.c_uint8, "int"), "i16": (ctypes.c_int16, "int"),
    "u16": (ctypes.c_uint16, "int"), "i32": (ctypes.c_int32, "int"),
    "u32": (ctypes.c_uint32, "int"), "i64": (ctypes.c_int64, "int"),
    "u64": (ctypes.c_uint64, "int"), "fp16": (ctypes.c_uint16, "fp16"),
    "bf16": (ctypes.c_uint16, "bf16"), "fp32": (ctypes.c_uint32, "fp32"),
    "f32": (ctypes.c_uint32, "fp32"), "fp64": (ctypes.c_uint64, "fp64"),
}  # fmt: skip


def pack_scalar(ty: str, value: Any) -> Any:
    """A ctypes value holding `value` the way Triton's launcher passes a `ty` argument."""
    if ty not in SCALARS:
        raise ValueError(f"unsupported scalar type {ty!r}")
    ctype, how = SCALARS[ty]
    if how == "int":
        v = int(value)
        if isinstance(value, bool):
            v = int(value)
        return ctype(v)
    f = float(value)
    if how == "fp16":
        return ctype(struct.unpack("<H", struct.pack("<e", f))[0])
    if how == "bf16":  # truncation, as Triton's pack_bf16
        return ctype(struct.unpack("<I", struct.pack("<f", f))[0] >> 16)
    if how == "fp32":
        return ctype(struct.unpack("<I", struct.pack("<f", f))[0])
    return ctype(struct.unpack("<Q", struct.pack("<d", f))[0])


class Replayer:
    def __init__(self) -> None:
        self.drv = Driver()
        self.drv.init_primary(0)
        self.stream = self.drv.stream()
        self.start, self.end = self.drv.event(), self.drv.event()
        self.kernels: dict[str, dict[str, Any]] = {}
        self.arenas: dict[str, tuple[int, int]] = {}  # id -> (base pointer, nbytes)
        self.programs: dict[str, list[list[Any]]] = {}  # id -> calls -> steps
        self.graphs: dict[str, int] = {}
        self.handles: dict[str, int] = {}
        self.sock: Any = None

    # -- requests --------------------------------------------------------------------------------
    def hello(self, sock_fd: int | None) -> dict[str, Any]:
        import socket

        if sock_fd is not None and self.sock is None:
            self.sock = socket.socket(fileno=int(sock_fd))
        return {"device": self.drv.device_name(), "pid": os.getpid()}

    def load_kernels(self, kernels: list[dict[str, Any]]) -> dict[str, Any]:
        for k in kernels:
            if k["id"] not in self.kernels:
                self.kernels[k["id"]] = load_kernel(self.drv, k)
        return {}

    def arena(self, aid: str, nbytes: int) -> dict[str, Any]:
        """Map the parent's arena: its file descriptor arrives on the socket the parent gave
        this process at start (SCM_RIGHTS); legacy IPC handles did not open on an H100 VM."""
        import socket

        if aid in self.arenas:
            raise ValueError(f"arena {aid} exists")
        if self.sock is None:
            raise ValueError("no descriptor channel")
        _, fds, _, _ = socket.recv_fds(self.sock, 16, 1)
        if len(fds) != 1:
            raise ValueError("no descriptor received")
        try:
            ptr, handle = self.drv.import_shareable(fds[0], int(nbytes))
        finally:
            os.close(fds[0])
        self.arenas[aid] = (ptr, int(nbytes))
        self.handles[aid] = handle
        return {}

    def program(self, pid: str, steps: list[dict[str, Any]], calls: list[dict[str, Any]]):
        """Resolve `steps` once per call binding: buffer names -> (arena, offset, nbytes)."""
        resolved = []
        for binding in calls:
            resolved.append([self._resolve(step, binding) for step in steps])
        self.programs[pid] = resolved
        return {"calls": len(resolved)}

    def _addr(self, binding: dict[str, Any], buf: str, offset: int) -> int:
        aid, off, nbytes = binding[buf]
        base, size = self.arenas[aid]
        if not (0 <= off and off + nbytes <= size and 0 <= offset <= nbytes):
            raise ValueError(f"buffer {buf} out of its arena")
        return base + off + offset

    def _resolve(self, step: dict[str, Any], binding: dict[str, Any]) -> list[Any]:
        if step["op"] == "memset":
            width, count = int(step["width"]), int(step["count"])
            addr = self._addr(binding, step["buf"], int(step["offset"]) + width * count)
            return ["memset", addr - width * count, width, int(step["value"]), count]
        return launch_args(self.drv, self.kernels[step["kernel"]], step,
                           lambda buf, offset: self._addr(binding, buf, offset))  # fmt: skip

    def _enqueue(self, steps: list[list[Any]]) -> None:
        for s in steps:
            if s[0] == "memset":
                self.drv.memset(s[1], s[2], s[3], s[4], self.stream)
            else:
                enqueue_launch(self.drv, s, self.stream)

    def run(self, pid: str, calls: list[int]) -> dict[str, Any]:
        prog = self.programs[pid]
        for c in calls:
            self._enqueue(prog[c])
        self.drv.synchronize()
        return {}

    def capture(self, pid: str) -> dict[str, Any]:
        prog = self.programs[pid]
        if pid in self.graphs:
            self.drv.graph_destroy(self.graphs.pop(pid))
        self.drv.begin_capture(self.stream)
        try:
            for steps in prog:
                self._enqueue(steps)
        finally:
            exe = self.drv.end_capture(self.stream)
        self.graphs[pid] = exe
        self.drv.graph_launch(exe, self.stream)  # one untimed replay: uploads the graph
        self.drv.synchronize()
        return {"calls": len(prog)}

    def time(self, pid: str | None) -> dict[str, Any]:
        """One sample: the graph's replay between two events, the context synchronised inside
        the window. `pid` None times an empty window (the parent's overhead calibration)."""
        drv = self.drv
        drv.record(self.start, self.stream)
        if pid is not None:
            drv.graph_launch(self.graphs[pid], self.stream)
        drv.synchronize()
        drv.record(self.end, self.stream)
        return {"us": drv.elapsed_ms(self.start, self.end) * 1e3}

    def drop(self, pid: str) -> dict[str, Any]:
        if pid in self.graphs:
            self.drv.graph_destroy(self.graphs.pop(pid))
        self.programs.pop(pid, None)
        return {}

    def close_arena(self, aid: str) -> dict[str, Any]:
        for pid in list(self.graphs):
            self.drop(pid)
        self.programs.clear()
        base, size = self.arenas.pop(aid)
        self.drv.synchronize()
        self.drv.free_shareable(base, size, self.handles.pop(aid))
        return {}


def load_kernel(drv: Driver, k: dict[str, Any]) -> dict[str, Any]:
    """A validated kernel entry (guard_schema.clean_kernels) loaded into this context: its
    function and what a launch of it needs."""
    image = base64.b64decode(k["cubin"])
    cuda = k.get("lang") == "cuda"  # harnesslab_cuda: block and shared memory per launch
    mod, fn = drv.load_function(image, str(k["name"]), 0 if cuda else int(k["shared"]))
    return {
        "module": mod,
        "function": fn,
        "lang": "cuda" if cuda else "triton",
        "optin": 48 << 10,  # dynamic shared memory a launch may use without opting in
        "shared": int(k["shared"]),
        "block": 32 * int(k["num_warps"]),
        "num_ctas": int(k.get("num_ctas", 1)),
        "coop": bool(k.get("coop")),
        "pdl": bool(k.get("pdl")),
        "param_sizes": drv.param_sizes(fn),
    }


def launch_args(drv: Driver, k: dict[str, Any], step: dict[str, Any],
                addr: Callable[[str, int], int]) -> list[Any]:  # fmt: skip
    """A validated launch step (guard_schema.clean_launch) of loaded kernel `k` as
    ["launch", k, grid, params, keep, block, shared]: every parameter packed the way the kernel
    takes it, a pointer to buffer `buf` + `offset` being addr(buf, offset) (a scratch buffer's
    addr(name, 0)). `keep` holds what the packed parameters point into."""
    keep: list[Any] = []
    sizes: list[int] = []
    for p in step["params"]:
        kind = p["k"]
        if kind == "ptr":
            v = ctypes.c_uint64(0 if p.get("null") else addr(p["buf"], int(p["offset"])))
        elif kind == "scratch":
            name = p.get("buf")
            v = ctypes.c_uint64(addr(name, 0) if name else 0)
        elif kind == "scalar":
            v = pack_scalar(str(p["type"]), p["value"])
        elif kind == "tma":
            buf, at = aligned_buffer(128)
            drv.encode_tma(
                at, int(p["elem_type"]), addr(p["buf"], int(p["offset"])),
                [int(x) for x in p["shape"]], [int(x) for x in p["strides"]],
                [int(x) for x in p["block"]], int(p["elem_size"]), int(p["swizzle"]),
                bool(p.get("nan")),
            )  # fmt: skip
            keep.append(buf)
            keep.append(ctypes.c_void_p(at))
            sizes.append(128)
            continue
        else:
            raise ValueError(f"unknown parameter kind {kind!r}")
        keep.append(v)
        sizes.append(ctypes.sizeof(v))
    expected = k["param_sizes"]
    if expected is not None and expected != sizes:
        raise ValueError(f"parameter layout {sizes} does not match the kernel's {expected}")
    pointers = [
        (v.value if isinstance(v, ctypes.c_void_p) else ctypes.addressof(v))
        for v in keep
        if not isinstance(v, ctypes.Array)
    ]
    params = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
    keep.append(params)
    grid = tuple(int(g) for g in step["grid"])
    block, shared = k["block"], k["shared"]
    if k["lang"] == "cuda":  # as harnesslab_cuda._launch: opt in past 48 KiB when asked
        block, shared = tuple(int(b) for b in step["block"]), int(step["shared"])
        if shared > k["optin"]:
            drv.allow_shared(k["function"], shared)
            k["optin"] = shared
    return ["launch", k, grid, params, keep, block, shared]


def enqueue_launch(drv: Driver, s: list[Any], stream: int) -> None:
    """A launch_args list, launched on `stream`."""
    k, grid, params, block, shared = s[1], s[2], s[3], s[5], s[6]
    drv.launch(k["function"], grid, block, shared, stream, params, num_ctas=k["num_ctas"],
               cooperative=k["coop"], pdl=k["pdl"])  # fmt: skip


# ----------------------------------------------------------------------------------------------
# the protocol: one request a frame on stdin (guard_gpu.ask_ok sends them), answered on the
# private descriptor with {"ok": true, ...the handler's fields} or {"error": text}


class HelloRequest(TypedDict):
    op: Literal["hello"]
    sock: NotRequired[int | None]  # this process's end of the descriptor socketpair


class KernelsRequest(TypedDict):
    op: Literal["kernels"]
    kernels: list[dict[str, Any]]  # validated recordings' kernels (guard_schema.validate)


class ArenaRequest(TypedDict):
    op: Literal["arena"]
    id: str
    nbytes: int


class CloseArenaRequest(TypedDict):
    op: Literal["close_arena"]
    id: str


class ProgramRequest(TypedDict):
    op: Literal["program"]
    id: str
    steps: list[dict[str, Any]]
    calls: list[dict[str, Any]]


class RunRequest(TypedDict):
    op: Literal["run"]
    id: str
    calls: list[int]


class CaptureRequest(TypedDict):
    op: Literal["capture"]
    id: str


class TimeRequest(TypedDict):
    op: Literal["time"]
    id: NotRequired[str | None]  # None: an empty window


class DropRequest(TypedDict):
    op: Literal["drop"]
    id: str


class ExitRequest(TypedDict):
    op: Literal["exit"]


Request = (
    HelloRequest | KernelsRequest | ArenaRequest | CloseArenaRequest | ProgramRequest
    | RunRequest | CaptureRequest | TimeRequest | DropRequest | ExitRequest
)  # fmt: skip
# op -> its handler: the Replayer method, given the request's fields (a missing one is a
# KeyError, answered as an error). "exit" ends serve; any other op is an unknown request.
OPS: dict[str, Callable[[Replayer, Any], dict[str, Any] | None]] = {
    "hello": lambda rep, msg: rep.hello(msg.get("sock")),
    "kernels": lambda rep, msg: rep.load_kernels(msg["kernels"]),
    "arena": lambda rep, msg: rep.arena(msg["id"], msg["nbytes"]),
    "close_arena": lambda rep, msg: rep.close_arena(msg["id"]),
    "program": lambda rep, msg: rep.program(msg["id"], msg["steps"], msg["calls"]),
    "run": lambda rep, msg: rep.run(msg["id"], msg["calls"]),
    "capture": lambda rep, msg: rep.capture(msg["id"]),
    "time": lambda rep, msg: rep.time(msg.get("id")),
    "drop": lambda rep, msg: rep.drop(msg["id"]),
}


def serve(fd_in: int, fd_out: int) -> int:
    rep: Replayer | None = None
    while True:
        spin_until = time.monotonic() + SPIN_S
        while time.monotonic() < spin_until and not _readable(fd_in):
            pass
        try:
            msg = wire.recv(fd_in)
        except wire.WireError:
            return 0
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "exit":
            return 0
        try:
            if rep is None:
                rep = Replayer()
            handler = OPS.get(op) if isinstance(op, str) else None
            if handler is None:
                wire.send(fd_out, {"error": f"unknown request {op!r}"})
                continue
            wire.send(fd_out, {"ok": True, **(handler(rep, msg) or {})})
        except (CudaError, ValueError, KeyError, TypeError, OSError) as exc:
            wire.send(fd_out, {"error": f"{type(exc).__name__}: {exc}"[:500]})


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])


def main() -> int:
    out = os.dup(1)
    os.dup2(2, 1)  # nothing but the protocol on the private descriptor
    return serve(0, out)


if __name__ == "__main__":
    sys.exit(main())
