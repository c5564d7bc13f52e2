"""The one score definition (scores.order_stats, score_of, median_ci_halfwidth, geomean and the
adaptive sampler's stopping rule): every number a verdict or a ranking compares comes from
here, so each rule is pinned at its boundary. Pure Python, no torch."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from harnesslab.tools.gpu.scores import (
    geomean,
    median_ci_halfwidth,
    order_stats,
    sample_batches_until_stable,
    sample_until_stable,
    score_of,
    stable,
)

NONE = {"median_us": None, "p10_us": None, "p90_us": None, "spread": None}


# -- order statistics --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "p10", "p90"),
    [(10, 1, 10), (11, 2, 10), (12, 2, 11), (21, 3, 19), (2, 1, 2)],
)
def test_p10_rounds_down_and_p90_up_so_the_spread_is_never_narrower_than_the_samples(
    n: int, p10: int, p90: int
) -> None:
    xs = list(range(1, n + 1))
    random.Random(n).shuffle(xs)  # the samples arrive unsorted
    stats = order_stats(xs)
    assert (stats["p10_us"], stats["p90_us"]) == (p10, p90)
    assert stats["median_us"] == (n + 1) / 2
    assert stats["spread"] == pytest.approx((p90 - p10) / ((n + 1) / 2))


def test_the_median_of_an_odd_and_an_even_count() -> None:
    assert order_stats([3.0, 1.0, 2.0])["median_us"] == 2.0
    assert order_stats([4, 1, 3, 2])["median_us"] == 2.5


def test_non_finite_and_non_numbers_are_dropped_before_any_statistic() -> None:
    stats = order_stats([1.0, math.nan, 3, math.inf, -math.inf, None, "2"])  # type: ignore[list-item]
    assert stats["median_us"] == 2.0
    assert (stats["p10_us"], stats["p90_us"]) == (1.0, 3.0)
    assert order_stats([4.0, 6.0])["median_us"] == 5.0  # floats alone
    assert order_stats([4, 6])["median_us"] == 5.0  # ints alone


def test_no_usable_sample_gives_no_statistic() -> None:
    assert order_stats([]) == NONE
    assert order_stats([math.nan, None]) == NONE  # type: ignore[list-item]


def test_the_spread_is_relative_to_the_median_and_unknown_for_a_zero_median() -> None:
    assert order_stats([0.0, 0.0, 0.0])["spread"] is None
    assert order_stats([0.0, 0.0, 0.0])["median_us"] == 0.0
    assert order_stats([0.25, 0.5, 0.75])["spread"] == pytest.approx(1.0)  # a median below 1
    assert order_stats([10.0, 20.0, 30.0])["spread"] == pytest.approx(1.0)


# -- the score ---------------------------------------------------------------------------------
def test_a_score_is_the_exact_sum_of_the_case_medians() -> None:
    assert score_of([10.0, 20.0, 5.5], passed=True) == 35.5
    assert score_of([0.1] * 10, passed=True) == 1.0  # fsum: no rounding drift


def test_a_failed_candidate_has_no_score() -> None:
    assert score_of([10.0, 20.0], passed=False) is None


def test_zero_cases_are_no_score_not_zero() -> None:
    assert score_of([], passed=True) is None


@pytest.mark.parametrize("medians", [[None], [10.0, None], [None, 10.0, 20.0]])
def test_a_case_without_a_time_means_no_score_not_a_partial_sum(medians) -> None:
    assert score_of(medians, passed=True) is None


# -- the median's confidence interval ----------------------------------------------------------
def test_the_median_interval_needs_five_samples() -> None:
    assert median_ci_halfwidth([1.0, 2.0, 3.0, 4.0]) is None
    assert median_ci_halfwidth([1.0, 2.0, 3.0, 4.0, 100.0]) == 49.5  # the extremes at n=5


def test_the_median_interval_is_half_the_distance_of_the_binomial_order_statistics() -> None:
    # n=100, z=1.96: k = 9.8, order statistics floor(40.2)=40 and ceil(59.8)-1=59.
    xs = [float(i) for i in range(100)]
    random.Random(0).shuffle(xs)
    assert median_ci_halfwidth(xs) == 9.5
    # n=30: k = 5.37, order statistics floor(9.63)=9 and ceil(20.37)-1=20.
    assert median_ci_halfwidth([float(i * i) for i in range(30)]) == (400 - 81) / 2


def test_a_wider_z_widens_the_interval_but_never_past_the_extreme_samples() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]
    # z=3 at n=5: k = 3.35, the bounds would be index -1 and 5: clamped to the extremes.
    assert median_ci_halfwidth(xs, z=3.0) == 49.5
    xs30 = [float(i) for i in range(30)]
    assert median_ci_halfwidth(xs30, z=3.0) > median_ci_halfwidth(xs30)
    assert median_ci_halfwidth(xs30, z=10.0) == 14.5  # (29 - 0) / 2


# -- adaptive sampling -------------------------------------------------------------------------
def draws(values):
    it = iter(values)
    drawn: list[float] = []

    def draw() -> float:
        drawn.append(next(it))
        return drawn[-1]

    return draw, drawn


def test_a_spread_just_above_half_a_percent_is_not_stable_by_default() -> None:
    # Alternating 99.25 / 100.75: the median's interval is +-0.75%, above the default 0.5%.
    draw, drawn = draws(itertools.cycle([99.25, 100.75]))
    xs, met = sample_until_stable(draw, floor=10, cap=40)
    assert (met, len(xs), len(drawn)) == (False, 40, 40)
    draw, _ = draws(itertools.cycle([99.25, 100.75]))
    assert sample_until_stable(draw, floor=10, cap=40, rel_ci=0.01)[1] is True


def test_an_interval_exactly_at_the_bound_is_stable() -> None:
    # Alternating 3 / 5 over an even count: median 4, half-width exactly 1 = 0.25 x 4.
    draw, _ = draws(itertools.cycle([3.0, 5.0]))
    xs, met = sample_until_stable(draw, floor=10, cap=100, rel_ci=0.25)
    assert met is True and len(xs) == 10


def test_below_five_samples_there_is_no_interval_so_a_low_floor_stops_at_five() -> None:
    draw, drawn = draws(itertools.repeat(7.0))
    xs, met = sample_until_stable(draw, floor=1, cap=100)
    assert met is True and len(xs) == len(drawn) == 5


def test_a_zero_median_is_never_stable() -> None:
    draw, drawn = draws(itertools.repeat(0.0))
    xs, met = sample_until_stable(draw, floor=5, cap=30)
    assert met is False and len(xs) == len(drawn) == 30


def test_a_median_below_one_can_be_stable() -> None:
    draw, _ = draws(itertools.repeat(0.5))
    xs, met = sample_until_stable(draw, floor=5, cap=30)
    assert met is True and len(xs) == 5


def test_a_cap_below_the_floor_is_raised_to_the_floor_and_a_zero_cap_still_draws_once() -> None:
    draw, drawn = draws(itertools.repeat(7.0))
    xs, met = sample_until_stable(draw, floor=8, cap=3)
    assert met is True and len(xs) == len(drawn) == 8
    draw, _ = draws(itertools.repeat(7.0))
    xs, met = sample_until_stable(draw, floor=0, cap=0)
    assert (xs, met) == ([7.0], False)
    draw, _ = draws(itertools.repeat(7.0))
    assert sample_until_stable(draw, floor=1, cap=1) == ([7.0], False)


def test_batches_start_at_the_floor_then_come_in_steps_never_past_the_cap() -> None:
    asked: list[int] = []

    def draw(n: int) -> list[float]:
        asked.append(n)
        return [99.25, 100.75] * (n // 2) + [99.25] * (n % 2)

    xs, met = sample_batches_until_stable(draw, floor=10, cap=21, rel_ci=0.005, step=4)
    assert (met, len(xs), asked) == (False, 21, [10, 4, 4, 3])
    asked.clear()
    xs, met = sample_batches_until_stable(draw, floor=10, cap=40, rel_ci=0.01, step=4)
    assert (met, asked) == (True, [10])


def test_a_batch_sampler_stops_after_the_first_stable_batch() -> None:
    batches = iter([[50.0, 150.0, 100.0, 60.0, 140.0], [100.0] * 3, [100.0] * 3, [1.0] * 3])
    xs, met = sample_batches_until_stable(lambda n: next(batches), floor=5, cap=50,
                                          rel_ci=0.005, step=3)  # fmt: skip
    assert met is True and len(xs) == 11  # the 1.0 batch is never drawn


def test_one_at_a_time_sampling_stops_at_the_first_stable_count() -> None:
    """Rule: past the floor, one sample at a time: the run stops at the first count whose
    samples are stable, odd or even."""
    values = [50.0, 150.0, 100.0, 60.0, 140.0] + [100.0] * 60  # first stable at 11
    first = next(n for n in range(6, len(values)) if stable(values[:n], 0.005))
    assert (first - 6) % 2 == 1  # a step of 2 from the floor of 6 could not stop here
    draw, drawn = draws(iter(values))
    xs, met = sample_until_stable(draw, floor=6, cap=60)
    assert met is True and len(xs) == len(drawn) == first


def test_a_floor_below_one_is_one_and_a_step_below_one_is_one() -> None:
    asked: list[int] = []

    def draw(n: int) -> list[float]:
        asked.append(n)
        return [7.0] * n

    # Floor 0 counts as 1: one sample, then steps of 4 (at 5 the interval exists: stable).
    assert sample_batches_until_stable(draw, floor=0, cap=10, rel_ci=0.005, step=4) == (
        [7.0] * 5, True
    )  # fmt: skip
    assert asked == [1, 4]
    asked.clear()
    xs, met = sample_batches_until_stable(draw, floor=3, cap=10, rel_ci=0.005, step=0)
    assert (met, len(xs), asked) == (True, 5, [3, 1, 1])


def test_the_floor_holds_when_a_draw_returns_fewer_samples_than_asked() -> None:
    """Rule: a batch that comes back short is made up before the floor counts as reached (a
    constant series is stable from 5 samples; the floor of 10 still holds)."""
    asked: list[int] = []

    def draw(n: int) -> list[float]:
        asked.append(n)
        return [7.0] * min(n, 3)

    xs, met = sample_batches_until_stable(draw, floor=10, cap=40, rel_ci=0.005, step=4)
    assert (met, len(xs), asked) == (True, 10, [10, 7, 4, 1])


def test_a_draw_that_returns_nothing_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match="no samples"):
        sample_batches_until_stable(lambda n: [], floor=5, cap=50, rel_ci=0.005, step=1)


# -- geomean -----------------------------------------------------------------------------------
def test_the_geomean_is_the_nth_root_of_the_product() -> None:
    assert geomean([2, 8]) == pytest.approx(4.0)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([1.0, 10.0, 100.0]) == pytest.approx(10.0)


def test_the_geomean_keeps_only_positive_numbers() -> None:
    assert geomean([2, 8.0, 0, 0.0, -4.0, None]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)  # a value below 1 counts


def test_the_geomean_of_nothing_positive_is_none() -> None:
    assert geomean([]) is None
    assert geomean([0.0, -1.0, None]) is None
