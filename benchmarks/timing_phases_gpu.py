"""Where a dev case's timing spends its host wall time (issue 30: run_objective <= 0.2 s): each
rmsnorm_gate dev case through the runner's own per-case path (tools/gpu/runner.py
`Evaluator.run_case`, the one timing implementation in timing.py), with the Env's timing
methods wrapped in wall clocks: the single eager calls (`window`), the CUDA-graph path
(`graph_times`: warm-up, capture, replays), the isolated path (`isolated_times`), and the case
without timing (correctness only) for comparison.

    python benchmarks/timing_phases_gpu.py [--task rmsnorm_gate] [--entry fast.py:rmsnorm_gate]
                                           [--rounds 3] [--repeats 30] [--gpu-dir DIR]
                                           [--keep-cache]

The correctness-only run is split by the runner's own phases: inputs (draw, reference,
snapshot, poison), check (the candidate's call and the comparison) and the rest (the case's
allocator release). --keep-cache turns the per-case torch.cuda.empty_cache() into a no-op, to
show what the allocator release costs. Per case also (the largest over the rounds): "set gap",
how far apart the input sets'
own medians are in the isolated samples (benchmarks/timing_variants.py's oneset); "spread",
(p90 - p10) / median.

No harnesslab install: the staged files are imported from tools/gpu/ by name, as on a GPU host
(--gpu-dir: from another flat folder of them instead, e.g. an older commit's, for an A/B).
Prints one row per case (median over the rounds); writes $OUT/timing_phases.json when OUT is set.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if "--gpu-dir" in sys.argv:
    GPU_DIR = Path(sys.argv[sys.argv.index("--gpu-dir") + 1]).resolve()
else:
    GPU_DIR = ROOT / "tools" / "gpu"
sys.path.insert(0, str(GPU_DIR))  # the staged layout: siblings import by name

import dev_task  # noqa: E402  (beside this script)
import runner  # noqa: E402

WRAPPED = ("window", "graph_times", "isolated_times", "copy_gbps")


def wrap(env: Any, spent: dict[str, float]) -> None:
    """Charge each wrapped Env method's wall time to `spent` (outermost call only)."""
    depth = [0]
    for name in WRAPPED:
        inner = getattr(env, name)

        def timed(*a: Any, _inner: Any = inner, _name: str = name, **k: Any) -> Any:
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[_name] += time.perf_counter() - t0

        setattr(env, name, timed)


def watch_isolated(env: Any, seen: dict[str, Any]) -> None:
    """Record the isolated path's last samples ("times")."""
    isolated = env.isolated_times

    def times(*a: Any, **k: Any) -> Any:
        out = isolated(*a, **k)
        seen["times"] = list(out[0])
        return out

    env.isolated_times = times


