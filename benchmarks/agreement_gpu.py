"""Why two back-to-back evals disagree on a bandwidth-bound case (issue 30: <= 1% on every
such case, every run; measured 0.30-1.24% as the worst case of a run): the isolated cases of a
task's dev set through the runner's own per-case path (tools/gpu/runner.py `Evaluator.run_case`,
timing.py's isolated method), many rounds back to back in one process, under several caps of
adaptive sampling and input-set counts, rounds interleaved so a drift of the device hits every
variant alike.

    python benchmarks/agreement_gpu.py [--task rmsnorm_gate] [--dir tasks/rmsnorm_gate/workspace]
                                       [--entry kernel.py:rmsnorm_gate] [--rounds 24]
                                       [--variants 30:1,60:1,120:1]

A variant is CAP:SETS[:FLOOR][/b]: the cap of adaptive sampling; the fewest input sets a case
rotates over (timing.py's Env.sets_needed raised to SETS; 1 leaves it as shipped, which gives
the large cases two); the floor of adaptive sampling (0 or left out: timing.MIN_SAMPLES); "/b":
the isolated samples of the timing.py named by --before (an earlier version, e.g. `git show
HEAD~1:tools/gpu/timing.py > .whl/timing_before.py`, carried to the GPU host), so one process
compares two implementations round by round; "/NAME", of the one --impl NAME=PATH names. The label printed is all of it. Each row also
says what the isolated timing of one case took on the host's clock ("ms"). Results:
BENCHMARKS.md, eleventh and thirteenth sessions.
Each set is an allocation of its own, and the runner empties the allocator's cache after every
case, so each round's sets sit in other memory.

Per case and variant: the rounds' medians; "pairs > 1%", how many consecutive rounds (two
back-to-back evals, as bench_ssh_e2e.py's agreement takes them) differ by more than 1% of their
mean; the worst such pair; "between", the spread of the rounds' medians (robust_sd over their
median); "within", what one round's own samples predict for it (1.2533 * robust_sd / sqrt(n) /
median, the median's standard error under Gaussian noise). robust_sd is 1.4826 x the median
absolute deviation: a rare disturbance (one round 100% off) does not swamp it. Between
much larger than within: the rounds differ by more than their samples' noise (the device's
state, the inputs' memory), which more samples cannot fix; close: more samples tighten it.
Last, the fraction of whole "runs" (one round of every case) with a case over 1%, per variant:
what the issue's target counts. Writes $OUT/agreement.json when OUT is set.

No harnesslab install: the staged files are imported from tools/gpu/ by name, as on a GPU host.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))  # the staged layout: siblings import by name

import dev_task  # noqa: E402  (beside this script)
import runner  # noqa: E402


def robust_sd(xs: list[float]) -> float:
    """1.4826 x the median absolute deviation: the standard deviation under Gaussian noise."""
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs)


def within(times: list[float]) -> float | None:
    """The median's relative standard error that a round's own samples predict."""
    if len(times) < 3:
        return None
    med = statistics.median(times)
    return 1.2533 * robust_sd(times) / math.sqrt(len(times)) / med if med else None


def pair_gaps(medians: list[float]) -> list[float]:
    """|a - b| / mean for each two consecutive rounds."""
    return [abs(a - b) / ((a + b) / 2) for a, b in itertools.pairwise(medians)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="rmsnorm_gate")
    ap.add_argument("--dir", default="tasks/rmsnorm_gate/workspace")
    ap.add_argument("--entry", default="kernel.py:rmsnorm_gate")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--variants", default="30:1,60:1,120:1", help="CAP:SETS[:FLOOR][/b], compared")
    ap.add_argument("--before", help="an earlier timing.py: the isolated samples of /b variants")
    ap.add_argument("--impl", action="append", default=[], metavar="NAME=PATH",
                    help="another timing.py: the isolated samples of /NAME variants")  # fmt: skip
    args = ap.parse_args(argv)
    env = dev_task.cuda_env(runner)
    if env is None:
        return 2
    defaults = ["1", "0"]  # SETS, FLOOR
    variants = []
    for v in args.variants.split(","):
        spec, _, impl = v.partition("/")
        parts = spec.split(":")
        variants.append((*(int(x) for x in parts + defaults[len(parts) - 1 :]), impl))
    evs = {}
    for cap, _, floor, _ in variants:
        toml, req = dev_task.dev_request(args.task, args.entry, cap)
        if floor:
            req["min_samples"] = floor
        evs[(cap, floor)] = runner.Evaluator(env, req)
    first = evs[(variants[0][0], variants[0][2])]
    fn, cand_dir = first.load_candidate(str(ROOT / args.dir))
    env.copy_gbps()
    cases = dev_task.dev_cases(toml)
    seen: list[list[float]] = []
    shipped_sets, min_sets = env.sets_needed, [1]
    impls = {"": env.isolated_times}
    others = [f"b={args.before}"] * bool(args.before) + args.impl
    for name, _, path in (o.partition("=") for o in others):
        # an Env of that timing.py with this one's state (torch, L2, copy bandwidth)
        spec = importlib.util.spec_from_file_location(f"timing_{name}", path)
        assert spec and spec.loader, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        other = module.Env.__new__(module.Env)
        other.__dict__.update(env.__dict__)
        impls[name] = other.isolated_times
    impl = [""]

    took: list[float] = []

    def isolated(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        times, tails = impls[impl[0]](*a, **k)
        took.append((time.perf_counter() - t0) * 1e3)
        seen.append(list(times))
        return times, tails

    env.isolated_times = isolated
    env.sets_needed = lambda nbytes: max(shipped_sets(nbytes), min_sets[0])
    # Which cases are isolated: one round as shipped (also every case's warm-up).
    iso = []
    for i, case in enumerate(cases):
        res = first.run_case(fn, case, i, cand_dir, timing=True)
        if res.get("timing_method") == "isolated":
            iso.append((i, case))
    label = {v: ":".join(map(str, v[:3])) + (f"/{v[3]}" if v[3] else "") for v in variants}
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        label[v]: collections.defaultdict(list) for v in variants
    }
    for rnd in range(args.rounds):
        k = rnd % len(variants)
        for v in variants[k:] + variants[:k]:  # rotated: a drift hits every variant alike
            cap, min_sets[0], floor, impl[0] = v
            for i, case in iso:
                seen.clear()
                took.clear()
                res = evs[(cap, floor)].run_case(fn, case, i, cand_dir, timing=True)
                rows[label[v]][case["name"]].append({
                    "median_us": res.get("median_us"), "samples": res.get("samples"),
                    "sets": res.get("input_sets"), "within": within(seen[-1] if seen else []),
                    "times_us": seen[-1] if seen else [], "ms": took[-1] if took else None,
                })  # fmt: skip
    print(f"{env.info()['device']}, torch {env.torch.__version__}; {args.dir}/{args.entry}, "
          f"{args.rounds} rounds per variant (CAP:SETS), rounds interleaved")  # fmt: skip
    print(f"{'case':18} {'variant':>7} {'samples':>9} {'sets':>4} {'median us':>9} "
          f"{'pairs>1%':>9} {'worst':>7} {'between':>8} {'within':>7} {'ms':>5}")  # fmt: skip
    summary: dict[str, Any] = {}
    for name, by_case in rows.items():
        runs_over = [False] * args.rounds
        for _, case in iso:
            rs = by_case[case["name"]]
            meds = [float(r["median_us"]) for r in rs]
            gaps = pair_gaps(meds)
            for j, g in enumerate(gaps):
                runs_over[j + 1] |= g > 0.01
            ws = [r["within"] for r in rs if r["within"] is not None]
            between = robust_sd(meds) / statistics.median(meds)
            samples = [int(r["samples"] or 0) for r in rs]
            print(f"{case['name']:18} {name:>7} {min(samples):4d}-{max(samples):<4d} "
                  f"{rs[-1]['sets']!s:>4} {statistics.median(meds):9.2f} "
                  f"{sum(g > 0.01 for g in gaps):4d}/{len(gaps):<4d} {100 * max(gaps):6.2f}% "
                  f"{100 * between:7.2f}% "
                  f"{100 * statistics.median(ws) if ws else float('nan'):6.2f}% "
                  f"{statistics.median(r['ms'] for r in rs):5.1f}")  # fmt: skip
        over = sum(runs_over[1:])
        summary[name] = {"runs_with_a_case_over_1pct": over, "runs": args.rounds - 1}
        print(f"{name}: {over} of {args.rounds - 1} back-to-back runs had a case over 1%")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "agreement.json"
        path.write_text(json.dumps({"info": env.info(), "args": vars(args), "summary": summary,
                                    "rows": rows}, indent=1, default=str))  # fmt: skip
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
