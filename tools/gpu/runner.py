"""GPU-side runner: evaluates a candidate kernel against a task's reference with honest timing.

Self-contained on purpose: it needs only the standard library, torch and triton, because the
toolkit copies this one file to the GPU host (hash-checked) for every run. It never imports
harnesslab. Usage:

    python runner.py REQUEST.json      one request, JSON events on stdout
    python runner.py --worker          warm worker: one JSON request per stdin line

Output protocol: one JSON object per line on the ORIGINAL stdout. Candidate code's own prints
are redirected to stderr so they cannot corrupt the stream. Events:
    {"event": "case", ...}     one per finished case (partial results survive a kill)
    {"event": "result", ...}   the whole result, last line of a request

Timing (the one implementation): device time from CUDA events; the end event is recorded after
a whole-device synchronize so work left on other streams is inside the window. Each sample is a
CUDA-graph replay of K back-to-back calls rotating over input sets that together exceed 2.5x the
L2 size (L2 never holds the inputs); K is chosen so one window lasts >= ~1 ms, which makes the
host latency of the final synchronize negligible (<2%). Host launch latency is measured apart:
single eager calls with events around them; launch_overhead_us = single - device median.
Without a GPU the same path runs under the Triton interpreter on small shapes, timed with a
wall clock, and every timing is marked meaningful=false.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import types
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RUNNER_VERSION = "2"
HERE = os.path.dirname(os.path.abspath(__file__))
if __name__ == "__main__":  # the staged runner (not a module the lab loads by path)
    if HERE not in sys.path:  # started with -I: the staged siblings (guard.py, ...) by path
        sys.path.insert(0, HERE)
    # Bytecode beside the staged files is never trusted (a planted .pyc would run instead of
    # the hash-checked source): the harness imports its siblings from source, -B writes none.
    shutil.rmtree(os.path.join(HERE, "__pycache__"), ignore_errors=True)
SWEEP_WARMUP, SWEEP_REPEATS = 3, 10  # per case in sweeps (a score takes 10 and 30: time_case)
SWEEP_MIN_SAMPLES = 5  # a sweep ranks configs: 5 samples suffice where the median is stable
# Adaptive sampling (time_case): at least MIN_SAMPLES, at most `repeats`, stopping once the
# median's ~95% confidence interval is within RELATIVE_CI of it. The guarded verify's replay
# samples keep their fixed count (guard_gpu.time_samples): a candidate must not be able to
# steer how often it is measured.
MIN_SAMPLES, RELATIVE_CI = 10, 0.005
_OUT = sys.stdout  # replaced in main() by a dup of fd 1 before candidate code can print

# ----------------------------------------------------------------------------------------------
# plumbing


def emit(obj: dict[str, Any]) -> None:
    _OUT.write(json.dumps(obj, default=_json_default) + "\n")
    _OUT.flush()


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _finite(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return x


MAX_REASON = 2000  # characters of an exception's first line kept in a reason


class CaseTimeout(Exception):
    pass


def caused_by(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """`exc` or the first exception of type `kind` that (directly or not) caused it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Raise CaseTimeout in the main thread after `seconds` (covers Python-level hangs; a hung
    GPU kernel is the parent's job: it kills the whole process group)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise CaseTimeout(f"exceeded {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line(exc: BaseException, candidate_dir: str | None = None) -> str:
    """A one-line reason, pointing at the candidate's own file and line when possible."""
    late = caused_by(exc, CaseTimeout)
    if late is not None:  # the deadline, however wrapped (the interpreter re-raises it)
        return f"timeout: case {late}"
    where = ""
    tb = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(tb):
        if candidate_dir and frame.filename.startswith(candidate_dir):
            where = f" at {os.path.basename(frame.filename)}:{frame.lineno}"
            break
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" at {os.path.basename(exc.filename)}:{exc.lineno}"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}{where}: {msg}"
    if len(text) > MAX_REASON:  # said, not silently cut mid-word
        text = f"{text[:MAX_REASON]}... ({len(text) - MAX_REASON} more characters)"
    for needle, hint in HINTS.items():
        if needle in str(exc):
            text += f" (hint: {hint})"
    return text


# Known failures whose messages do not say what to change.
HINTS = {
    "mask has unsupported dtype": "the Triton CPU interpreter (3.9) rejects a vector mask combined "
    "with a scalar condition, e.g. (cols < dim) & (row < n_rows); test the scalar with `if` or "
    "broadcast it to a vector first",
    "out of resource: shared memory": "lower num_stages or the block size",
}


