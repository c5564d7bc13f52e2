"""The GPU verify's parent side (tools/gpu/verify/guard_gpu.py) on the CPU: the arenas' layout
and views, what each role's recording yields, the untimed checks of every call and the timed
samples (which calls are checked, what is counted, when sampling stops, the A B B A order),
with a stand-in driver (device memory is a CPU byte tensor it keeps), stand-in replayers that
run a Python "kernel" on the arena they were handed, and torch on the CPU where the module names
the GPU. The real record -> replay -> check -> time path: tests/gpu/ (needs a GPU)."""

from __future__ import annotations

import itertools
import os
import random
import socket
import stat
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu.verify import guard, guard_gpu, guard_kid
from harnesslab.tools.gpu.verify.guard_schema import Bad

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
    monkeypatch.setattr(guard_gpu, "_DRV", [d])
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


# ----------------------------------------------------------------------------------------------
# arenas


def test_an_arena_lays_out_every_buffer_aligned_apart_in_a_random_order(drv: Driver) -> None:
    t = CpuTorch(drv)
    calls = [{"in0": 0, "in1": 0, "a0": 1000, "a1": 0}, {"in0": 0, "in1": 0, "a0": 1000, "a1": 0}]
    arena = guard_gpu.Arena(t, random.Random(3), calls, [300, 513])
    spans = sorted(span for where in arena.where for span in where.values())
    assert len(spans) == 8 and all(off % guard_gpu.ALIGN == 0 for off, _ in spans)
    for (off, n), (nxt, _) in itertools.pairwise(spans):
        assert off + max(n, 1) <= nxt  # no overlap; an empty buffer still takes room
    assert spans[-1][0] + max(spans[-1][1], 1) <= arena.nbytes == drv.sizes[0]
    assert arena.nbytes % guard_gpu.ALIGN == 0
    assert (arena.where[0]["in0"][1], arena.where[1]["in1"][1], arena.where[0]["a0"][1]) == (
        300,
        513,
        1000,
    )
    assert arena.where[0]["a1"][1] == 0
    layouts = {tuple(sorted(guard_gpu.Arena(t, random.Random(s), calls, [300, 513]).where[0].items())) for s in range(6)}  # fmt: skip
    assert len(layouts) > 1  # random gaps and order
    orders = {tuple(sorted(a.where[0], key=lambda k: a.where[0][k][0]))
              for a in (guard_gpu.Arena(t, random.Random(s), calls, [300, 513]) for s in range(8))}  # fmt: skip
    assert len(orders) > 1
    assert arena.binding("x", 1) == {k: ["x", off, n] for k, (off, n) in arena.where[1].items()}
    empty = guard_gpu.Arena(t, random.Random(0), [{}], [])
    assert empty.nbytes == guard_gpu.ALIGN and empty.where == [{}]


def test_an_arena_past_its_limit_is_refused(drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guard_gpu, "MAX_ARENA", 4096)
    monkeypatch.setattr(random.Random, "randrange", lambda self, a, b=None: 0)
    guard_gpu.Arena(CpuTorch(drv), random.Random(0), [{"a0": 4096}], [])
    with pytest.raises(Bad) as err:
        guard_gpu.Arena(CpuTorch(drv), random.Random(0), [{"a0": 4097}], [])
    assert err.value.code == "runner_failed"


