"""The GPU verify's parent side (tools/gpu/verify/guard_gpu.py) on the CPU: the timed samples
(which calls are checked, what is counted, when sampling stops, the A B B A order, the calls per
sample and the window asked for) and the clocks read from nvidia-smi. With the stand-ins of
guard_gpu_support.py; the real record -> replay -> check -> time path: tests/gpu/ (needs a GPU)."""

from __future__ import annotations

import random
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from harnesslab.tests.tools.gpu import guard_gpu_support as support
from harnesslab.tests.tools.gpu.guard_gpu_support import (
    RECORDING,
    TOL,
    Driver,
    Replayer,
    cpu_count_bad,
    double,
    f32,
    variant,
    verify,
)
from harnesslab.tools.gpu.verify import guard_gpu, guard_kid

drv, timed = support.drv, support.timed  # the fixtures


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