def load_module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def tree_hash(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# scoring: the one definition of the numbers every tool reports (the host imports these from
# harnesslab.tools.gpu.runner: objective, verify and the lab use nothing else)


def order_stats(samples: Sequence[float]) -> dict[str, float | None]:
    """median_us, p10_us, p90_us and spread ((p90-p10)/median) of timing samples. p10 rounds
    down and p90 up (nearest rank), so the reported spread is never narrower than the samples."""
    xs = sorted(float(x) for x in samples if isinstance(x, int | float) and math.isfinite(x))
    if not xs:
        return {"median_us": None, "p10_us": None, "p90_us": None, "spread": None}
    med = statistics.median(xs)
    p10, p90 = xs[int(0.1 * (len(xs) - 1))], xs[math.ceil(0.9 * (len(xs) - 1))]
    return {
        "median_us": med,
        "p10_us": p10,
        "p90_us": p90,
        "spread": (p90 - p10) / med if med > 0 else None,
    }


def score_of(medians: Sequence[float | None], passed: bool) -> float | None:
    """A candidate's score: the sum of its per-case median times (us; lower is better), only
    when every case passed and has a time."""
    if not passed or not medians or any(m is None for m in medians):
        return None
    return math.fsum(m for m in medians if m is not None)


def median_ci_halfwidth(samples: Sequence[float], z: float = 1.96) -> float | None:
    """Half-width of the ~95% confidence interval of the median, distribution-free: the order
    statistics n/2 -/+ z*sqrt(n)/2 bound it (the binomial approximation), half their distance.
    None below 5 samples (the bounds would be the extremes)."""
    xs = sorted(samples)
    n = len(xs)
    if n < 5:
        return None
    k = z * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - k)), min(n - 1, math.ceil(n / 2 + k) - 1)
    return (xs[hi] - xs[lo]) / 2


