"""How often two runs of the runner's adaptive sampler disagree by more than 1% on one isolated
(bandwidth-bound) case, by simulation (issue 30: back-to-back agreement <= 1% on every
bandwidth-bound case, every run). CPU only: samples are a 64 us median times (1 + noise), noise
Gaussian with relative SD sigma, optionally with 10% outliers 10% slower, drawn through the
sampler itself (tools/gpu/scores.sample_batches_until_stable: the floor first, then 4 at a time,
stopping once the median's ~95% interval is within 0.5%, at most `cap`). A run has six isolated
cases: P(some of 6) = 1 - (1 - P(case))^6. Deterministic (seeded).

    python benchmarks/agreement_sim.py [--trials 3000]

What it printed (3000 trials; the Monte Carlo error is about +-1 point): a run misses 1% on
some case, at sigma 1%, 3.5% of the time with floor 10 / cap 30 (today's), 2.8% with floor 20,
0.6% with floor 20 / cap 60; at sigma 1.5%, 18% with cap 30, 9-11% with cap 60; at 2%, 51-53%
and 18-20%. A sample's sigma is about its case's spread ((p90 - p10) / median, reported per
case) / 2.56.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

from harnesslab.tools.gpu import scores


def median_of_a_run(
    sigma: float, floor: int, cap: int, rng: random.Random, outliers: float
) -> tuple[float, int]:
    def draw(n: int) -> list[float]:
        slow = [1.1 if rng.random() < outliers else 1.0 for _ in range(n)]
        return [64.0 * (1 + rng.gauss(0, sigma)) * s for s in slow]

    xs, _ = scores.sample_batches_until_stable(draw, floor=floor, cap=cap, rel_ci=0.005, step=4)
    return statistics.median(xs), len(xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3000)
    args = ap.parse_args()
    rng = random.Random(2)
    print("sigma | outliers | floor | cap | P(case > 1%) | P(some of 6 > 1%) | mean samples")
    for sigma, outliers in ((0.01, 0.0), (0.015, 0.0), (0.02, 0.0), (0.01, 0.1)):
        for floor, cap in ((10, 30), (20, 30), (10, 60), (20, 60)):
            over, counts = 0, []
            for _ in range(args.trials):
                a, na = median_of_a_run(sigma, floor, cap, rng, outliers)
                b, nb = median_of_a_run(sigma, floor, cap, rng, outliers)
                over += abs(a - b) / ((a + b) / 2) > 0.01
                counts += [na, nb]
            p = over / args.trials
            print(f"{sigma:.3f} | {outliers:.2f} | {floor} | {cap} | {p:.3f} | "
                  f"{1 - (1 - p) ** 6:.3f} | {statistics.mean(counts):.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
