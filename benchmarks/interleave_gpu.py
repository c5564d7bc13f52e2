"""Does taking the isolated cases' samples in turn, one sample of each case after another,
narrow how far two back-to-back runs disagree (issue 30: <= 1% on every bandwidth-bound case,
every run)? On an H100 some shapes' samples come in runs of consecutive samples at two levels ~3%
apart (BENCHMARKS.md, thirteenth session), so a case timed in one stretch of ~3 ms sees few
changes of level; in turn, each case's samples spread over the whole run's time.

    python benchmarks/interleave_gpu.py [--task rmsnorm_gate] [--dir tasks/rmsnorm_gate/workspace]
                                        [--entry kernel.py:rmsnorm_gate] [--rounds 60] [--samples 30]

Both orders use one sample primitive, the same fixed count (no adaptive stop) and the same input
sets: a sample is [sleep 100 us, flush L2, start, call, end], the host waiting for its end before
the next (timing.py's isolated sample taken alone). "sequential": every sample of a case, then
the next case; "in turn": sample k of every case, then sample k+1. Rounds of the two orders
alternate. Per case: the rounds' medians, how many of the consecutive pairs differ by more than
1%, and the rounds' spread; then how many rounds had a case over 1%. Writes $OUT/interleave.json
when OUT is set. No harnesslab install: the staged files are imported from tools/gpu/ by name.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))  # the staged layout: siblings import by name

import dev_task  # noqa: E402  (beside this script)
import runner  # noqa: E402
import timing  # noqa: E402

HOLD_CYCLES = 100 * 2000  # 100 us at ~2 GHz


def case_calls(ev: Any, env: Any, fn: Any, case: dict[str, Any], idx: int) -> tuple[Any, int]:
    """A call over the case's input sets (as timing.time_case makes them) and how many sets."""
    shape = ev.case_shape(case)
    dtype = runner.dtype_of(env.torch, case["dtype"])
    nbytes = int(ev.ref.bytes_moved(shape, env.torch.finfo(dtype).bits // 8))
    n_sets = env.sets_needed(nbytes)
    first = ev.make(shape, dtype, salt=idx * 101 + 11)
    sets = [first, *(timing._copy_set(first) for _ in range(n_sets - 1))]

    def call(i: int) -> Any:
        a, k = sets[i % n_sets]
        return fn(*a, **k)

    return call, n_sets


def sample(env: Any, call: Any, i: int) -> float:
    torch = env.torch
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    torch.cuda._sleep(HOLD_CYCLES)
    env.flush_l2()
    start.record()
    call(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="rmsnorm_gate")
    ap.add_argument("--dir", default="tasks/rmsnorm_gate/workspace")
    ap.add_argument("--entry", default="kernel.py:rmsnorm_gate")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--samples", type=int, default=30)
    args = ap.parse_args(argv)
    env = dev_task.cuda_env(runner)
    if env is None:
        return 2
    toml, req = dev_task.dev_request(args.task, args.entry, 30)
    ev = runner.Evaluator(env, req)
    fn, cand_dir = ev.load_candidate(str(ROOT / args.dir))
    env.copy_gbps()
    cases = dev_task.dev_cases(toml)
    iso = []  # the isolated cases, found as the runner finds them (and warmed up there)
    for i, case in enumerate(cases):
        if ev.run_case(fn, case, i, cand_dir, timing=True).get("timing_method") == "isolated":
            iso.append((i, case))
    medians: dict[str, dict[str, list[float]]] = {"sequential": {}, "in turn": {}}
    for rnd in range(2 * args.rounds):
        order = "sequential" if rnd % 2 == 0 else "in turn"
        calls = [case_calls(ev, env, fn, case, i) for i, case in iso]
        for call, _ in calls:
            call(0)
        env.sync()
        times: list[list[float]] = [[] for _ in iso]
        if order == "sequential":
            for c, (call, _) in enumerate(calls):
                times[c] = [sample(env, call, k) for k in range(args.samples)]
        else:
            for k in range(args.samples):
                for c, (call, _) in enumerate(calls):
                    times[c].append(sample(env, call, k))
        for (_, case), ts in zip(iso, times, strict=True):
            medians[order].setdefault(case["name"], []).append(statistics.median(ts))
        del calls
        env.torch.cuda.empty_cache()
    print(f"{env.info()['device']}, torch {env.torch.__version__}; {args.dir}/{args.entry}, "
          f"{args.rounds} rounds per order, {args.samples} samples a case")  # fmt: skip
    print(f"{'case':18} {'order':>10} {'median us':>9} {'pairs>1%':>9} {'worst':>7} {'between':>8}")
    summary = {}
    for order, by_case in medians.items():
        over = [False] * args.rounds
        for name, meds in by_case.items():
            gaps = [abs(a - b) / ((a + b) / 2) for a, b in itertools.pairwise(meds)]
            for j, g in enumerate(gaps):
                over[j + 1] |= g > 0.01
            print(f"{name:18} {order:>10} {statistics.median(meds):9.2f} "
                  f"{sum(g > 0.01 for g in gaps):4d}/{len(gaps):<4d} {100 * max(gaps):6.2f}% "
                  f"{100 * statistics.stdev(meds) / statistics.mean(meds):7.2f}%")  # fmt: skip
        summary[order] = {"runs_with_a_case_over_1pct": sum(over[1:]), "runs": args.rounds - 1}
        print(f"{order}: {sum(over[1:])} of {args.rounds - 1} back-to-back runs had a case over 1%")
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "interleave.json"
        path.write_text(json.dumps({"info": env.info(), "args": vars(args), "summary": summary,
                                    "medians": medians}, indent=1))  # fmt: skip
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
