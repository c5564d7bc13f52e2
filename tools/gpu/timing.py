"""The runner's timing: the device, its copy bandwidth, how one case is timed, and where a
request's seconds went (Phases).

Staged to the GPU host beside runner.py (standard library + torch, never harnesslab); runs in
the runner's process, inside sandbox.py with the candidate (dev modes), and on the trusted side
of the guarded verify (guard_gpu.py's replay windows use Env.flush_l2 and calls_per_window).

Timing (the one implementation): device time from CUDA events. Each sample is a CUDA-graph
replay of K back-to-back calls rotating over input sets that together exceed 2.5x the L2 size
(L2 never holds the inputs); K is chosen so one replay lasts ~GRAPH_WINDOW_US. A batch of
replays is enqueued with an event between each two and read after one synchronize, so no host
latency is in any sample (RUNNER_VERSION 2 held the host launch and synchronize latency inside
each 1 ms window). Host launch latency is measured apart: single eager calls with a whole-device
synchronize inside the window; launch_overhead_us = single - device median. Large cases are
timed one isolated call per sample instead (Env.ISOLATED_MIN_US says when), each behind a hold
that covers its enqueue, at most one queued behind the one running, a batch per synchronize;
the synchronize after each batch times the tail of work left on other streams.
Without a GPU the same path runs under the Triton interpreter on small shapes, timed with a
wall clock, and every timing is marked meaningful=false.

Siblings (scores.py) are imported by the one rule in runner.py's docstring.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import math
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

HERE = os.path.dirname(os.path.abspath(__file__))
if TYPE_CHECKING or __package__:  # the sibling import rule: runner.py's docstring
    from . import scores
else:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import scores

RUNNER_VERSION = "4"  # reported in every env block (Env.info)
# Adaptive sampling (time_case): at least MIN_SAMPLES, at most `repeats`, stopping once the
# median's ~95% confidence interval is within RELATIVE_CI of it. The guarded verify's replay
# samples keep their fixed count (guard_gpu.time_samples): a candidate must not be able to
# steer how often it is measured.
MIN_SAMPLES, RELATIVE_CI = 10, 0.005
# Samples past the floor are taken BATCH_STEP at a time (one synchronize a batch); a sample of
# back-to-back calls (a graph replay here, a replayer's window in the guarded verify) is about
# WINDOW_US of device time: event resolution (~0.5 us) is 0.2% of it. 500 us windows cost twice
# the capture and replay time for the same agreement (issue 30's A/B on an H100: the three
# graph-timed dev cases of rmsnorm_gate 29-39 ms against 50-65 ms, back-to-back within 0.31%).
BATCH_STEP, WINDOW_US = 4, 250.0
# The runner's graph samples are half that: their capture's host launches are most of the graph
# path's cost, and the median is over 10 or more samples (issue 30's A/B on an H100, with the
# copied input sets and three single calls below: warm run_objective 0.197 -> 0.167 s, worst
# back-to-back disagreement 0.96% -> 0.71%). The guarded verify's replay windows keep WINDOW_US.
GRAPH_WINDOW_US = 125.0

# ----------------------------------------------------------------------------------------------
# environment (torch is imported lazily so `--help` and errors stay cheap)


def wants_interpreter(req: dict[str, Any], cuda_available: Callable[[], bool]) -> bool:
    """Whether `req` runs on the Triton interpreter: its "interpret" (else the runner's
    HARNESSLAB_RUNNER_INTERPRET, else "auto"); "never" or a false value is no, "auto" asks
    `cuda_available` (the runner imports torch for it; guard_spawn.prespawn guesses without torch)."""
    want = req.get("interpret", os.environ.get("HARNESSLAB_RUNNER_INTERPRET", "auto"))
    if want == "auto":
        return not cuda_available()
    return bool(want) and want != "never"


class Env:
    """Per-process state: device, versions, copy bandwidth (measured once per process)."""

    def __init__(self, interpret: bool) -> None:
        if interpret:
            os.environ["TRITON_INTERPRET"] = "1"
        import torch

        self.torch = torch
        self.interpret = interpret or not torch.cuda.is_available()
        self.device = "cpu" if self.interpret else "cuda"
        self._copy_gbps: float | None = None
        self._flush_buf: Any = None  # flush_l2's buffer and output, allocated on first use
        self._flush_out: Any = None
        self.l2_bytes = 0
        if self.device == "cuda":
            props = torch.cuda.get_device_properties(0)
            self.l2_bytes = int(getattr(props, "L2_cache_size", 50 << 20))

    def info(self) -> dict[str, Any]:
        torch = self.torch
        try:
            import triton

            triton_version = triton.__version__
        except Exception as exc:  # reported, not fatal: the reference path still runs
            triton_version = f"unavailable ({type(exc).__name__})"
        info: dict[str, Any] = {
            "device": "cpu (Triton interpreter)"
            if self.interpret
            else torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "triton": triton_version,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "host": platform.node(),
            "gpu_index": os.environ.get(
                "CUDA_VISIBLE_DEVICES", "0" if not self.interpret else None
            ),
            "interpret": self.interpret,
            "meaningful": not self.interpret,
            "runner_version": RUNNER_VERSION,
            "cpu_count": os.cpu_count(),  # the GPU host's cores: what sweeps compile on
        }
        if not self.interpret:
            info["driver"] = _driver_version()
        return info

    # Timing ------------------------------------------------------------------------------------
    # Two regimes, one implementation. Cases whose bytes take >= ISOLATED_MIN_US at copy speed
    # are timed one call per sample from a clean L2 (a read of 2.5x L2 evicts everything dirty)
    # with the stream primed by a sleep kernel, so host launch latency stays outside the window;
    # that is what Nsight Compute's gpu__time_duration measures (back-to-back timing read ~10%
    # higher on an H100 at 4096x8192: it also pays the previous call's L2 write-back). Smaller
    # cases are CUDA-graph replays of back-to-back calls rotating over inputs larger than 2.5x
    # L2, because one call is too short for event resolution. Every batch of isolated samples
    # ends with an event after a whole-device synchronize: `sync_tail_us` exposes work left on
    # other streams. % of copy bandwidth is against one large (1 GiB) device copy timed the same
    # isolated way: 3029 GB/s on an H100. A read-heavy kernel can exceed 100% (reads are cheaper
    # than writes: 2 reads + 1 write per element here); an H100 measured up to ~108%.
    ISOLATED_MIN_US = 15.0

    def copy_gbps(self) -> float:
        """Large device-to-device copy bandwidth (bytes read + written), measured once per
        process with the same isolated method as the bandwidth-bound cases."""
        if self._copy_gbps is None:
            torch = self.torch
            half = (1 << 29) if not self.interpret else (8 << 20)
            src = torch.empty(half, dtype=torch.uint8, device=self.device).random_(0, 255)
            dst = torch.empty_like(src)
            if self.interpret:
                times = self.time_fn(lambda: dst.copy_(src), calls=1, samples=3, warmup=1)
            else:
                times, _ = self.isolated_times(lambda i: dst.copy_(src), 30, host_us=20.0)
            self._copy_gbps = 2 * half / (statistics.median(times) * 1e3)
        return self._copy_gbps

    def method_for(self, nbytes: int) -> str:
        est_us = nbytes / (self.copy_gbps() * 1e3)
        return "isolated" if est_us >= self.ISOLATED_MIN_US else "cuda_graph"

    def sets_needed(self, nbytes: int) -> int:
        """Input sets so that one rotation exceeds 2.5x L2 (memory capped at ~4 GB)."""
        n = max(2, math.ceil(2.5 * self.l2_bytes / max(nbytes, 1)))
        return min(n, max(2, (4 << 30) // max(nbytes, 1)), 64)

    def calls_per_window(
        self, nbytes: int, *, floor_us: float, lo: int, hi: int, window_us: float = WINDOW_US
    ) -> int:
        """Back-to-back calls that make about `window_us` of device time at copy speed, in
        [lo, hi]: the runner's graphs (graph_calls) and the guarded verify's replay windows
        (guard_gpu.time_samples). Events alone time them, no host latency in them, and event
        resolution (~0.5 us) is 0.2% of 250 us, 0.4% of 125."""
        est_us = max(nbytes / (self.copy_gbps() * 1e3), floor_us)
        return max(lo, min(hi, math.ceil(window_us / est_us)))

    def graph_calls(self, nbytes: int, n_sets: int) -> int:
        """Back-to-back calls per graph: about GRAPH_WINDOW_US of work, a multiple of the
        rotation."""
        calls = self.calls_per_window(
            nbytes, floor_us=1.0, lo=n_sets, hi=2000, window_us=GRAPH_WINDOW_US
        )
        return math.ceil(calls / n_sets) * n_sets

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def time_fn(self, fn, *, calls: int, samples: int, warmup: int) -> list[float]:
        """Per-call microseconds of `calls` back-to-back eager calls, `samples` times."""
        for _ in range(warmup):
            fn()
        self.sync()
        return [self.window(lambda: [fn() for _ in range(calls)]) / calls for _ in range(samples)]

    def window(self, work) -> float:
        """Microseconds for `work` with the whole device synchronised inside the window (host
        launch latency included: the GPU is idle when the window opens)."""
        if self.device == "cuda":
            torch = self.torch
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            torch.cuda.synchronize()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e3
        t0 = time.perf_counter()
        work()
        return (time.perf_counter() - t0) * 1e6

    def flush_l2(self) -> None:
        """Evict L2 (enqueued on the current stream): a read of 2.5x its size. The one flush of
        both timing paths (isolated samples here, the guarded verify's replay samples)."""
        buf = self._flush_buf
        if buf is None:
            torch = self.torch
            n = max(int(2.5 * self.l2_bytes), 1 << 20) // 4
            buf = torch.ones(n, dtype=torch.int32, device="cuda")
            self._flush_buf = buf
            self._flush_out = torch.empty((), dtype=torch.int64, device="cuda")
        self.torch.sum(buf, dim=0, out=self._flush_out)

    def isolated_times(
        self, call, samples: int, *, host_us: float, cap: int | None = None
    ) -> tuple[list[float], list[float]]:
        """One call per sample from a clean L2: [event, hold, flush, start, call, end] each,
        at most one sample queued behind the one running (the host enqueues sample k+1 only
        once sample k-1 has ended). `samples` is the floor; with `cap` above it, sampling stops
        early once the median is known to within RELATIVE_CI (checked after the floor, then
        every BATCH_STEP samples); one whole-device synchronize a batch, whose tail (`tails`)
        times work left on other streams.
        Why one behind: samples enqueued ahead in a batch read 1-2% longer on an H100 at 33 us
        while three or more samples were queued behind them, so a median moved with how many of
        a run's samples came last in their batch (issue 30: BENCHMARKS.md, thirteenth session).
        The hold (a sleep kernel) with the flush lets the host finish enqueueing a sample before
        the device reaches its start event, so no host latency is in a sample: see HOLD_MARGIN."""
        torch = self.torch
        self.flush_l2()  # allocates the flush buffer before the first sample
        torch.cuda.synchronize()
        call(0)
        torch.cuda.synchronize()
        tails: list[float] = []
        index = itertools.count()  # each sample the next input set
        # What the host took to enqueue the last sample (first guess: a single call's launch
        # and synchronize plus a flush's and two events' launches), and the device's time from
        # the event to the start event besides the hold (the flush).
        last = {"enqueue_us": host_us + self.ENQUEUE_EXTRA_US, "lead_us": 0.0}

        def enqueue() -> tuple[Any, Any, Any, float, float]:
            gate, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            hold_us = self.HOLD_MARGIN * last["enqueue_us"] - last["lead_us"]
            hold_us = min(max(hold_us, 0.0), self.MAX_HOLD_US)
            t0 = self.host_clock()
            gate.record()
            torch.cuda._sleep(int(hold_us * 2000))  # ~2 GHz SM clock
            self.flush_l2()
            start.record()
            call(next(index))
            end.record()
            return gate, start, end, (self.host_clock() - t0) * 1e6, hold_us

        def batch(n: int) -> list[float]:
            out: list[float] = []
            queued: collections.deque = collections.deque()
            retakes = 0
            while len(out) < n:
                while len(queued) < 2 and len(out) + len(queued) < n:
                    queued.append(enqueue())
                gate, start, end, enqueue_us, hold_us = queued.popleft()
                end.synchronize()
                held_us = gate.elapsed_time(start) * 1e3
                last.update(enqueue_us=enqueue_us, lead_us=max(held_us - hold_us, 0.0))
                if enqueue_us <= held_us or retakes >= self.HOLD_TRIES * n:
                    out.append(start.elapsed_time(end) * 1e3)
                else:
                    retakes += 1  # the sample may hold host latency: another takes its place
            after = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            after.record()
            after.synchronize()
            tails.append(end.elapsed_time(after) * 1e3)
            return out

        times, _ = scores.sample_batches_until_stable(
            batch, floor=samples, cap=cap or samples, rel_ci=RELATIVE_CI, step=BATCH_STEP
        )
        return times, tails

    # A sample's hold is HOLD_MARGIN x what the host took to enqueue the last sample, less the
    # device's own time before the last start event (the flush), at most MAX_HOLD_US. A sample
    # whose enqueue outlasted the device's time from its event to its start event (the device
    # cannot reach that start sooner after the host began it) may hold host latency: its reading
    # is dropped and another sample, held by what that enqueue took, takes its place; past
    # HOLD_TRIES x the batch's samples so dropped (a host that stays behind: a launch past
    # MAX_HOLD_US / HOLD_MARGIN), readings are kept as they come and the median outvotes them
    # unless most are so.
    HOLD_MARGIN, HOLD_TRIES, MAX_HOLD_US = 1.5, 3, 20_000.0
    ENQUEUE_EXTRA_US = 30.0
    host_clock = staticmethod(time.perf_counter)  # the enqueue's clock (a stand-in in tests)

    def graph_times(
        self, call, calls: int, samples: int, warmup: int, cap: int | None = None
    ) -> list[float]:
        """Per-call microseconds of CUDA-graph replays of `calls` back-to-back calls; at least
        `samples` replays, up to `cap` until the median is stable. The replays of a batch are
        enqueued back to back with an event between each two and read after one synchronize:
        a sample is device time only (the graph holds all of the calls' work: capture refuses
        work on a stream it does not join), no host launch or synchronize latency in it."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up on a side stream, as graph capture requires
            for i in range(max(warmup, 2)):
                call(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # Captured on the side stream with capture_begin/end: torch.cuda.graph() would also
        # empty the allocator's caches at every capture (the next case's inputs would pay
        # cudaMalloc again); capture_end runs on an error too, as graph() does.
        with torch.cuda.stream(side):
            graph.capture_begin()
            try:
                for i in range(calls):
                    call(i)
            finally:
                graph.capture_end()
        graph.replay()
        torch.cuda.synchronize()

        def batch(n: int) -> list[float]:
            events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
            stream = torch.cuda.current_stream()  # once: record() would look it up each time
            events[0].record(stream)
            for event in events[1:]:
                graph.replay()
                event.record(stream)
            events[-1].synchronize()
            return [a.elapsed_time(b) * 1e3 / calls for a, b in itertools.pairwise(events)]

        out, _ = scores.sample_batches_until_stable(
            batch, floor=samples, cap=cap or samples, rel_ci=RELATIVE_CI, step=BATCH_STEP
        )
        return out  # the graph (and its memory pool) goes with this frame


@functools.cache  # once a process: nvidia-smi takes tens of ms, every env block reports it
def _driver_version() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    import subprocess

    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except Exception:
        return None


# ----------------------------------------------------------------------------------------------
# a request's seconds


class Phases(dict):
    """Seconds spent per phase of a request (summed over cases), for the warm objective's
    breakdown: `with phases("inputs", sync):` adds the block's wall time, after `sync()` so
    queued device work is charged to the phase that queued it. Phases are exclusive: a phase
    opened inside another is not counted twice (the outer one gets the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self._inner: list[float] = []  # per open phase: seconds spent in phases inside it

    @contextlib.contextmanager
    def __call__(self, name: str, sync=None):
        t0 = time.perf_counter()
        self._inner.append(0.0)
        try:
            yield
        finally:
            if sync is not None:
                sync()
            took = time.perf_counter() - t0
            inner = self._inner.pop()
            if self._inner:
                self._inner[-1] += took
            self[name] = self.get(name, 0.0) + took - inner


# ----------------------------------------------------------------------------------------------
# one case


def _copy_set(inputs: tuple[Any, Any]) -> tuple[Any, Any]:
    """(args, kwargs) with every tensor (what has .clone()) copied into memory of its own."""
    args, kwargs = inputs
    copy = lambda a: a.clone() if hasattr(a, "clone") else a  # noqa: E731
    return tuple(copy(a) for a in args), {k: copy(v) for k, v in kwargs.items()}


def time_case(
    env: Env,
    fn: Callable[..., Any],
    make: Callable[[int], tuple[Any, Any]],
    nbytes: int,
    *,
    warmup: int,
    samples: int,
    floor: int,
    phases: Any,
) -> dict[str, Any]:
    """Time `fn` on inputs `make(salt)` returns ((args, kwargs), fresh each salt): the one
    timing of a case (`samples` is the cap of adaptive sampling, `floor` its floor). `phases`
    (Phases) charges drawing the input sets to "timing_inputs"."""
    torch = env.torch
    if env.interpret:
        args, kwargs = make(7)
        # The interpreter says nothing about speed: a few samples keep eval fast on a CPU.
        times = env.time_fn(
            lambda: fn(*args, **kwargs), calls=1, samples=min(samples, 3), warmup=min(warmup, 1)
        )
        single, tails = times, [0.0]
        method, calls, n_sets = "wall_clock_interpreter", 1, 1
    else:
        n_sets = env.sets_needed(nbytes)
        with phases("timing_inputs", env.sync):  # not in "timing": Phases are exclusive
            # One draw; the other sets are copies of it: distinct memory, which is what the
            # rotation is for (no set still in L2 when its turn comes), at one kernel a tensor
            # instead of a generator's draws (issue 30's A/B on an H100: timing inputs 13.3 ->
            # 5.6 ms over rmsnorm_gate's nine dev cases, with window125 and singles3 below).
            first = make(11)
            sets = [first, *(_copy_set(first) for _ in range(n_sets - 1))]

        def call(i: int):
            a, k = sets[i % n_sets]
            return fn(*a, **k)

        # Single eager calls with nothing queued before them: host launch latency included.
        for i in range(max(2, min(warmup, n_sets))):
            call(i)
        single = [env.window(lambda i=i: call(i)) for i in range(3)]
        method, calls = env.method_for(nbytes), 1
        tails = [0.0]
        if method == "isolated":
            times, tails = env.isolated_times(
                call, floor, host_us=statistics.median(single), cap=samples
            )
        else:
            calls = env.graph_calls(nbytes, n_sets)
            try:
                times = env.graph_times(call, calls, floor, warmup, cap=samples)
            except Exception:  # not capturable (host syncs, allocations): eager back-to-back
                method = "eager_back_to_back"
                torch.cuda.synchronize()
                it = iter(range(10**9))
                times = env.time_fn(
                    lambda: call(next(it)), calls=calls, samples=samples, warmup=warmup
                )
        del sets
    stats = scores.order_stats(times)
    med = stats["median_us"] or 0.0
    half = scores.median_ci_halfwidth(times)
    gbps = nbytes / (med * 1e3) if med > 0 else None
    copy_gbps = env.copy_gbps()
    return {
        **stats,
        "host_us": statistics.median(single),
        "launch_overhead_us": max(0.0, statistics.median(single) - med),
        "gbps": gbps,
        "pct_of_copy_bw": 100.0 * gbps / copy_gbps if gbps else None,
        "sync_tail_us": statistics.median(tails),
        "bytes": nbytes,
        "timing_method": method,
        "calls_per_sample": calls,
        "input_sets": n_sets,
        "samples": len(times),
        "median_ci_rel": half / med if half is not None and med > 0 else None,
    }
