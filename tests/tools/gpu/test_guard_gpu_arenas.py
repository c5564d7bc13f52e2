"""The GPU verify's parent side (tools/gpu/verify/guard_gpu.py) on the CPU: the arenas' layout,
views, sharing and freeing, and what each role's recording yields (each input signature recorded
once, a reply's reason codes, the seed's 31 bits, a forged recording). With the stand-ins of
guard_gpu_support.py; the real record -> replay -> check -> time path: tests/gpu/ (needs a GPU)."""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu import guard_gpu_support as support
from harnesslab.tests.tools.gpu.guard_gpu_support import (
    CpuTorch,
    Driver,
    Recorder,
    Replayer,
    variant,
    verify,
)
from harnesslab.tools.gpu.verify import guard, guard_gpu, guard_kid
from harnesslab.tools.gpu.verify.guard_schema import Bad

drv = support.drv  # the fixtures


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
