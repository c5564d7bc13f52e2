"""The one definition of the numbers every tool reports: order statistics of timing samples, a
candidate's score, the median's confidence interval, the adaptive sampler's stopping rule and
the geomean. The host imports these (harnesslab.tools.gpu.scores: objective, verify and the lab
use nothing else); the runner's timing (timing.py) samples with them.

Staged to the GPU host beside runner.py (standard library only, never harnesslab). Trusted side
of the boundary: every verdict and ranking compares numbers made here. Pure functions; imported
by the one sibling import rule (runner.py's docstring).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence


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


def stable(samples: Sequence[float], rel_ci: float) -> bool:
    """Whether the median's confidence half-width is within `rel_ci` of a positive median."""
    half = median_ci_halfwidth(samples)
    med = statistics.median(samples) if samples else 0.0
    return half is not None and med > 0 and half <= rel_ci * med


def sample_until_stable(
    draw: Callable[[], float], *, floor: int, cap: int, rel_ci: float = 0.005
) -> tuple[list[float], bool]:
    """Call `draw()` (one timing sample) at least `floor` and at most `cap` times, stopping once
    the median's confidence interval half-width is within `rel_ci` of the median. Returns the
    samples and whether they met the bound. A stable series stops at the floor; a noisy one
    runs to the cap, and says so."""
    return sample_batches_until_stable(
        lambda n: [draw() for _ in range(n)], floor=floor, cap=cap, rel_ci=rel_ci, step=1
    )


def sample_batches_until_stable(
    draw: Callable[[int], Sequence[float]], *, floor: int, cap: int, rel_ci: float, step: int
) -> tuple[list[float], bool]:
    """sample_until_stable for samples taken in batches: `draw(n)` returns n samples (one
    device round trip for all of them). The first batch is the floor, each later one `step`
    samples (never past the cap); the bound is checked after each batch."""
    floor, cap = max(1, floor), max(1, floor, cap)
    xs: list[float] = []
    while len(xs) < cap:
        want = floor - len(xs) if len(xs) < floor else max(1, step)
        got = [float(x) for x in draw(min(want, cap - len(xs)))]
        if not got:
            raise ValueError("a timing draw returned no samples")
        xs.extend(got)
        if len(xs) >= floor and stable(xs, rel_ci):
            return xs, True
    return xs, False


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the positive values (None when there are none)."""
    xs = [float(v) for v in values if isinstance(v, int | float) and v > 0]
    return math.exp(math.fsum(map(math.log, xs)) / len(xs)) if xs else None
