"""The runner's timing (tools/gpu/timing.py) where a CPU reaches it: which method a case gets,
how many input sets and back-to-back calls a sample holds, the copy bandwidth measured once,
what a timed case reports (the interpreter's path, on a wall clock), and a request's phases
(exclusive, each charged its sync). An Env is built without its __init__ (which would set
TRITON_INTERPRET for the process): each test sets the fields the method reads. The GPU regimes
(isolated samples, CUDA graphs, the L2 flush) run on a GPU: tests/gpu/.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import types
from typing import Any

import pytest
import torch

from harnesslab.tools.gpu import timing


def env(copy_gbps: float | None = 1000.0, l2_bytes: int = 50 << 20) -> timing.Env:
    e = timing.Env.__new__(timing.Env)
    e.torch, e.interpret, e.device = torch, True, "cpu"
    e._copy_gbps, e.l2_bytes = copy_gbps, l2_bytes
    e._flush_buf = e._flush_out = None
    return e


# -- how a case is timed --------------------------------------------------------------------------
def test_method_isolated_from_fifteen_microseconds_at_copy_speed() -> None:
    """Rule: a case whose bytes take >= ISOLATED_MIN_US at copy speed is timed one call per
    sample; a shorter one in back-to-back graph replays. At 1000 GB/s, 1e3 bytes take 1 us."""
    e = env(1000.0)
    assert timing.Env.ISOLATED_MIN_US == 15.0
    assert e.method_for(15_000_000) == "isolated"  # 15 us exactly
    assert e.method_for(14_999_000) == "cuda_graph"
    assert e.method_for(30_000_000) == "isolated"


@pytest.mark.parametrize(
    "nbytes, l2, sets",
    [
        (40 << 20, 40 << 20, 3),  # 2.5x L2 needs 3 sets of L2's size
        (100 << 20, 40 << 20, 2),  # one set is already past 2.5x L2: still two
        (1 << 20, 40 << 20, 64),  # 100 sets wanted: capped at 64
        (10 << 20, 40 << 20, 10),  # exactly 2.5x L2
        (1 << 30, 40 << 30, 4),  # the ~4 GB memory cap
        (3 << 30, 40 << 30, 2),  # past the memory cap: never below two
        (0, 0, 2),
    ],
)
def test_sets_needed(nbytes: int, l2: int, sets: int) -> None:
    """Rule: the rotation of input sets exceeds 2.5x L2 (so L2 never holds the inputs), with
    at least 2 sets, at most 64, and about 4 GB of inputs at most."""
    assert env(l2_bytes=l2).sets_needed(nbytes) == sets


def test_calls_per_window_make_about_a_quarter_of_a_millisecond() -> None:
    """Rule: ceil(WINDOW_US (250 us) / the call's time at copy speed), the call's time at least
    floor_us, the count within [lo, hi]: the runner's graphs and the guarded verify's windows."""
    assert timing.WINDOW_US == 250.0
    e = env(1000.0)
    assert e.calls_per_window(3_000_000, floor_us=1.0, lo=1, hi=2000) == 84  # 3 us a call
    assert e.calls_per_window(1_000, floor_us=1.0, lo=1, hi=2000) == 250  # the floor: 1 us
    assert e.calls_per_window(1_000, floor_us=4.0, lo=1, hi=2000) == 63
    assert e.calls_per_window(1_000, floor_us=0.1, lo=1, hi=2000) == 2000  # capped at hi
    assert e.calls_per_window(10**10, floor_us=1.0, lo=3, hi=2000) == 3  # raised to lo


def test_graph_calls_are_a_multiple_of_the_rotation() -> None:
    """Rule: about GRAPH_WINDOW_US (125 us: half the guarded verify's windows) of calls at copy
    speed, rounded up to a whole number of rotations."""
    assert timing.GRAPH_WINDOW_US == 125.0
    e = env(1000.0)
    assert e.graph_calls(3_000_000, 7) == 42  # 42 is already a multiple of 7
    assert e.graph_calls(3_000_000, 5) == 45  # 42 rounded up to a multiple of 5
    assert e.graph_calls(10**10, 5) == 5  # never fewer than one rotation
    assert e.graph_calls(1_000, 3) == 126  # the 1 us floor: 125 calls, rounded up
    assert e.calls_per_window(3_000_000, floor_us=1.0, lo=1, hi=2000, window_us=125.0) == 42


def test_the_copy_bandwidth_is_measured_once() -> None:
    e = env(None)
    calls: list[dict[str, Any]] = []

    def time_fn(fn: Any, **kw: Any) -> list[float]:
        calls.append(kw)
        fn()
        return [8.0, 2.0, 4.0]  # us; median 4

    e.time_fn = time_fn  # type: ignore[method-assign]
    half = 8 << 20
    assert e.copy_gbps() == pytest.approx(2 * half / (4.0 * 1e3))  # read + written, per us
    assert e.copy_gbps() == pytest.approx(2 * half / (4.0 * 1e3))
    assert calls == [{"calls": 1, "samples": 3, "warmup": 1}]


def test_time_fn_times_back_to_back_calls_per_call() -> None:
    """Rule: each sample is one window of `calls` calls divided by `calls`; warmup calls run
    first, outside every window."""
    e = env()
    log: list[str] = []
    windows: list[int] = []

    def window(work: Any) -> float:
        before = len(log)
        work()
        windows.append(len(log) - before)
        return 12.0

    e.window = window  # type: ignore[method-assign]
    got = e.time_fn(lambda: log.append("c"), calls=4, samples=3, warmup=2)
    assert got == [3.0, 3.0, 3.0]
    assert windows == [4, 4, 4] and len(log) == 2 + 12


def test_a_cpu_window_is_the_wall_clock_in_microseconds() -> None:
    e = env()
    import time

    us = e.window(lambda: time.sleep(0.02))
    assert 15_000 < us < 2_000_000
    e.sync()  # nothing to synchronise on a CPU


# -- one case, on the interpreter ------------------------------------------------------------------
def test_an_interpreted_case_reports_its_figures() -> None:
    """Rule: the interpreter times at most three samples of single calls on one input set, and
    the figures follow from the medians: GB/s = bytes / median, % of the copy bandwidth,
    launch overhead never negative."""
    e = env(copy_gbps=10.0)
    made: list[int] = []
    asked: list[dict[str, Any]] = []

    def time_fn(fn: Any, **kw: Any) -> list[float]:
        asked.append(kw)
        fn()
        return [4.0, 2.0, 3.0]

    e.time_fn = time_fn  # type: ignore[method-assign]
    got: list[Any] = []

    def make(salt: int) -> tuple[Any, Any]:
        made.append(salt)
        return (1, 2), {"k": 3}

    rec = timing.time_case(e, lambda *a, **k: got.append((a, k)), make, 6_000, warmup=5,
                           samples=30, floor=10, phases=lambda *a: contextlib.nullcontext())  # fmt: skip
    assert made == [7] and got == [((1, 2), {"k": 3})]
    assert asked == [{"calls": 1, "samples": 3, "warmup": 1}]
    assert rec["median_us"] == 3.0 and rec["samples"] == 3
    assert rec["gbps"] == pytest.approx(6_000 / 3e3)
    assert rec["pct_of_copy_bw"] == pytest.approx(100.0 * 2.0 / 10.0)
    assert rec["host_us"] == 3.0 and rec["launch_overhead_us"] == 0.0
    assert rec["sync_tail_us"] == 0.0 and rec["bytes"] == 6_000
    assert rec["timing_method"] == "wall_clock_interpreter"
    assert rec["calls_per_sample"] == 1 and rec["input_sets"] == 1
    assert rec["median_ci_rel"] is None  # no interval from three samples


def test_an_interpreted_case_with_few_samples_asked() -> None:
    e = env(copy_gbps=10.0)
    asked: list[dict[str, Any]] = []

    def time_fn(fn: Any, **kw: Any) -> list[float]:
        asked.append(kw)
        return [0.0] * kw["samples"]

    e.time_fn = time_fn  # type: ignore[method-assign]
    rec = timing.time_case(e, lambda: None, lambda s: ((), {}), 100, warmup=0, samples=2,
                           floor=1, phases=lambda *a: contextlib.nullcontext())  # fmt: skip
    assert asked == [{"calls": 1, "samples": 2, "warmup": 0}]
    assert rec["gbps"] is None and rec["pct_of_copy_bw"] is None  # a zero median has no rate
    assert rec["median_ci_rel"] is None


def test_the_confidence_interval_is_relative_to_the_median() -> None:
    e = env(copy_gbps=10.0)
    times = [10.0 + 0.1 * (i % 5) for i in range(20)]
    e.time_fn = lambda fn, **kw: list(times)  # type: ignore[method-assign]
    rec = timing.time_case(e, lambda: None, lambda s: ((), {}), 100, warmup=0, samples=20,
                           floor=1, phases=lambda *a: contextlib.nullcontext())  # fmt: skip
    # time_fn was asked for min(samples, 3) but answered 20: the record counts what came back
    med = statistics.median(times)
    assert rec["samples"] == 20 and rec["median_us"] == med
    half = timing.scores.median_ci_halfwidth(times)
    assert half is not None and rec["median_ci_rel"] == pytest.approx(half / med)
    assert math.isfinite(rec["launch_overhead_us"])


# -- one case on a GPU, the device calls stood in for ------------------------------------------------
class GpuEnv:
    """Stands for a GPU's Env in time_case: records which timing it was asked for."""

    interpret = False

    def __init__(self, method: str, graph_fails: bool = False) -> None:
        self.method, self.graph_fails = method, graph_fails
        self.log: list[Any] = []
        self.torch = types.SimpleNamespace(
            cuda=types.SimpleNamespace(synchronize=lambda: self.log.append("synchronize"))
        )

    def sets_needed(self, nbytes: int) -> int:
        return 3

    def sync(self) -> None:
        self.log.append("sync")

    def window(self, work: Any) -> float:
        work()
        return 9.0

    def method_for(self, nbytes: int) -> str:
        return self.method

    def copy_gbps(self) -> float:
        return 100.0

    def isolated_times(self, call: Any, samples: int, *, host_us: float, cap: int) -> Any:
        self.log.append(("isolated", samples, host_us, cap))
        call(0)
        return [5.0, 4.0, 6.0], [0.5, 0.25, 1.0]

    def graph_calls(self, nbytes: int, n_sets: int) -> int:
        return 6

    def graph_times(self, call: Any, calls: int, samples: int, warmup: int, cap: int) -> Any:
        self.log.append(("graph", calls, samples, warmup, cap))
        if self.graph_fails:
            raise RuntimeError("not capturable")
        return [2.0, 2.0, 2.0]

    def time_fn(self, fn: Any, *, calls: int, samples: int, warmup: int) -> list[float]:
        self.log.append(("eager", calls, samples, warmup))
        fn()
        fn()
        return [3.0, 3.0, 3.0]


def gpu_case(e: GpuEnv, samples: int = 30, warmup: int = 5) -> tuple[dict[str, Any], list[Any]]:
    seen: list[Any] = []
    phases: list[Any] = []

    @contextlib.contextmanager
    def phase(name: str, sync: Any) -> Any:
        phases.append(name)
        sync()
        yield

    drawn: list[int] = []

    def make(salt: int) -> tuple[Any, Any]:
        drawn.append(salt)
        return (Input([0]),), {"w": Input([0])}

    rec = timing.time_case(e, lambda x, w: seen.append((x.set, w.set)), make, 200_000,
                           warmup=warmup, samples=samples, floor=10, phases=phase)  # fmt: skip
    assert phases == ["timing_inputs"]
    assert drawn == [11]  # one draw; the other sets are its copies (args and kwargs)
    assert all(x == w for x, w in seen)
    return rec, [x for x, _ in seen]


class Input:
    """A tensor's stand-in: clone() is a copy in memory of its own (the next set number)."""

    def __init__(self, counter: list[int]) -> None:
        self.counter, self.set = counter, counter[0]

    def clone(self) -> Input:
        self.counter[0] += 1
        return Input(self.counter)


def test_a_gpu_case_isolated() -> None:
    """Rule: one input set drawn (salt 11) and copied into the others (charged to
    timing_inputs); warm-up and single calls rotate over them; the isolated samples get the
    floor, the cap and the single calls' median as the host latency to hide."""
    e = GpuEnv("isolated")
    rec, seen = gpu_case(e)
    assert e.log[0] == "sync"  # the input phase ends synchronised
    assert ("isolated", 10, 9.0, 30) in e.log
    # 3 warm-up calls (min(warmup, sets)), 3 single calls, then the isolated sample's own
    assert seen[:5] == [0, 1, 2, 0, 1] and len(seen) == 3 + 3 + 1
    assert rec["timing_method"] == "isolated" and rec["calls_per_sample"] == 1
    assert rec["input_sets"] == 3 and rec["samples"] == 3
    assert rec["median_us"] == 5.0 and rec["host_us"] == 9.0
    assert rec["launch_overhead_us"] == 4.0
    assert rec["sync_tail_us"] == 0.5
    assert rec["gbps"] == pytest.approx(200_000 / 5e3)
    assert rec["pct_of_copy_bw"] == pytest.approx(100.0 * 40.0 / 100.0)


def test_a_gpu_case_few_samples_and_warmups() -> None:
    """At least two warm-up calls, three single calls."""
    e = GpuEnv("isolated")
    _, seen = gpu_case(e, samples=1, warmup=0)
    assert len(seen) == 2 + 3 + 1


def test_a_gpu_case_in_graph_replays() -> None:
    e = GpuEnv("cuda_graph")
    rec, _ = gpu_case(e, warmup=4)
    assert ("graph", 6, 10, 4, 30) in e.log
    assert rec["timing_method"] == "cuda_graph" and rec["calls_per_sample"] == 6
    assert rec["median_us"] == 2.0 and rec["sync_tail_us"] == 0.0


def test_a_case_no_graph_can_capture_is_timed_eagerly() -> None:
    """Rule: when graph capture fails the same calls are timed back to back, eagerly, after a
    synchronize, over fresh rotations of the input sets."""
    e = GpuEnv("cuda_graph", graph_fails=True)
    rec, seen = gpu_case(e, warmup=4)
    assert e.log[-2:] == ["synchronize", ("eager", 6, 30, 4)]
    assert rec["timing_method"] == "eager_back_to_back" and rec["median_us"] == 3.0
    assert seen[-2:] == [0, 1]  # the eager calls start the rotation again


class FakeTorch:
    """Stands for torch in copy_gbps on a GPU: records the buffer asked for."""

    uint8 = "u8"

    def __init__(self) -> None:
        self.asked: list[Any] = []

    def empty(self, n: int, dtype: Any, device: str) -> Any:
        self.asked.append((n, dtype, device))
        return types.SimpleNamespace(random_=lambda lo, hi: "src")

    def empty_like(self, src: Any) -> Any:
        return types.SimpleNamespace(copy_=lambda s: self.asked.append(("copy", s)))


def test_the_copy_bandwidth_on_a_gpu_is_a_half_gibibyte_copy_timed_isolated() -> None:
    e = env(None)
    e.interpret, e.device = False, "cuda"
    e.torch = FakeTorch()  # type: ignore[assignment]
    asked: list[Any] = []

    def isolated_times(call: Any, samples: int, *, host_us: float) -> Any:
        asked.append((samples, host_us))
        call(0)
        return [400.0, 300.0, 500.0], []

    e.isolated_times = isolated_times  # type: ignore[method-assign, assignment]
    assert e.copy_gbps() == pytest.approx(2 * (1 << 29) / (400.0 * 1e3))
    assert e.torch.asked == [(1 << 29, "u8", "cuda"), ("copy", "src")]
    assert asked == [(30, 20.0)]


def test_sets_needed_is_a_whole_number_under_the_memory_cap() -> None:
    assert env(l2_bytes=40 << 30).sets_needed(3 << 29) == 2  # 4 GiB / 1.5 GiB: two sets


def test_sync_and_time_fn_wait_for_the_device_on_a_gpu() -> None:
    """Rule: on CUDA the device is synchronised after the warm-up calls, before any window."""
    e = env()
    e.device = "cuda"
    log: list[str] = []
    e.torch = types.SimpleNamespace(  # type: ignore[assignment]
        cuda=types.SimpleNamespace(synchronize=lambda: log.append("sync"))
    )
    e.window = lambda work: log.append("window") or 1.0  # type: ignore[method-assign, assignment]
    e.time_fn(lambda: log.append("call"), calls=1, samples=2, warmup=1)
    assert log == ["call", "sync", "window", "window"]


def test_sub_microsecond_medians_have_a_rate_and_an_interval() -> None:
    """A median under 1 us is still a time: GB/s and the relative interval are given."""
    e = env(copy_gbps=10.0)
    times = [0.5] * 20
    e.time_fn = lambda fn, **kw: list(times)  # type: ignore[method-assign]
    rec = timing.time_case(e, lambda: None, lambda s: ((), {}), 1000, warmup=0, samples=20,
                           floor=1, phases=lambda *a: contextlib.nullcontext())  # fmt: skip
    assert rec["gbps"] == pytest.approx(1000 / 500.0)
    assert rec["median_ci_rel"] == 0.0


def test_a_zero_median_has_no_rate_and_no_interval() -> None:
    e = env(copy_gbps=10.0)
    e.time_fn = lambda fn, **kw: [0.0] * 20  # type: ignore[method-assign]
    rec = timing.time_case(e, lambda: None, lambda s: ((), {}), 1000, warmup=0, samples=20,
                           floor=1, phases=lambda *a: contextlib.nullcontext())  # fmt: skip
    assert rec["gbps"] is None and rec["median_ci_rel"] is None


@pytest.mark.parametrize(
    ("want", "cuda", "expected"),
    [("auto", True, False), ("auto", False, True), (True, True, True), ("always", True, True),
     ("never", False, False), (False, False, False), ("", False, False)],
)  # fmt: skip
def test_a_request_runs_on_the_interpreter_by_its_interpret_field_and_auto_asks_for_cuda(
    want: object, cuda: bool, expected: bool
) -> None:
    """One rule for the runner's Env and the guarded verify's early start (guard_spawn.prespawn)."""
    assert timing.wants_interpreter({"interpret": want}, lambda: cuda) is expected


def test_without_an_interpret_field_the_runners_variable_decides_else_auto(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HARNESSLAB_RUNNER_INTERPRET", "never")
    assert timing.wants_interpreter({}, lambda: False) is False
    monkeypatch.delenv("HARNESSLAB_RUNNER_INTERPRET")
    assert timing.wants_interpreter({}, lambda: False) is True
    assert timing.wants_interpreter({}, lambda: True) is False


# -- the batched GPU regimes, the device stood in for ----------------------------------------------
class FakeCuda:
    """Stands for torch.cuda: a device clock that each enqueued call advances by `call_us` (a
    flush by `flush_us`, a replay by its calls); events read the clock when recorded, and the
    log says what the host did in which order."""

    def __init__(self, call_us: list[float], flush_us: float = 40.0) -> None:
        self.call_us, self.flush_us = list(call_us), flush_us
        self.clock, self.log, self.sleeps = 0.0, [], []
        self.tail_us = 0.0  # work left on other streams: a whole-device synchronize waits for it
        self.indices: list[int] = []  # the input set each call was given
        self.synced: list[float | None] = []  # when the events synchronized on were recorded
        self.on_side = self.capturing = False
        self.host_call_us, self.host_us = 0.0, 5e6  # the host's clock (us): each call's launch
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.at: float | None = None

            def record(self, stream: Any = None) -> None:
                self.at = cuda.clock
                cuda.log.append("record")

            def synchronize(self) -> None:
                cuda.log.append("sync")
                cuda.synced.append(self.at)

            def elapsed_time(self, other: Any) -> float:
                assert self.at is not None and other.at is not None
                return (other.at - self.at) / 1e3  # milliseconds, as torch reports

        class Graph:
            def capture_begin(self) -> None:
                cuda.log.append("capture" if cuda.on_side else "capture off the side stream")
                cuda.capturing = True

            def capture_end(self) -> None:
                cuda.log.append("end capture")
                cuda.capturing = False

            def replay(self) -> None:
                cuda.log.append("replay")
                cuda.clock += sum(cuda.take() for _ in range(cuda.graph_calls))

        self.Event, self.CUDAGraph, self.graph_calls = Event, Graph, 0

    def take(self) -> float:
        return self.call_us.pop(0) if len(self.call_us) > 1 else self.call_us[0]

    def synchronize(self) -> None:
        self.log.append("sync")
        self.clock += self.tail_us

    def _sleep(self, cycles: int) -> None:
        self.log.append("sleep")
        self.sleeps.append(cycles)
        self.clock += cycles / 2000  # ~2 GHz, as timing.py sizes it

    def host_clock(self) -> float:
        return self.host_us / 1e6

    def call(self, i: int) -> None:
        self.host_us += self.host_call_us
        self.log.append("side call" if self.on_side else "call")
        self.indices.append(i)
        self.clock += self.take()

    def graph_call(self, i: int) -> None:
        """A call as graph_times makes it: counted into the graph while capturing, else run."""
        if getattr(self, "capturing", False):
            self.graph_calls += 1
        else:
            self.call(i)

    def flush(self) -> None:
        self.log.append("flush")
        self.clock += self.flush_us

    def Stream(self) -> Any:  # noqa: N802 - torch's name
        return types.SimpleNamespace(wait_stream=lambda s: self.log.append("side waits main"))

    def current_stream(self) -> Any:
        return types.SimpleNamespace(wait_stream=lambda s: self.log.append("main waits side"))

    @contextlib.contextmanager
    def stream(self, s: Any) -> Any:
        self.on_side = True
        yield
        self.on_side = False


def fake_env(cuda: FakeCuda) -> timing.Env:
    e = env()
    e.interpret, e.device = False, "cuda"
    e.torch = types.SimpleNamespace(cuda=cuda)  # type: ignore[assignment]
    e.flush_l2 = cuda.flush  # type: ignore[method-assign]
    e.host_clock = cuda.host_clock  # type: ignore[method-assign]
    return e


def test_graph_samples_are_device_time_read_once_a_batch() -> None:
    """Rule: a batch of replays is enqueued back to back, an event after each, and read after
    ONE synchronize; a sample is the device time between two events over the calls a replay
    holds; past the floor, batches of BATCH_STEP until the median is stable."""
    cuda = FakeCuda([2.0])
    e = fake_env(cuda)

    times = e.graph_times(cuda.graph_call, 4, 10, 2, cap=30)
    assert times == [2.0] * 10  # a constant device: stable at the floor, one batch
    timed = cuda.log[cuda.log.index("capture") :]
    after = timed[timed.index("replay") + 2 :]  # past the replay that follows the capture
    assert after == ["record"] + ["replay", "record"] * 10 + ["sync"]


def test_graph_samples_past_the_floor_come_in_steps() -> None:
    # Two warm-up calls and the replay after capture take the first four; then replays of two
    # calls alternate 2 and 1 us a call: never stable, so sampling runs to the cap.
    cuda = FakeCuda([1.0, 3.0, 1.0, 1.0] * 40)
    e = fake_env(cuda)

    times = e.graph_times(cuda.graph_call, 2, 10, 2, cap=19)
    assert len(times) == 19
    syncs = cuda.log[cuda.log.index("capture") :].count("sync")
    # the replay after capture (1 sync), the floor's batch, then steps of 4, 4 and the last 1
    assert syncs == 1 + 1 + 3


SAMPLE = [
    "record",
    "sleep",
    "flush",
    "record",
    "call",
    "record",
]  # event, hold, flush, start, call, end


def test_isolated_samples_queue_at_most_one_behind_the_one_running() -> None:
    """Rule: a sample is [event, hold (a sleep), flush, start, call, end]; the host enqueues
    sample k+1 only once sample k-1 has ended (synchronized on its end event), so at most one
    sample is queued behind the one running; one whole-device synchronize a batch, then the
    tail event; the sample is start..end only (the hold and the flush are outside it)."""
    cuda = FakeCuda([30.0])
    times, tails = fake_env(cuda).isolated_times(cuda.call, 3, host_us=20.0, cap=3)
    assert times == [30.0] * 3 and len(tails) == 1
    batch = cuda.log[cuda.log.index("sleep") - 1 :]
    assert batch == SAMPLE * 2 + ["sync"] + SAMPLE + ["sync", "sync", "sync", "record", "sync"]


@pytest.mark.parametrize(
    ("host_us", "hold_us"), [(20.0, 75.0), (5000.0, 7545.0), (20_000.0, 20_000.0)]
)
def test_the_first_hold_covers_a_single_calls_cost_and_a_margin(
    host_us: float, hold_us: float
) -> None:
    """Rule: the first sample's hold is 1.5 x (host_us + 30 us for a flush's and two events'
    launches) at ~2 GHz (2000 cycles a us), at most 20 ms."""
    cuda = FakeCuda([30.0])
    fake_env(cuda).isolated_times(cuda.call, 1, host_us=host_us, cap=1)
    assert cuda.sleeps == pytest.approx([hold_us * 2000], abs=2)


def test_a_later_hold_is_sized_from_the_last_ended_samples_enqueue_less_its_flush() -> None:
    """Rule: once a sample has ended, the next hold is 1.5 x what the host took to enqueue it
    less the device's own time before its start event besides its hold (the 40 us flush):
    40 us launches, 1.5 x 40 - 40 = 20 us. The second sample is enqueued before the first
    ends, on the first guess."""
    cuda = FakeCuda([30.0])
    cuda.host_call_us = 40.0
    fake_env(cuda).isolated_times(cuda.call, 3, host_us=20.0, cap=3)
    assert cuda.sleeps == pytest.approx([75.0 * 2000, 75.0 * 2000, 20.0 * 2000], abs=2)


def test_a_sample_enqueued_past_its_hold_is_dropped_and_another_held_longer() -> None:
    """Rule: a sample whose enqueue outlasted the device's time from its event to its start
    event may hold host latency: its reading is dropped and another sample takes its place,
    held by what that enqueue took. 200 us launches against 75 us held + a 40 us flush; then
    1.5 x 200 - 40 = 260 us."""
    cuda = FakeCuda([30.0, 99.0, 31.0])  # the warm-up call, the dropped sample, the kept one
    cuda.host_call_us = 200.0
    times, tails = fake_env(cuda).isolated_times(cuda.call, 1, host_us=20.0, cap=1)
    assert times == [31.0] and len(tails) == 1
    assert cuda.sleeps == pytest.approx([75.0 * 2000, 260.0 * 2000], abs=2)


@pytest.mark.parametrize(("launch_us", "sleeps"), [(114.9, 1), (115.1, 2)])
def test_the_host_is_ahead_while_its_enqueue_fits_the_held_time(
    launch_us: float, sleeps: int
) -> None:
    """The boundary: a 75 us hold and a 40 us flush hold the device 115 us before the start
    event; 114.9 us of enqueue fits, 115.1 does not."""
    cuda = FakeCuda([30.0])
    cuda.host_call_us = launch_us
    fake_env(cuda).isolated_times(cuda.call, 1, host_us=20.0, cap=1)
    assert len(cuda.sleeps) == sleeps


def test_a_host_no_hold_covers_keeps_readings_after_three_drops_a_sample() -> None:
    """Rule: past HOLD_TRIES x the batch's samples dropped (here 40 ms launches against the
    20 ms most a hold is; a batch of two: six drops), readings are kept as they come:
    sampling goes on."""
    drops = timing.Env.HOLD_TRIES * 2
    cuda = FakeCuda([30.0, *[99.0] * drops, 31.0, 32.0])
    cuda.host_call_us = 40_000.0
    times, tails = fake_env(cuda).isolated_times(cuda.call, 2, host_us=20.0, cap=2)
    assert times == [31.0, 32.0] and len(tails) == 1
    assert len(cuda.sleeps) == drops + 2


def test_isolated_samples_past_the_floor_come_in_steps_with_a_tail_each_batch() -> None:
    cuda = FakeCuda([30.0, 36.0, 31.0, 35.0, 30.0, 37.0] * 30)  # never within 0.5%
    times, tails = fake_env(cuda).isolated_times(cuda.call, 10, host_us=20.0, cap=19)
    assert len(times) == 19 and len(tails) == 4  # batches of 10, 4, 4 and 1
    assert cuda.log.count("sleep") == 19  # one a sample


def test_isolated_samples_start_from_a_flushed_synchronized_warm_device_and_rotate_inputs() -> None:
    """Rule: the flush buffer is made and the device synchronized, one warm-up call on input
    set 0 is synchronized, then each sample takes the next input set (0, 1, 2, ...); the tail
    is the time from the batch's last end event to the whole-device synchronize, in us; without
    a cap the floor is the cap."""
    cuda = FakeCuda([30.0])
    cuda.tail_us = 7.0
    times, tails = fake_env(cuda).isolated_times(cuda.call, 10, host_us=20.0)
    assert cuda.log[:4] == ["flush", "sync", "call", "sync"]
    assert cuda.indices == [0, *range(10)]
    assert times == [30.0] * 10 and tails == [7.0]


@pytest.mark.parametrize(("warmup", "warm_calls"), [(0, 2), (3, 3)])
def test_graph_capture_follows_warm_up_calls_on_a_side_stream(warmup: int, warm_calls: int) -> None:
    """Rule: at least two warm-up calls (Triton compiles and autotunes there), on a side stream
    that waited for the current one and that the current one waits for, then a synchronize,
    then capture; a batch is read by synchronizing on its LAST event; without a cap the floor
    is the cap."""
    cuda = FakeCuda([2.0])

    times = fake_env(cuda).graph_times(cuda.graph_call, 4, 10, warmup)
    assert times == [2.0] * 10
    assert cuda.log[: warm_calls + 4] == [
        "side waits main", *["side call"] * warm_calls, "main waits side", "sync", "capture"
    ]  # fmt: skip
    assert cuda.indices[:warm_calls] == list(range(warm_calls))
    assert cuda.synced[-1] == cuda.clock  # the last event: every replay of the batch is in


def test_a_call_that_breaks_the_capture_still_ends_it_and_raises() -> None:
    """Rule: the capture is ended on an error too (a stream left capturing breaks every later
    launch); the error reaches time_case, which times the calls eagerly instead."""
    cuda = FakeCuda([2.0])

    def breaks(i: int) -> None:
        if cuda.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        cuda.call(i)

    with pytest.raises(RuntimeError, match="capturing"):
        fake_env(cuda).graph_times(breaks, 4, 10, 2)
    assert cuda.log[-2:] == ["capture", "end capture"] and not cuda.capturing


def test_graph_capture_leaves_the_allocators_cache_alone() -> None:
    """Rule: capture is capture_begin/capture_end on the side stream, not torch.cuda.graph(),
    which empties the allocator's caches at every capture (the next case's inputs then pay
    cudaMalloc again)."""
    cuda = FakeCuda([2.0])
    cuda.empty_cache = lambda: cuda.log.append("empty_cache")  # type: ignore[attr-defined]
    cuda.graph = lambda *a, **k: pytest.fail("torch.cuda.graph() empties the caches")  # type: ignore[attr-defined]
    fake_env(cuda).graph_times(cuda.graph_call, 4, 10, 2)
    assert "empty_cache" not in cuda.log and "capture" in cuda.log


def test_the_driver_version_is_asked_of_nvidia_smi_once_a_process(monkeypatch) -> None:
    """Rule: every env block names the driver, but nvidia-smi (tens of ms a run) runs once a
    process: a warm runner's calls reuse the answer."""
    import subprocess

    runs: list[list[str]] = []

    def fake_run(argv, **kw):
        runs.append(argv)
        return types.SimpleNamespace(stdout="580.159.04\n")

    monkeypatch.setattr(timing.shutil, "which", lambda name: "/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", fake_run)
    forget = getattr(timing._driver_version, "cache_clear", lambda: None)
    forget()
    try:
        assert [timing._driver_version() for _ in range(3)] == ["580.159.04"] * 3
        assert len(runs) == 1
    finally:
        forget()


# -- a request's seconds ------------------------------------------------------------------------
def test_phases_are_exclusive_and_charge_the_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    phases = timing.Phases()

    def tick(s: float) -> None:
        now[0] += s

    with phases("outer"):
        tick(1)
        with phases("inner", lambda: tick(4)):
            tick(2)
            with phases("deep"):
                tick(8)
        tick(16)
    with phases("inner"):
        tick(32)
    assert phases == {"outer": 17.0, "inner": 38.0, "deep": 8.0}
    with pytest.raises(KeyError), phases("raised"):
        tick(64)
        raise KeyError
    assert phases["raised"] == 64.0
