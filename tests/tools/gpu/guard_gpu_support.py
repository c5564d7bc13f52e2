"""What the GPU verify's parent-side unit tests share (test_guard_gpu_arenas.py,
test_guard_gpu_checks.py, test_guard_gpu_timing.py): a stand-in driver (device memory is a CPU
byte tensor it keeps), stand-in replayers that run a Python "kernel" on the arena they were
handed, stand-in recorders and kids, torch on the CPU where the module names the GPU, and the
`drv` and `timed` fixtures."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu.verify import devmem, guard, guard_gpu

TOL = {"atol": 1e-3, "rtol": 1e-3}


class Driver:
    """cudadrv.Driver stand-in: shareable memory is a CPU byte tensor; its descriptor is a pipe
    (the replayer finds the memory by the descriptor's inode)."""

    def __init__(self) -> None:
        self.mem: dict[int, torch.Tensor] = {}
        self.by_inode: dict[int, int] = {}
        self.freed: list[tuple[int, int, Any]] = []
        self.sizes: list[int] = []
        self.next = 1 << 20
        self.synced = False  # set by a device synchronize, cleared by a replay

    def alloc_shareable(self, nbytes: int) -> tuple[int, int, Any, int]:
        ptr, self.next = self.next, self.next + nbytes + 4096
        self.mem[ptr] = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        r, w = os.pipe()
        os.close(w)
        self.by_inode[os.fstat(r).st_ino] = ptr
        self.sizes.append(nbytes)
        return ptr, nbytes, ("handle", ptr), r

    def import_shareable(self, fd: int, nbytes: int) -> tuple[int, Any]:
        """Another process's mapping of the memory `fd` shares: the same bytes."""
        ptr = self.by_inode[os.fstat(fd).st_ino]
        assert nbytes == self.mem[ptr].numel(), "mapped at another size than allocated"
        return ptr, ("imported", ptr)

    def free_shareable(self, ptr: int, nbytes: int, handle: Any) -> None:
        assert self.synced, "memory freed while the device may still use it"
        self.freed.append((ptr, nbytes, handle))


class CpuTorch:
    """torch, on the CPU: `device=` dropped, the CUDA array interface mapped to the stand-in
    driver's memory, synchronize a no-op."""

    def __init__(self, drv: Driver) -> None:
        self.drv = drv
        self.cuda = SimpleNamespace(synchronize=lambda: setattr(drv, "synced", True))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def as_tensor(self, mem: Any, device: str | None = None) -> torch.Tensor:
        iface = mem.__cuda_array_interface__
        assert (iface["typestr"], iface["version"], device) == ("|u1", 2, "cuda")
        t = self.drv.mem[iface["data"][0]]
        assert iface["shape"] == (t.numel(),)
        return t

    def empty(self, *a: Any, device: str | None = None, **kw: Any) -> torch.Tensor:
        assert device == "cuda" or a == ((),), "a tensor of the case lives on the GPU"
        return torch.empty(*a, **kw)

    def zeros(self, *a: Any, device: str | None = None, **kw: Any) -> torch.Tensor:
        assert device == "cuda", "a tensor of the case lives on the GPU"
        return torch.zeros(*a, **kw)


def f32(u8: torch.Tensor, binding: dict[str, list[Any]], name: str) -> torch.Tensor:
    _, off, n = binding[name]
    return u8[off : off + n].view(torch.float32)


def double(u8: torch.Tensor, binding: dict[str, list[Any]], call: int) -> None:
    """The honest kernel: a0 = 2 * in0 (float32)."""
    x = f32(u8, binding, "in0")
    f32(u8, binding, "a0")[: x.numel()] = x * 2


class Replayer:
    """A replay process stand-in: keeps the arenas it was handed (by descriptor) and the
    programs, runs `kernel` for each call asked, answers timings."""

    def __init__(self, drv: Driver, role: str, kernel: Callable[..., None] = double) -> None:
        self.drv, self.role, self.kernel = drv, role, kernel
        self.sock, self.peer = socket.socketpair()
        self.asked: list[dict[str, Any]] = []
        self.arenas: dict[str, torch.Tensor] = {}
        self.programs: dict[str, Any] = {}
        self.fail: str | None = None
        self.us = lambda: 3.0
        self.steps: dict[str, Any] = {}
        self.pings = 0

    def ask(self, msg: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], float]:
        self.asked.append(msg)
        op = msg["op"]
        if op == self.fail:
            return {"ok": False, "error": "x" * 400}, 0.0
        if op == "arena":
            _, fds, _, _ = socket.recv_fds(self.peer, 1, 1)
            ptr = self.drv.by_inode[os.fstat(fds[0]).st_ino]
            os.close(fds[0])
            self.arenas[msg["id"]] = self.drv.mem[ptr]
        elif op == "program":
            self.programs[msg["id"]] = msg["calls"]
            self.steps[msg["id"]] = msg["steps"]
        elif op == "capture":
            u8 = self.arenas[msg["id"]]
            for binding in self.programs[msg["id"]]:  # refilled: inputs written, outputs poison
                _, off, n = binding.get("a0", (None, 0, 0))
                assert u8[off : off + n].eq(0xFF).all(), "captured before the refill"
        elif op == "close_arena":
            del self.arenas[msg["id"]]
        elif op == "run":
            assert self.drv.synced, "replayed before this process's writes were done"
            self.drv.synced = False
            for c in msg["calls"]:
                self.kernel(self.arenas[msg["id"]], self.programs[msg["id"]][c], c)
        elif op == "time" and msg["id"] is None:
            assert kw == {"spin": True}
            self.pings += 1
            return {"ok": True}, 7.0
        elif op == "time":
            assert kw == {"spin": True}
            assert self.drv.synced, "timed before this process's writes were done"
            self.drv.synced = False
            for c, binding in enumerate(self.programs[msg["id"]]):
                self.kernel(self.arenas[msg["id"]], binding, c)
            return {"ok": True, "us": self.us() * len(self.programs[msg["id"]])}, 11.0
        return {"ok": True}, 1.0

    def ops(self) -> list[str]:
        return [m["op"] for m in self.asked]