def set_gap(times: list[float], n_sets: int) -> float | None:
    """How far apart the input sets' own medians are, relative to the median of all samples
    (sample k of the isolated path uses set k % n_sets): a rotation over sets that time
    differently makes the median of an even count the mean of two extremes."""
    per_set = [times[s::n_sets] for s in range(n_sets)]
    if n_sets < 2 or min(map(len, per_set)) < 3:
        return None
    meds = [statistics.median(x) for x in per_set]
    return (max(meds) - min(meds)) / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="rmsnorm_gate")
    ap.add_argument("--entry", default="fast.py:rmsnorm_gate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30, help="the cap of adaptive sampling")
    ap.add_argument("--gpu-dir", type=Path, help="import runner.py and its siblings from here")
    ap.add_argument("--keep-cache", action="store_true", help="no per-case empty_cache()")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile the timed cases of the last round: print the N costliest by own time",
    )
    args = ap.parse_args(argv)
    print(f"runner from {GPU_DIR.name}, keep cache {args.keep_cache}")
    env = dev_task.cuda_env(runner)
    if env is None:
        return 2
    toml, req = dev_task.dev_request(args.task, args.entry, args.repeats)
    ev = runner.Evaluator(env, req)
    fn, cand_dir = ev.load_candidate(str(ROOT / "tasks" / args.task / "solutions"))
    env.copy_gbps()  # measured once per process, outside every case
    if args.keep_cache:
        env.torch.cuda.empty_cache = lambda: None
    spent: dict[str, float] = collections.defaultdict(float)
    seen: dict[str, Any] = {"times": []}
    watch_isolated(env, seen)  # inside the wall clocks of wrap(): counted in isolated_times
    wrap(env, spent)
    cases = dev_task.dev_cases(toml)
    rows: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    import cProfile
    import pstats

    prof = cProfile.Profile()
    for rnd in range(args.rounds):
        for i, case in enumerate(cases):
            before = dict(ev.phases)
            t0 = time.perf_counter()
            ev.run_case(fn, case, i, cand_dir, timing=False)
            check_s = time.perf_counter() - t0
            split = {k: ev.phases.get(k, 0.0) - before.get(k, 0.0)
                     for k in ("inputs", "correctness")}  # fmt: skip
            spent.clear()
            seen.update(times=[])
            profiling = args.profile and rnd == args.rounds - 1
            if profiling:
                prof.enable()
            t0 = time.perf_counter()
            res = ev.run_case(fn, case, i, cand_dir, timing=True)
            if profiling:
                prof.disable()
            rows[case["name"]].append({"total_s": time.perf_counter() - t0, "check_s": check_s,
                                       "inputs_s": split["inputs"],
                                       "compare_s": split["correctness"],
                                       **{f"{k}_s": spent[k] for k in WRAPPED[:3]},
                                       "samples": res.get("samples"),
                                       "method": res.get("timing_method"),
                                       "median_us": res.get("median_us"),
                                       "calls": res.get("calls_per_sample"),
                                       "set_gap": set_gap(seen["times"],
                                                          int(res.get("input_sets") or 1)),
                                       "spread": res.get("spread")})  # fmt: skip
    print(
        f"{env.info()['device']}, torch {env.torch.__version__}; median of {args.rounds} rounds, ms"
    )
    head = f"{'case':18} {'method':10} {'samples':>7} {'calls':>5} {'median us':>9} | {'total':>7} {'check':>7} {'singles':>7} {'graph':>7} {'isolated':>8} | {'inputs':>7} {'compare':>7} | {'set gap':>8} {'spread':>7}"
    print(head)
    sums: dict[str, float] = collections.defaultdict(float)
    for name, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("total_s", "check_s", "window_s",
                                                               "graph_times_s", "isolated_times_s",
                                                               "inputs_s", "compare_s")}  # fmt: skip
        for k, v in med.items():
            sums[k] += v
        last = rs[-1]
        print(f"{name:18} {str(last['method'])[:10]:10} {last['samples']!s:>7} {last['calls']!s:>5} "
              f"{last['median_us'] or 0:9.2f} | {med['total_s'] * 1e3:7.1f} {med['check_s'] * 1e3:7.1f} "
              f"{med['window_s'] * 1e3:7.1f} {med['graph_times_s'] * 1e3:7.1f} {med['isolated_times_s'] * 1e3:8.1f}"
              f" | {med['inputs_s'] * 1e3:7.1f} {med['compare_s'] * 1e3:7.1f}"
              f" | {pct(r['set_gap'] for r in rs):>8}"
              f" {pct(r['spread'] for r in rs):>7}")  # fmt: skip
    print(f"{'sum':18} {'':10} {'':>7} {'':>5} {'':>9} | {sums['total_s'] * 1e3:7.1f} {sums['check_s'] * 1e3:7.1f} "
          f"{sums['window_s'] * 1e3:7.1f} {sums['graph_times_s'] * 1e3:7.1f} {sums['isolated_times_s'] * 1e3:8.1f}"
          f" | {sums['inputs_s'] * 1e3:7.1f} {sums['compare_s'] * 1e3:7.1f}")  # fmt: skip
    if args.profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "timing_phases.json"
        path.write_text(
            json.dumps(
                {"info": env.info(), "args": vars(args), "rows": rows}, indent=1, default=str
            )
        )
        print(f"wrote {path}")
    return 0


def pct(values: Any) -> str:
    """The largest of the rounds' fractions as a percentage ("-" when none has one)."""
    xs = [v for v in values if isinstance(v, int | float)]
    return f"{100 * max(xs):.2f}%" if xs else "-"


if __name__ == "__main__":
    sys.exit(main())