def test_a_view_stays_inside_its_buffer(drv: Driver) -> None:
    arena = guard_gpu.Arena(CpuTorch(drv), random.Random(0), [{"a0": 64, "a1": 64}], [])
    start = arena.where[0]["a0"][0]
    v = arena.view(0, "a0", torch.float32, [4, 4])
    assert v.stride() == (4, 1) and v.data_ptr() == arena.u8[start:].data_ptr()
    v.fill_(1.5)
    assert torch.equal(arena.view(0, "a0", torch.float32, [16]), torch.full((16,), 1.5))
    t = arena.view(0, "a0", torch.float32, [2, 3], [1, 2], 8)
    assert t.stride() == (1, 2) and t.data_ptr() == v.data_ptr() + 8
    assert arena.view(0, "a0", torch.float32, [0, 4], None, 64).numel() == 0
    assert arena.view(0, "a0", torch.float16, [32]).numel() == 32
    for shape, strides, offset in (([17], None, 0), ([16], None, 4), ([4, 4], [1, 5], 0),
                                   ([2], None, 2), ([1], None, 64)):  # fmt: skip
        with pytest.raises(Bad) as err:
            arena.view(0, "a0", torch.float32, shape, strides, offset)
        assert err.value.code == "forged_recording"
    arena.fill(0, "a1", 0xFF)
    assert arena.view(0, "a1", torch.float32, [16]).isnan().all()
    assert not arena.view(0, "a0", torch.float32, [16]).isnan().any()
    assert guard_gpu._contiguous([2, 3, 4]) == [12, 4, 1] and guard_gpu._contiguous([0, 5]) == [
        5,
        1,
    ]
    assert guard_gpu._contiguous([3, 0, 2]) == [2, 2, 1] and guard_gpu._contiguous([]) == []


def test_an_arena_is_shared_by_descriptor_and_freed(drv: Driver) -> None:
    arena = guard_gpu.Arena(CpuTorch(drv), random.Random(0), [{"a0": 64}], [])
    rp = Replayer(drv, "candidate")
    arena.share(rp, "c0")
    assert rp.asked == [{"op": "arena", "id": "c0", "nbytes": arena.nbytes}]
    assert rp.arenas["c0"] is arena.u8
    fd = arena.fd
    arena.free()
    assert drv.freed == [(arena.ptr, arena.nbytes, ("handle", arena.ptr))]
    with pytest.raises(OSError):
        os.fstat(fd)
    assert not hasattr(arena, "u8")


def test_a_replayer_that_says_no_fails_the_role(drv: Driver) -> None:
    rp = Replayer(drv, "incumbent")
    assert guard_gpu.ask_ok(rp, {"op": "hello"}) == ({"ok": True}, 1.0)
    rp.fail = "hello"
    with pytest.raises(guard_kid.KidFailed) as err:
        guard_gpu.ask_ok(rp, {"op": "hello"})
    assert (err.value.code, err.value.role, str(err.value)) == ("runner_failed", "incumbent", "replay: " + "x" * 300)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# recordings


class Recorder:
    """A candidate's process stand-in: answers each record with `replies` in turn."""

    def __init__(self, role: str, *replies: dict[str, Any]) -> None:
        self.role, self.replies, self.asked = role, list(replies), []

    def ask(self, msg: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], float]:
        self.asked.append(msg)
        return self.replies.pop(0), 0.0


def test_each_role_records_each_input_signature_once(drv: Driver) -> None:
    good = {"recording": {"kernels": [], "steps": [], "output": None}}
    cand = Recorder("candidate", good, good)
    inc = Recorder("incumbent", good, good)
    vf = verify(drv)
    vf.kids = [cand, inc]
    variants = [variant("dev"), variant("edge", seed=1), variant("odd", n=63)]
    recordings: dict[str, Any] = {}
    codes: dict[str, Any] = {}
    guard_gpu._record(vf, variants, recordings, codes)
    assert [len(k.asked) for k in (cand, inc)] == [2, 2]
    msg = cand.asked[1]
    assert (msg["op"], msg["args"], msg["kwargs"]) == (
        "record",
        guard.arg_specs(torch, variants[2]),
        {},
    )
    assert 0 <= msg["seed"] < 2**31 and msg["seed"] != cand.asked[0]["seed"]
    assert set(recordings["candidate"]) == {variants[0].signature(), variants[2].signature()}
    assert recordings["candidate"][variants[0].signature()]["steps"] == []
    assert codes == {"candidate": [], "incumbent": []}