class Ref:
    """The task's reference: y = 2x."""

    def reference(self, x: torch.Tensor, *scalars: Any) -> torch.Tensor:
        return x.float() * 2

    def output_spec(self, x: torch.Tensor, *scalars: Any) -> tuple[tuple[int, ...], Any]:
        return tuple(x.shape), torch.float32

    def bytes_moved(self, shape: dict[str, int], elem: int) -> int:
        assert type(elem) is int
        return 2 * shape["n"] * elem


class Ev:
    def __init__(self) -> None:
        self.ref, self.tolerances = Ref(), {"float32": TOL}
        self.salts: list[int] = []

    def case_shape(self, case: dict[str, Any]) -> dict[str, int]:
        return dict(case["shape"])

    def make(
        self, shape: dict[str, int], dtype: Any, salt: int
    ) -> tuple[list[Any], dict[str, Any]]:
        self.salts.append(salt)
        gen = torch.Generator().manual_seed(salt % (2**63))
        return [torch.randn(shape["n"], generator=gen, dtype=dtype), 3], {}


RECORDING = {
    "kernels": {"k0": {"id": "k0", "name": "double"}},
    "sizes": {"in0": None, "a0": 64 * 4},
    "steps": [{"op": "launch", "kernel": "k0"}],
    "output": {"buf": "a0", "offset": 0, "shape": [64], "strides": [1], "dtype": "float32"},
}


@pytest.fixture
def drv(monkeypatch: pytest.MonkeyPatch) -> Driver:
    d = Driver()
    monkeypatch.setattr(devmem, "_DRV", [d])
    return d


def verify(drv: Driver, *kids: Replayer, calls: int = 4) -> Any:
    judged: list[dict[str, Any]] = []
    window: list[Any] = []
    flushes: list[int] = []

    def judge_call(facts: dict[str, Any], out: Any, v: Any, tol: Any, where: str, now: list[Any]) -> dict[str, Any]:  # fmt: skip
        judged.append({"facts": facts, "out": None if out is None else out.clone(), "v": v,
                       "tol": tol, "where": where, "now": [t.clone() if isinstance(t, torch.Tensor) else t for t in now]})  # fmt: skip
        ok = (
            out is not None
            and out.shape == v.expected.shape
            and torch.allclose(out.float(), v.expected)
        )
        return {"passed": ok}

    return SimpleNamespace(
        torch=CpuTorch(drv), rng=random.Random(1), ev=Ev(), kids=list(kids), loaded={},
        replayers={k.role: k for k in kids}, judge_call=judge_call, judged=judged,
        env=SimpleNamespace(calls_per_window=lambda nbytes, **kw: window.append((nbytes, kw)) or calls,
                            flush_l2=lambda: flushes.append(1)),
        window=window, flushes=flushes,
    )  # fmt: skip


def variant(kind: str = "dev", n: int = 64, seed: int = 0) -> guard.Variant:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    return guard.Variant(kind, [x, 3], {}, torch, Ref())  # a scalar after the tensor


class Recorder:
    """A candidate's process stand-in: answers each record with `replies` in turn."""

    def __init__(self, role: str, *replies: dict[str, Any]) -> None:
        self.role, self.replies, self.asked = role, list(replies), []

    def ask(self, msg: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], float]:
        self.asked.append(msg)
        return self.replies.pop(0), 0.0


def cpu_count_bad(out: torch.Tensor, expected: torch.Tensor, tol: dict[str, float], counter: torch.Tensor) -> None:  # fmt: skip
    assert counter.dtype == torch.int32  # what the device kernel's atomic_add adds into
    d = (out.float() - expected).abs()
    counter += ((d > tol["atol"] + tol["rtol"] * expected.abs()) | d.isnan()).sum().int()


@pytest.fixture
def timed(drv: Driver, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)

    def run(*kids: Replayer, calls: int = 4) -> tuple[Any, dict[str, Any]]:
        vf = verify(drv, *kids, calls=calls)
        v = variant()
        first = guard_gpu.Layout(vf.torch, v)
        recs = {k.role: {first.sig: RECORDING} for k in kids}
        return vf, guard_gpu.time_samples(vf, list(kids), {"shape": {"n": 64}}, 2, first, recs, TOL)

    return run


class Lock:
    def __init__(self) -> None:
        self.held = 0

    @contextmanager
    def work(self) -> Any:
        self.held += 1
        yield


class Kid(Recorder):
    def ask(self, msg: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], float]:
        if msg["op"] == "end_case":
            self.asked.append(msg)
            return {"ok": True}, 0.0
        return super().ask(msg, **kw)