def sample_until_stable(
    draw, *, floor: int, cap: int, rel_ci: float = 0.005
) -> tuple[list[float], bool]:
    """Call `draw()` (one timing sample) at least `floor` and at most `cap` times, stopping once
    the median's confidence interval half-width is within `rel_ci` of the median. Returns the
    samples and whether they met the bound. A stable series stops at the floor; a noisy one
    runs to the cap, and says so."""
    floor, cap = max(1, floor), max(1, floor, cap)
    xs: list[float] = []
    while len(xs) < cap:
        xs.append(float(draw()))
        if len(xs) >= floor:
            half = median_ci_halfwidth(xs)
            med = statistics.median(xs)
            if half is not None and med > 0 and half <= rel_ci * med:
                return xs, True
    return xs, False


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the positive values (None when there are none)."""
    xs = [float(v) for v in values if isinstance(v, int | float) and v > 0]
    return math.exp(math.fsum(map(math.log, xs)) / len(xs)) if xs else None


# ----------------------------------------------------------------------------------------------
# environment (torch is imported lazily so `--help` and errors stay cheap)


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
    # L2, because one call is too short for event resolution. Every isolated sample also records
    # an event after a whole-device synchronize: `sync_tail_us` exposes work left on other
    # streams. % of copy bandwidth is against one large (1 GiB) device copy timed the same
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

    def calls_per_window(self, nbytes: int, *, floor_us: float, lo: int, hi: int) -> int:
        """Back-to-back calls that make about 1 ms of device time at copy speed (event
        resolution and the final synchronize's host latency stay under 2%), in [lo, hi]. The
        guarded verify's replay windows use it too (guard_gpu.time_samples)."""
        est_us = max(nbytes / (self.copy_gbps() * 1e3), floor_us)
        return max(lo, min(hi, math.ceil(1000.0 / est_us)))

    def graph_calls(self, nbytes: int, n_sets: int) -> int:
        """Back-to-back calls per graph: about 1 ms of work, a multiple of the rotation."""
        calls = self.calls_per_window(nbytes, floor_us=1.0, lo=n_sets, hi=2000)
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
        buf = self.__dict__.get("_flush_buf")
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
        """One call per sample from a clean L2, stream primed so launch latency is hidden.
        `samples` is the floor; with `cap` above it, sampling stops early once the median is
        known to within RELATIVE_CI (sample_until_stable)."""
        torch = self.torch
        self.flush_l2()  # allocates the flush buffer before the first sample
        torch.cuda.synchronize()
        # Sleep long enough to cover the host's enqueue of start event + call + end event.
        sleep_cycles = int(min(max(3 * host_us + 50, 100), 5000) * 2000)  # ~2 GHz SM clock
        start, end, after_sync = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        call(0)
        torch.cuda.synchronize()
        tails: list[float] = []

        def one() -> float:
            self.flush_l2()
            torch.cuda._sleep(sleep_cycles)
            start.record()
            call(len(tails))
            end.record()
            torch.cuda.synchronize()
            after_sync.record()
            after_sync.synchronize()
            tails.append(end.elapsed_time(after_sync) * 1e3)
            return start.elapsed_time(end) * 1e3

        times, _ = sample_until_stable(one, floor=samples, cap=cap or samples,
                                       rel_ci=RELATIVE_CI)  # fmt: skip
        return times, tails

    def graph_times(
        self, call, calls: int, samples: int, warmup: int, cap: int | None = None
    ) -> list[float]:
        """Per-call microseconds of CUDA-graph replays of `calls` back-to-back calls; at least
        `samples` replays, up to `cap` until the median is stable (sample_until_stable)."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up on a side stream, as graph capture requires
            for i in range(max(warmup, 2)):
                call(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                call(i)
        graph.replay()
        torch.cuda.synchronize()
        out, _ = sample_until_stable(lambda: self.window(graph.replay) / calls, floor=samples,
                                     cap=cap or samples, rel_ci=RELATIVE_CI)  # fmt: skip
        return out  # the graph (and its memory pool) goes with this frame


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
# correctness


def dtype_of(torch, name: str):
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def poison_allocator(torch, device: str, nbytes: int) -> None:
    """Fill freed allocator memory with NaN so an output the candidate forgets to write shows up
    as NaN instead of stale correct values (the caching allocator hands the block back)."""
    if device != "cuda" or nbytes <= 0:
        return
    junk = torch.empty(nbytes // 2 + 1, dtype=torch.float16, device=device)
    junk.fill_(float("nan"))
    del junk


def compare(torch, out, ref, tol: dict[str, float], expected_shape, expected_dtype, inputs):
    """Check one output against the fp32 reference. Returns (passed, reason, stats)."""
    stats: dict[str, Any] = {"max_abs_err": None, "max_rel_err": None}
    if type(out) is not torch.Tensor:
        return False, f"output is {type(out).__name__}, expected a plain torch.Tensor", stats
    if tuple(out.shape) != tuple(expected_shape):
        return False, f"wrong shape {tuple(out.shape)}, expected {tuple(expected_shape)}", stats
    if out.dtype != expected_dtype:
        return False, f"wrong dtype {out.dtype}, expected {expected_dtype}", stats
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.data_ptr() == out.data_ptr() and t.numel():
            return False, "output aliases an input buffer", stats
    o = out.float()
    n_nan = int(torch.isnan(o).sum())
    n_inf = int(torch.isinf(o).sum())
    diff = (o - ref).abs()
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if bool(finite.any()) else float("inf")
    rel = diff / ref.abs().clamp_min(max(tol["atol"], 1e-30))
    max_rel = float(rel[finite].max()) if bool(finite.any()) else float("inf")
    stats.update(max_abs_err=_finite(max_abs), max_rel_err=_finite(max_rel), nan=n_nan, inf=n_inf)
    if n_nan or n_inf:
        return False, f"output has {n_nan} NaN and {n_inf} Inf values", stats
    bad = diff > (tol["atol"] + tol["rtol"] * ref.abs())
    n_bad = int(bad.sum())
    if n_bad:
        idx = tuple(int(i) for i in (bad.nonzero()[0]))
        stats["worst_index"] = list(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        return (
            False,
            f"{n_bad} of {diff.numel()} elements out of tolerance (first at {list(idx)}, "
            f"max abs err {max_abs:.3g}, atol {tol['atol']}, rtol {tol['rtol']})",
            stats,
        )
    return True, "", stats


def snapshot_inputs(torch, args) -> list:
    return [a.clone() if isinstance(a, torch.Tensor) else None for a in args]


def inputs_unchanged(torch, args, saved) -> bool:
    for a, s in zip(args, saved, strict=True):
        if s is not None and not torch.equal(a, s):
            return False
    return True


# ----------------------------------------------------------------------------------------------
# evaluation


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


class Evaluator:
    def __init__(self, env: Env, req: dict[str, Any]) -> None:
        self.env = env
        self.req = req
        self.phases = Phases()
        self.torch = env.torch
        self.ref = load_module(
            Path(req["reference"]), f"_hl_reference_{tree_hash(Path(req['reference']).parent)}"
        )
        self.tolerances = req["tolerances"]
        self.seed = int(req.get("seed", 0))
        self.interpret = env.interpret
        self.case_timeout_s = float(req.get("case_timeout_s", 120))

    # -- candidate loading ---------------------------------------------------------------------
    def load_candidate(self, candidate_dir: str, config: dict[str, Any] | None = None):
        """Import the candidate's entry function. With `config`, a private copy of the folder
        gets that kernel_config.json, so sweeps never touch the workspace."""
        folder = Path(candidate_dir)
        if config is not None:
            tmp = Path(tempfile.mkdtemp(prefix="hl_variant_"))
            shutil.copytree(folder, tmp, dirs_exist_ok=True)
            (tmp / self.req["config_file"]).write_text(json.dumps(config))
            folder = tmp
        file_name, func_name = self.req["entry"].split(":", 1)
        path = folder / file_name
        if not path.is_file():
            raise FileNotFoundError(f"{file_name} not found in the candidate")
        mod = load_module(path, f"_hl_candidate_{tree_hash(folder)}")
        modelnew = load_module(Path(HERE) / "modelnew.py", "_hl_modelnew")
        module = getattr(self.ref, "MODULE", None)  # a declared module task (KernelBench)
        fn = modelnew.resolve(mod, func_name, module)
        if not callable(fn):
            also = f" or class {modelnew.ENTRY_CLASS}" if module is not None else ""
            raise AttributeError(f"{file_name} defines no function {func_name}(){also}")
        if modelnew.is_module_class(fn):
            fn = modelnew.ModuleEntry(fn, module)
        return fn, str(folder)

    def case_shape(self, case: dict[str, Any]) -> dict[str, int]:
        shape = dict(case["shape"])
        if self.interpret and hasattr(self.ref, "interpreter_shape"):
            shape = self.ref.interpreter_shape(shape)
        return shape

    def make(self, shape, dtype, salt: int):
        # Inputs are drawn on the device (a CPU draw of a 4096x8192 case costs ~0.3 s a tensor).
        gen = self.torch.Generator(device=self.env.device)
        gen.manual_seed((self.seed * 1_000_003 + salt) % (2**63))
        return self.ref.make_inputs(shape, dtype, self.env.device, gen)

    # -- one case --------------------------------------------------------------------------------
    def run_case(self, fn, case: dict[str, Any], idx: int, cand_dir: str, *, timing: bool) -> dict:
        torch = self.torch
        shape = self.case_shape(case)
        dtype = dtype_of(torch, case["dtype"])
        tol = self.tolerances[case["dtype"]]
        res: dict[str, Any] = {
            "name": case["name"],
            "dtype": case["dtype"],
            "shape": shape,
            "rows": shape.get("rows"),
            "dim": shape.get("dim"),
            "passed": False,
            "status": "failed",
            "reason": "",
        }
        try:
            with deadline(self.case_timeout_s):
                checks = int(self.req.get("checks", 1))
                for check in range(checks):
                    with self.phases("inputs", self.env.sync):
                        args, kwargs = self.make(shape, dtype, salt=idx * 101 + check)
                        expected = self.ref.reference(*args, **kwargs)
                        out_shape, out_dtype = self.ref.output_spec(*args, **kwargs)
                        saved = snapshot_inputs(torch, args)
                        poison_allocator(torch, self.env.device, expected.numel() * 2)
                    with self.phases("correctness"):
                        out = fn(*args, **kwargs)
                        self.env.sync()
                        ok, reason, stats = compare(
                            torch, out, expected, tol, out_shape, out_dtype, args
                        )
                        res.update(stats)
                        if ok and not inputs_unchanged(torch, args, saved):
                            ok, reason = False, "the candidate modified its inputs"
                    if not ok:
                        res["reason"] = reason
                        return res
                    del out, expected, saved
                if timing:
                    with self.phases("timing", self.env.sync):
                        res.update(self.time_case(fn, shape, dtype, idx))
        except Exception as exc:
            # The Triton interpreter re-raises what a kernel body raised, the deadline too, as
            # InterpreterError(repr(e)) from e.
            timed_out = caused_by(exc, CaseTimeout) is not None
            res.update(status="timeout" if timed_out else "error", reason=one_line(exc, cand_dir))
            return res
        finally:
            if self.env.device == "cuda":
                torch.cuda.empty_cache()
        res.update(passed=True, status="passed")
        return res

    def time_case(self, fn, shape, dtype, idx: int) -> dict[str, Any]:
        env, torch = self.env, self.torch
        nbytes = int(self.ref.bytes_moved(shape, torch.finfo(dtype).bits // 8))
        warmup = int(self.req.get("warmup", 10))
        samples = int(self.req.get("repeats", 30))  # the cap of adaptive sampling
        floor = max(1, min(int(self.req.get("min_samples", MIN_SAMPLES)), samples))
        if self.interpret:
            args, kwargs = self.make(shape, dtype, salt=idx * 101 + 7)
            # The interpreter says nothing about speed: a few samples keep eval fast on a CPU.
            times = env.time_fn(
                lambda: fn(*args, **kwargs), calls=1, samples=min(samples, 3), warmup=min(warmup, 1)
            )
            single, tails = times, [0.0]
            method, calls, n_sets = "wall_clock_interpreter", 1, 1
        else:
            n_sets = env.sets_needed(nbytes)
            with self.phases("timing_inputs", env.sync):  # not in "timing": Phases are exclusive
                sets = [self.make(shape, dtype, salt=idx * 101 + 11 + s) for s in range(n_sets)]

            def call(i: int):
                a, k = sets[i % n_sets]
                return fn(*a, **k)

            # Single eager calls with nothing queued before them: host launch latency included.
            for i in range(max(2, min(warmup, n_sets))):
                call(i)
            single = [env.window(lambda i=i: call(i)) for i in range(max(5, min(samples, 20)))]
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
        stats = order_stats(times)
        med = stats["median_us"] or 0.0
        half = median_ci_halfwidth(times)
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

    # -- modes ------------------------------------------------------------------------------------
    def evaluate(
        self, candidate_dir: str, config: dict[str, Any] | None = None, *, timing=True
    ) -> dict:
        started = time.perf_counter()
        cases = self.req["cases"]
        try:
            with self.phases("load"):
                fn, cand_dir = self.load_candidate(candidate_dir, config)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            reason = f"import failed: {one_line(exc, str(candidate_dir))}"
            results = [
                {
                    "name": c["name"],
                    "dtype": c["dtype"],
                    "shape": c["shape"],
                    "passed": False,
                    "status": "error",
                    "reason": reason,
                }
                for c in cases
            ]
            for r in results:
                emit({"event": "case", **r})
            return self._summary(results, started, error=reason)
        results = []
        for i, case in enumerate(cases):
            r = self.run_case(fn, case, i, cand_dir, timing=timing)
            emit({"event": "case", **r})
            results.append(r)
        return self._summary(results, started)

    def _summary(self, results, started, error: str = "") -> dict[str, Any]:
        passed = all(r["passed"] for r in results) and bool(results)
        score = score_of([r.get("median_us") for r in results], passed)
        geo = geomean([r.get("pct_of_copy_bw") for r in results]) if passed else None
        status = "passed" if passed else "failed"
        failed = [r for r in results if not r["passed"]]
        return {
            "status": status,
            "score_us": score,
            "geomean_pct_of_copy_bw": geo,
            "cases": results,
            "reason": error or (f"{failed[0]['name']}: {failed[0]['reason']}" if failed else ""),
            "wall_s": time.perf_counter() - started,
            "phases_s": dict(self.phases),
        }

    def sweep(self) -> dict[str, Any]:
        """Evaluate every config in req['configs']; one bad config never fails the sweep.
        Ranking needs fewer samples than a score: unless the request says otherwise, each
        case takes SWEEP_MIN_SAMPLES to SWEEP_REPEATS samples (adaptive) after SWEEP_WARMUP
        calls."""
        self.req.setdefault("warmup", SWEEP_WARMUP)
        self.req.setdefault("repeats", SWEEP_REPEATS)
        self.req.setdefault("min_samples", SWEEP_MIN_SAMPLES)
        out = []
        compile_only = bool(self.req.get("compile_only"))
        for i, config in enumerate(self.req["configs"]):
            t0 = time.perf_counter()
            res = self.evaluate(self.req["candidate_dir"], config, timing=not compile_only)
            entry = {
                "config": config,
                "status": res["status"],
                "score_us": res["score_us"],
                "reason": res["reason"],
                "cases": res["cases"],
                "wall_s": time.perf_counter() - t0,
            }
            emit(
                {
                    "event": "config",
                    "index": i,
                    **{k: entry[k] for k in ("config", "status", "score_us", "reason")},
                }
            )
            out.append(entry)
        return {"status": "passed", "configs": out}

    def probe(self) -> dict[str, Any]:
        """Numerical edge cases against the candidate: the task's reference.PROBES (fixed
        shapes), then the generic suite (numerics.py: size edges and value families) at the
        first dev case of each dtype. A task probe of the same name as a suite edge wins."""
        import numerics  # noqa: PLC0415 - staged sibling (the host imports this module too)

        torch = self.torch
        fn, cand_dir = self.load_candidate(self.req["candidate_dir"])
        probes = getattr(self.ref, "PROBES", {})
        notes = {**numerics.NOTES, **getattr(self.ref, "PROBE_NOTES", {})}
        suite = numerics.Suite(torch, self.ref, self.env.device, self.req.get("numerics"),
                               interpret=self.interpret,
                               scale=lambda s: self.case_shape({"shape": s}))  # fmt: skip
        wanted = self.req.get("probes") or [*probes, *(n for n in suite.names() if n not in probes)]
        cases = self.req.get("cases") or [{"dtype": None, "shape": {}}]
        results = []
        for name in wanted:
            for dname in self.req.get("dtypes") or list(self.tolerances):
                dtype, tol = dtype_of(torch, dname), self.tolerances[dname]
                seed = self.seed + zlib.crc32(name.encode()) % 10_000  # hash() is salted
                r: dict[str, Any] = {"probe": name, "dtype": dname, "note": notes.get(name, "")}
                try:
                    with deadline(self.case_timeout_s):
                        if name in probes:
                            gen = torch.Generator().manual_seed(seed)
                            args, kwargs = probes[name](dtype, self.env.device, gen)
                            expected = self.ref.reference(*args, **kwargs)
                        else:
                            case = next((c for c in cases if c["dtype"] == dname), cases[0])
                            gen = torch.Generator(device=self.env.device).manual_seed(seed)
                            edge = suite.edge(name, self.case_shape(case), dtype, gen, tol)
                            r.update(edge.describe())
                            args, kwargs, expected = edge.args, edge.kwargs, edge.expected
                        if expected is not None:
                            oshape, odtype = self.ref.output_spec(*args, **kwargs)
                            out = fn(*args, **kwargs)
                            self.env.sync()
                            ok, why, stats = compare(
                                torch, out, expected, tol, oshape, odtype, args
                            )
                            ratio = numerics.tolerance_ratio(torch, out, expected, tol)
                            r.update(stats, passed=ok, reason=why, shape=list(args[0].shape),
                                     tolerance_ratio=_finite(ratio))  # fmt: skip
                        else:  # the reference cannot take this family here: nothing to judge
                            r.update(passed=True, reason=f"not applicable: {edge.why}")
                except Exception as exc:
                    r.update(passed=False, reason=one_line(exc, cand_dir))
                emit({"event": "probe", **r})
                results.append(r)
        return {
            "status": "passed" if all(r["passed"] for r in results) else "failed",
            "probes": results,
        }

    def profile_target(self) -> dict[str, Any]:
        """One case, `repeats` calls between cudaProfilerStart/Stop and nothing timed: the
        target of `ncu --profile-from-start off`. Warm-up calls (compile, autotune) run before
        the window, so the profiler sees only the candidate's steady-state launches."""
        torch = self.torch
        fn, _ = self.load_candidate(self.req["candidate_dir"])
        case = self.req["cases"][0]
        shape = self.case_shape(case)
        args, kwargs = self.make(shape, dtype_of(torch, case["dtype"]), salt=7)
        for _ in range(int(self.req.get("warmup", 2))):
            fn(*args, **kwargs)
        self.env.sync()
        repeats = int(self.req.get("repeats", 3))
        profiled = self.env.device == "cuda"
        if profiled:
            torch.cuda.profiler.start()
        for _ in range(repeats):
            fn(*args, **kwargs)
        self.env.sync()
        if profiled:
            torch.cuda.profiler.stop()
        nbytes = self.ref.bytes_moved(shape, torch.finfo(dtype_of(torch, case["dtype"])).bits // 8)
        return {
            "status": "passed",
            "case": case["name"],
            "shape": shape,
            "calls": repeats,
            "bytes": int(nbytes),
            "profiled": profiled,
        }


def check_harness(expected: dict[str, str]) -> None:
    """The staged files this process may import are the ones the host's package holds (a
    file changed on the GPU host after staging is never imported)."""
    for name, digest in expected.items():
        path = os.path.join(HERE, os.path.basename(name))
        try:
            with open(path, "rb") as fh:
                actual = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            actual = ""
        if actual != digest:
            raise RuntimeError(
                f"staged harness file {os.path.basename(name)} does not match "
                "the installed package; the host re-stages it on the next call"
            )


def handle(env: Env, req: dict[str, Any]) -> dict[str, Any]:
    mode = req.get("mode", "evaluate")
    t0 = time.perf_counter()
    if isinstance(req.get("harness_sha256"), dict):
        check_harness(req["harness_sha256"])
    if mode == "health":
        result: dict[str, Any] = {"status": "passed"}
        if req.get("measure_copy", True):
            result["copy_gbps"] = env.copy_gbps()
    else:
        cache = req.get("triton_cache")
        if mode != "verify" and isinstance(cache, str) and cache:
            # The candidate's dev cache (the launcher grants it): compile workers fill it, the
            # timing worker reads it. Triton reads the variable at each compile.
            os.makedirs(cache, exist_ok=True)
            os.environ["TRITON_CACHE_DIR"] = cache
        ev = Evaluator(env, req)
        if mode == "evaluate":
            result = ev.evaluate(req["candidate_dir"], req.get("config"))
        elif mode == "sweep":
            result = ev.sweep()
        elif mode == "probe":
            result = ev.probe()
        elif mode == "profile_target":
            result = ev.profile_target()
        elif mode == "verify":  # guarded: the candidate runs in a child process (guard.py)
            import guard

            result = guard.verify(env, req, sys.modules[__name__])
        else:
            raise ValueError(f"unknown mode {mode!r}")
        if mode in ("evaluate", "sweep"):
            with ev.phases("copy_bandwidth"):  # measured once per process (cached after)
                result["copy_gbps"] = env.copy_gbps() if not req.get("compile_only") else None
            result["phases_s"] = dict(ev.phases)
    result.update(mode=mode, env=env.info(), seed=req.get("seed"), request_id=req.get("request_id"))
    result["runner_wall_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    global _OUT
    argv = list(sys.argv[1:] if argv is None else argv)
    # Keep the protocol stream private: candidate prints go to stderr.
    _OUT = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    interpret_env = os.environ.get("HARNESSLAB_RUNNER_INTERPRET", "auto")
    worker = "--worker" in argv
    env: Env | None = None

    def get_env(req: dict[str, Any]) -> Env:
        nonlocal env
        if env is None:
            want = req.get("interpret", interpret_env)
            if want == "auto":
                import torch

                want = not torch.cuda.is_available()
            env = Env(bool(want) and want != "never")
        return env

    if not worker:
        paths = [a for a in argv if not a.startswith("--")]
        if not paths:
            sys.stderr.write("usage: runner.py REQUEST.json | --worker\n")
            return 2
        req = json.loads(Path(paths[0]).read_text()) if paths[0] != "-" else json.load(sys.stdin)
        try:
            emit({"event": "result", **handle(get_env(req), req)})
        except Exception as exc:
            emit(
                {
                    "event": "result",
                    "status": "error",
                    "reason": one_line(exc),
                    "mode": req.get("mode"),
                }
            )
            traceback.print_exc()
            return 1
        return 0
    idle_s = float(os.environ.get("HARNESSLAB_WORKER_IDLE_S", "0")) or None
    emit({"event": "ready", "pid": os.getpid()})
    import select  # noqa: PLC0415

    while True:
        # Exit when idle so a forgotten worker does not hold GPU memory forever.
        ready, _, _ = select.select([sys.stdin], [], [], idle_s)
        if not ready:
            return 0
        line = sys.stdin.readline()
        if not line:
            return 0
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            emit({"event": "result", **handle(get_env(req), req)})
        except Exception as exc:
            emit({"event": "result", "status": "error", "reason": one_line(exc)})
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