def test_what_a_recording_reply_says_becomes_reason_codes(drv: Driver) -> None:
    vf = verify(drv)
    replies = [
        {"error": "ValueError", "recording": {"kernels": "not validated"}, "codes": ["host_sync"]},
        {"aliases_input": True, "recording": {"steps": 5}},
    ]
    vf.kids = [Recorder("candidate", *replies)]
    recordings: dict[str, Any] = {}
    codes: dict[str, Any] = {}
    guard_gpu._record(vf, [variant("dev"), variant("edge", n=8)], recordings, codes)
    got = codes["candidate"]
    assert [c[0] for c in got] == [*(c[0] for c in guard.child_codes(replies[0], "x")), "candidate_error", "output_aliases_input", "forged_recording"]  # fmt: skip
    assert ["candidate_error", "dev recording: the entry function raised ValueError"] in got
    assert ["output_aliases_input", "edge recording: the output shares an input's storage"] in got
    assert got[-1][1].startswith("edge recording: ")
    assert list(recordings["candidate"].values()) == [None, None]


# ----------------------------------------------------------------------------------------------
# the untimed checks


def test_every_call_is_replayed_on_its_own_arena_and_judged_here(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    variants = [variant("dev"), variant("edge", seed=2)]
    recs = {v.signature(): RECORDING for v in variants}
    rec: dict[str, Any] = {"calls": []}
    guard_gpu.check_calls(vf, rp, rec, variants, recs, TOL, 3)
    assert rec["calls"] == [
        {"passed": True, "role": "candidate", "kind": "dev", "set": 0, "wall_us": 1.0},
        {"passed": True, "role": "candidate", "kind": "edge", "set": 1, "wall_us": 1.0},
    ]
    assert rp.ops() == ["kernels", "arena", "program", "run", "close_arena",
                        "arena", "program", "run", "close_arena"]  # fmt: skip
    assert rp.asked[0]["kernels"] == [RECORDING["kernels"]["k0"]] and vf.loaded == {
        "candidate": {"k0"}
    }
    ids = [m["id"] for m in rp.asked if m["op"] == "program"]
    assert ids == ["c3_0", "c3_1"]
    prog = rp.asked[2]
    assert prog["steps"] == RECORDING["steps"] and prog["calls"] == [rp.programs["c3_0"][0]]
    assert {m["op"]: m.get("calls") for m in rp.asked if m["op"] == "run"} == {"run": [0]}
    first = vf.judged[0]
    assert first["facts"] == {"plain": True, "own_launches": 1}
    assert torch.equal(first["out"], variants[0].pristine[0] * 2) and first["where"] == "dev call 0"
    assert torch.equal(first["now"][0], variants[0].pristine[0]) and first["tol"] is TOL
    assert len(drv.freed) == 2 and len(drv.sizes) == 2


def test_an_unwritten_output_is_poison_and_a_changed_input_is_seen(drv: Driver) -> None:
    def lazy(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
        f32(u8, binding, "in0").zero_()  # writes no output, changes its input

    rp = Replayer(drv, "candidate", lazy)
    vf = verify(drv, rp)
    v = variant()
    rec: dict[str, Any] = {"calls": []}
    guard_gpu.check_calls(vf, rp, rec, [v], {v.signature(): RECORDING}, TOL, 0)
    judged = vf.judged[0]
    assert judged["out"].isnan().all() and judged["now"][0].eq(0).all()
    assert rec["calls"][0]["passed"] is False


@pytest.mark.parametrize(
    ("output", "steps", "facts", "out"),
    [
        ({"empty": True, "shape": [0, 3], "dtype": "float16"}, [{"op": "x"}], {"plain": True, "own_launches": 1}, (0, 3)),
        ({"buf": "in0", "offset": 0, "shape": [64], "strides": [1], "dtype": "float32"}, [{"op": "x"}],
         {"plain": True, "own_launches": 1, "aliases_input": True}, None),
        (None, [{"op": "x"}], {"plain": False, "own_launches": 1}, None),
        (RECORDING["output"], [], {"plain": True, "own_launches": 0}, (64,)),
    ],
)  # fmt: skip
def test_what_the_recorded_output_says_reaches_the_judge(
    drv: Driver, output: Any, steps: list[Any], facts: dict[str, Any], out: Any
) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    v = variant()
    r = {**RECORDING, "output": output, "steps": steps}
    guard_gpu.check_calls(vf, rp, {"calls": []}, [v], {v.signature(): r}, TOL, 0)
    judged = vf.judged[0]
    assert judged["facts"] == facts
    assert (None if judged["out"] is None else tuple(judged["out"].shape)) == out
    if out == (0, 3):
        assert judged["out"].dtype == torch.float16


def test_an_empty_expected_output_with_no_steps_is_still_its_own_launch(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    v = variant(n=0)
    r = {**RECORDING, "output": {"empty": True, "shape": [0], "dtype": "float32"}, "steps": []}
    guard_gpu.check_calls(vf, rp, {"calls": []}, [v], {v.signature(): r}, TOL, 0)
    assert vf.judged[0]["facts"]["own_launches"] == 1


def test_kernels_are_sent_to_a_replayer_once(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    vf = verify(drv, rp)
    k1 = {"id": "k1", "name": "other"}
    assert guard_gpu._load(vf, "candidate", {"k0": RECORDING["kernels"]["k0"]}) is rp
    guard_gpu._load(vf, "candidate", {"k0": RECORDING["kernels"]["k0"], "k1": k1})
    guard_gpu._load(vf, "candidate", {"k1": k1})
    assert [m["kernels"] for m in rp.asked] == [[RECORDING["kernels"]["k0"]], [k1]]


def test_a_failed_replay_still_frees_every_arena(drv: Driver) -> None:
    rp = Replayer(drv, "candidate")
    rp.fail = "run"
    vf = verify(drv, rp)
    vs = [variant(), variant("edge", seed=4)]
    with pytest.raises(guard_kid.KidFailed):
        guard_gpu.check_calls(vf, rp, {"calls": []}, vs, {v.signature(): RECORDING for v in vs}, TOL, 0)  # fmt: skip
    assert len(drv.freed) == 2


# ----------------------------------------------------------------------------------------------
# the timed samples


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


def test_an_honest_kernel_is_timed_to_a_stable_median_and_checked(timed: Any, drv: Driver) -> None:
    a, b = Replayer(drv, "candidate"), Replayer(drv, "incumbent")
    _vf, out = timed(a, b)
    rec = out["candidate"]
    assert rec["samples_us"] == [3.0] * guard_gpu.MIN_SAMPLES
    assert rec["parent_wall_us"] == [4.0] * guard_gpu.MIN_SAMPLES  # 11 minus the overhead, 7
    assert rec["wake_wall_us"] == [7.0] * guard_gpu.MIN_SAMPLES and rec["overhead_us"] == 7.0
    assert (rec["bad_calls"], rec["inputs_modified"], rec["codes"]) == (0, 0, [])
    assert rec["checked_calls"] == 4 * (guard_gpu.MIN_SAMPLES + 1)
    assert (rec["calls_per_sample"], rec["input_sets"], rec["method"]) == (
        4,
        4,
        "cuda_graph_replay",
    )
    assert out["incumbent"]["samples_us"] == rec["samples_us"]
    assert a.ops()[:5] == ["kernels", "arena", "program", "capture", "time"]
    assert a.asked[2]["id"] == "t2" and len(a.asked[2]["calls"]) == 4
    assert a.ops().count("close_arena") == 1 and len(drv.freed) == 2


def test_the_roles_alternate_a_b_b_a(timed: Any, drv: Driver) -> None:
    seen: list[str] = []

    def role_kernel(role: str) -> Callable[..., None]:
        def k(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
            if call == 0:
                seen.append(role)
            double(u8, binding, call)

        return k

    a = Replayer(drv, "candidate", role_kernel("A"))
    b = Replayer(drv, "incumbent", role_kernel("B"))
    timed(a, b)
    assert "".join(seen[:10]) == "ABBAABBAAB"


def test_unstable_samples_run_to_the_cap(timed: Any, drv: Driver) -> None:
    a = Replayer(drv, "candidate")
    noise = random.Random(5)
    a.us = lambda: noise.uniform(1, 9)
    _, out = timed(a)
    assert len(out["candidate"]["samples_us"]) == guard_gpu.SAMPLES


def test_wrong_outputs_and_changed_inputs_are_counted_among_the_checked(
    timed: Any, drv: Driver
) -> None:
    def some_wrong(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
        double(u8, binding, call)
        if call == 1:
            f32(u8, binding, "a0")[0] += 1
        if call == 2:
            f32(u8, binding, "in0")[0] = float("nan")

    _, out = timed(Replayer(drv, "candidate", some_wrong))
    rec = out["candidate"]
    n = guard_gpu.MIN_SAMPLES + 1
    assert (rec["bad_calls"], rec["inputs_modified"]) == (n, n)
    assert rec["codes"] == [["inputs_modified", f"{n} timed calls changed their inputs"]]


def test_only_checked_calls_are_counted_and_they_are_drawn_each_sample(
    timed: Any, drv: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_gpu, "CHECKED", 2)
    drawn: list[list[int]] = []
    real = random.Random.sample
    monkeypatch.setattr(random.Random, "sample", lambda self, pop, k: drawn.append(s := real(self, pop, k)) or s)  # fmt: skip

    def wrong_on_3(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
        double(u8, binding, call)
        if call == 3:
            f32(u8, binding, "a0").fill_(0)

    _, out = timed(Replayer(drv, "candidate", wrong_on_3), calls=6)
    rec = out["candidate"]
    assert all(len(d) == 2 for d in drawn) and len({tuple(d) for d in drawn}) > 1
    assert rec["bad_calls"] == sum(3 in d for d in drawn) and rec["checked_calls"] == 2 * len(drawn)


def test_an_unwritten_or_missing_output_is_a_bad_call(timed: Any, drv: Driver) -> None:
    _, out = timed(Replayer(drv, "candidate", lambda u8, b, c: None))
    assert out["candidate"]["bad_calls"] == 4 * (guard_gpu.MIN_SAMPLES + 1)


@pytest.mark.parametrize(
    ("output", "bad"),
    [({"empty": True, "shape": [0], "dtype": "float32"}, True),
     (None, True),
     ({"buf": "in0", "offset": 0, "shape": [64], "strides": [1], "dtype": "float32"}, True),
     ({"buf": "a0", "offset": 0, "shape": [8, 8], "strides": [8, 1], "dtype": "float32"}, True),
     ({"buf": "a0", "offset": 0, "shape": [64], "strides": [1], "dtype": "float32"}, False)],
)  # fmt: skip
def test_what_the_output_is_decides_a_checked_call(drv: Driver, output: Any, bad: bool, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    vf = verify(drv)
    arena = guard_gpu.Arena(vf.torch, vf.rng, [{"in0": 0, "a0": 256}], [256])
    made = guard_gpu._refill(vf, arena, 1, {"n": 64}, torch.float32, 0, 1)
    double(arena.u8, arena.binding("x", 0), 0)
    r = {**RECORDING, "output": output}
    assert guard_gpu._check(vf, arena, r, [0], made, TOL) == (int(bad), 0)


def test_an_empty_output_where_the_reference_is_empty_is_right(drv: Driver) -> None:
    vf = verify(drv)
    arena = guard_gpu.Arena(vf.torch, vf.rng, [{"in0": 0}], [0])
    made = guard_gpu._refill(vf, arena, 1, {"n": 0}, torch.float32, 0, 1)
    r = {**RECORDING, "output": {"empty": True, "shape": [0], "dtype": "float32"}}
    assert guard_gpu._check(vf, arena, r, [0], made, TOL) == (0, 0)
    r = {**RECORDING, "output": {"buf": "in0", "offset": 0, "shape": [0], "strides": [1], "dtype": "float32"}}  # fmt: skip
    assert guard_gpu._check(vf, arena, r, [0], made, TOL) == (1, 0)


def test_each_refill_draws_fresh_inputs_and_poisons_the_rest(drv: Driver) -> None:
    vf = verify(drv)
    arena = guard_gpu.Arena(vf.torch, vf.rng, [{"in0": 0, "a0": 256}] * 3, [256])
    made = guard_gpu._refill(vf, arena, 3, {"n": 64}, torch.float32, 1, 2)
    for c in range(3):
        assert torch.equal(arena.view(c, "in0", torch.float32, [64]), made[c][0][0])
        assert arena.view(c, "a0", torch.float32, [64]).isnan().all()
    assert not torch.equal(made[0][0][0], made[1][0][0])
    salts = vf.ev.salts
    again = guard_gpu._refill(vf, arena, 3, {"n": 64}, torch.float32, 1, 2)
    assert not torch.equal(again[0][0][0], made[0][0][0]) and len(set(vf.ev.salts)) == 6
    base = [1 * 1009 + 10_000 + 2 * 1_000 + c for c in range(3)]
    assert all((s ^ b) < (1 << 30) for s, b in zip(salts[:3], base, strict=True))
    assert all(s >> 30 == b >> 30 for s, b in zip(salts[:3], base, strict=True))


def test_the_calls_per_sample_fit_half_an_arena(timed: Any, drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    per_call = 256 + 256  # the input and the output of one call
    monkeypatch.setattr(random.Random, "randrange", lambda self, a, b=None: 0)  # no gaps
    monkeypatch.setattr(guard_gpu, "MAX_ARENA", 2 * 3 * per_call)
    _, out = timed(Replayer(drv, "candidate"), calls=100)
    assert out["candidate"]["calls_per_sample"] == 3
    monkeypatch.setattr(guard_gpu, "MAX_ARENA", 2 * per_call)
    _, out = timed(Replayer(drv, "candidate"), calls=100)
    assert out["candidate"]["calls_per_sample"] == 2
    monkeypatch.setattr(guard_gpu, "MAX_ARENA", 1 << 30)
    _, out = timed(Replayer(drv, "candidate"), calls=1)
    assert out["candidate"]["calls_per_sample"] == 2


def test_a_failed_timing_still_closes_and_frees_every_arena(timed: Any, drv: Driver) -> None:
    a = Replayer(drv, "candidate")
    a.fail = "capture"
    with pytest.raises(guard_kid.KidFailed):
        timed(a)
    assert a.ops()[-1] == "close_arena" and len(drv.freed) == 1


# ----------------------------------------------------------------------------------------------
# one case, with its record


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


def test_a_case_records_checks_and_hands_a_timer_only_to_what_passed(
    drv: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    good = {"recording": {"kernels": [], "steps": [{"op": "memset", "buf": "a0", "offset": 0, "width": 1,
                                                    "value": 0, "count": 1}],
                          "output": RECORDING["output"], "allocs": [{"nbytes": 256}]}}  # fmt: skip
    half = {"recording": {**good["recording"], "output": {**RECORDING["output"], "shape": [32]}}}
    cand, inc = (
        Kid("candidate", good, half),
        Kid("incumbent", {"error": "KeyError"}, {"error": "KeyError"}),
    )
    reps = {"candidate": Replayer(drv, "candidate"), "incumbent": Replayer(drv, "incumbent")}
    vf = verify(drv)
    vf.kids, vf.replayers, vf.lock = [cand, inc], reps, Lock()
    phases: list[str] = []

    @contextmanager
    def phase(name: str) -> Any:
        phases.append(name)
        yield

    vf.phases = phase
    vf.case_record = lambda case, variants: {"name": case["name"], "calls": []}
    case = {"name": "c", "dtype": "float32", "shape": {"n": 64}}
    rec, timer = guard_gpu.gpu_case(vf, case, 5, [variant(), variant("edge", n=32)])
    assert phases == ["record", "check"] and vf.lock.held == 1
    assert vf.ev.salts == [5 * 1009 + 991]
    assert [(c["role"], c["kind"], c["passed"]) for c in rec["calls"]] == [
        ("incumbent", "record", False), ("candidate", "dev", True), ("candidate", "edge", True),
        ("candidate", "recheck", True)]  # fmt: skip
    assert rec["calls"][0]["set"] == -1 and rec["calls"][0]["codes"][0][0] == "candidate_error"
    assert [m["op"] for m in cand.asked] == ["record", "record", "end_case"]  # two signatures
    assert inc.asked[-1] == {"op": "end_case"}
    out = timer()  # at the first variant's shape (the case's), not the edge's
    assert set(out) == {"candidate"} and out["candidate"]["bad_calls"] == 0
    vf.kids = [inc, cand]  # the order of the verify's roles, not the timer's, at the window
    assert set(timer()) == {"candidate"}


def test_a_case_the_candidate_fails_has_no_timer(drv: Driver) -> None:
    cand = Kid("candidate", {"error": "KeyError"}, {"error": "KeyError"})
    vf = verify(drv)
    vf.kids, vf.lock = [cand], Lock()
    vf.phases = lambda name: Lock().work()
    vf.case_record = lambda case, variants: {"calls": []}
    rec, timer = guard_gpu.gpu_case(vf, {"dtype": "float32", "shape": {"n": 64}}, 0, [variant()])
    assert timer is None and rec["calls"][0]["role"] == "candidate"


# ----------------------------------------------------------------------------------------------
# clocks


def test_clocks_reads_nvidia_smi_or_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert guard_gpu.clocks() == {}
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\necho "1980 MHz, 2619 MHz,1980 MHz, 41, 120.50 W, P0"\n')  # fmt: skip
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert guard_gpu.clocks() == {
        "clocks.sm": "1980 MHz", "clocks.mem": "2619 MHz", "clocks.max.sm": "1980 MHz",
        "temperature.gpu": "41", "power.draw": "120.50 W", "pstate": "P0"}  # fmt: skip
    assert (tmp_path / "args").read_text().split() == [
        "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,pstate",
        "--format=csv,noheader", "-i", "0"]  # fmt: skip
    smi.write_text("#!/bin/sh\nexit 0\n")
    assert guard_gpu.clocks() == {}


def test_the_window_asks_what_timing_needs(timed: Any, drv: Driver) -> None:
    a = Replayer(drv, "candidate")
    vf, _ = timed(a)
    assert vf.window == [(2 * 64 * 4, {"floor_us": 2.0, "lo": 2, "hi": guard_gpu.MAX_CALLS})]
    samples = guard_gpu.MIN_SAMPLES + 1
    assert len(vf.flushes) == samples and a.pings == 5 + samples
    assert a.steps == {"t2": RECORDING["steps"]} and a.arenas == {}


def test_sampling_goes_on_until_every_role_is_stable(timed: Any, drv: Driver) -> None:
    a, b = Replayer(drv, "candidate"), Replayer(drv, "incumbent")
    noise = random.Random(7)
    a.us = lambda: noise.uniform(1, 9)
    _, out = timed(a, b)
    assert [len(out[r]["samples_us"]) for r in ("candidate", "incumbent")] == [
        guard_gpu.SAMPLES
    ] * 2


def test_the_calls_per_sample_follow_the_first_roles_recording(
    drv: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    monkeypatch.setattr(random.Random, "randrange", lambda self, a, b=None: 0)  # no gaps
    monkeypatch.setattr(guard_gpu, "MAX_ARENA", 2 * 8 * 512)  # 8 of the first role's calls
    a, b = Replayer(drv, "candidate"), Replayer(drv, "incumbent")
    vf = verify(drv, a, b, calls=100)
    v = variant()
    first = guard_gpu.Layout(vf.torch, v)
    assert (first.sig, first.dtype, first.in_bytes) == (v.signature(), torch.float32, [256])
    bigger = {**RECORDING, "sizes": {"in0": None, "a0": 256, "a1": 256}}  # 768 bytes a call
    recs = {"candidate": {first.sig: RECORDING}, "incumbent": {first.sig: bigger}}
    out = guard_gpu.time_samples(vf, [a, b], {"shape": {"n": 64}}, 0, first, recs, TOL)
    assert [out[r]["calls_per_sample"] for r in ("candidate", "incumbent")] == [8, 8]


def test_a_case_with_no_bytes_per_call_still_gets_its_calls(timed: Any, drv: Driver, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    a = Replayer(drv, "candidate", lambda u8, b, c: None)
    vf = verify(drv, a, calls=3)
    v = variant(n=0)
    first = guard_gpu.Layout(vf.torch, v)
    empty = {**RECORDING, "sizes": {"in0": None}, "output": {"empty": True, "shape": [0], "dtype": "float32"}}  # fmt: skip
    out = guard_gpu.time_samples(vf, [a], {"shape": {"n": 0}}, 0, first, {"candidate": {first.sig: empty}}, TOL)  # fmt: skip
    assert out["candidate"]["calls_per_sample"] == 3 and out["candidate"]["bad_calls"] == 0


def test_a_candidate_must_pass_every_call_to_be_timed_and_so_must_an_incumbent(
    drv: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_gpu, "_count_bad", cpu_count_bad)
    good = {"recording": {"kernels": [], "steps": [], "output": RECORDING["output"], "allocs": [{"nbytes": 256}]}}  # fmt: skip

    def wrong_second() -> Callable[..., None]:
        """Right on its first call, wrong on its second."""
        runs: list[int] = []

        def kernel(u8: torch.Tensor, binding: dict[str, Any], call: int) -> None:
            runs.append(1)
            double(u8, binding, call)
            if len(runs) == 2:
                f32(u8, binding, "a0")[0] += 1

        return kernel

    def case(kernels: dict[str, Any], kids: list[str]) -> Any:
        vf = verify(drv)
        vf.kids = [Kid(role, good, good) for role in kids]
        vf.replayers = {role: Replayer(drv, role, k) for role, k in kernels.items()}
        vf.lock, vf.phases = Lock(), lambda name: Lock().work()
        vf.case_record = lambda case, variants: {"calls": []}
        return vf, guard_gpu.gpu_case(vf, {"dtype": "float32", "shape": {"n": 64}}, 1, [variant()])

    _, (rec, timer) = case({"candidate": wrong_second()}, ["candidate"])
    assert [c["passed"] for c in rec["calls"]] == [True, False] and timer is None
    vf, (rec, timer) = case(
        {"candidate": double, "incumbent": wrong_second()}, ["candidate", "incumbent"]
    )
    assert set(timer()) == {"candidate"}
    vf, (rec, timer) = case({"candidate": double, "incumbent": double}, ["candidate", "incumbent"])
    vf.kids = vf.kids[:1]  # the incumbent was dropped before the window
    assert set(timer()) == {"candidate"}


def test_every_recording_seed_fits_31_bits(drv: Driver) -> None:
    good = {"recording": {"kernels": [], "steps": [], "output": None}}
    kid = Recorder("candidate", *[good] * 24)
    vf = verify(drv)
    vf.kids = [kid]
    guard_gpu._record(vf, [variant(n=n) for n in range(1, 25)], {}, {})
    assert len(kid.asked) == 24 and all(0 <= m["seed"] < 2**31 for m in kid.asked)


def test_a_recording_that_names_a_scalar_as_an_input_is_forged(drv: Driver) -> None:
    rec = {"kernels": [{"id": "k0", "name": "k", "cubin": "AA", "shared": 0, "num_warps": 4}],
           "steps": [{"op": "launch", "kernel": "k0", "grid": [1, 1, 1],
                      "params": [{"k": "ptr", "buf": "in1", "offset": 0}]}], "output": None}  # fmt: skip
    vf = verify(drv)
    vf.kids = [Recorder("candidate", {"recording": rec})]
    codes: dict[str, Any] = {}
    guard_gpu._record(vf, [variant()], {}, codes)  # in1 is the scalar 3
    assert [c[0] for c in codes["candidate"]] == ["forged_recording"]


def test_clocks_reads_the_first_line_and_what_it_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("PATH", str(tmp_path))
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '1, 2'\necho '3, 4, 5, 6, 7, 8'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert guard_gpu.clocks() == {"clocks.sm": "1", "clocks.mem": "2"}


def test_a_hung_nvidia_smi_costs_ten_seconds_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import subprocess

    asked: list[dict[str, Any]] = []

    def run(argv: list[str], **kw: Any) -> Any:
        asked.append(kw)
        raise subprocess.TimeoutExpired(argv, kw.get("timeout") or 0)

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", run)
    assert guard_gpu.clocks() == {}
    assert asked == [{"capture_output": True, "text": True, "timeout": 10}]
