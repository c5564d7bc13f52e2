"""Adaptive sampling of the runner's timing (scores.sample_until_stable): pure Python."""

from __future__ import annotations

import itertools
import random

from harnesslab.tools.gpu.scores import median_ci_halfwidth, sample_until_stable


def counting(values):
    it = iter(values)
    drawn = []

    def draw() -> float:
        drawn.append(next(it))
        return drawn[-1]

    return draw, drawn


def test_a_stable_series_stops_at_the_floor():
    rng = random.Random(1)
    draw, drawn = counting(100.0 + rng.uniform(-0.05, 0.05) for _ in itertools.count())
    xs, met = sample_until_stable(draw, floor=10, cap=200)
    assert met is True
    assert len(xs) == len(drawn) == 10


def test_a_noisy_series_runs_to_the_cap_and_says_it_did_not_converge():
    rng = random.Random(2)
    draw, drawn = counting(rng.uniform(50.0, 150.0) for _ in itertools.count())
    xs, met = sample_until_stable(draw, floor=10, cap=40)
    assert met is False
    assert len(xs) == len(drawn) == 40


def test_the_floor_holds_even_when_the_first_samples_agree_exactly():
    draw, drawn = counting(itertools.repeat(5.0))
    xs, met = sample_until_stable(draw, floor=25, cap=100)
    assert met and len(xs) == len(drawn) == 25


def test_a_series_that_settles_stops_between_floor_and_cap():
    rng = random.Random(3)
    noisy = (rng.uniform(50.0, 150.0) for _ in range(6))
    calm = (100.0 + rng.uniform(-0.1, 0.1) for _ in itertools.count())
    draw, _ = counting(itertools.chain(noisy, calm))
    xs, met = sample_until_stable(draw, floor=5, cap=500)
    assert met and 5 < len(xs) < 500


def test_the_median_interval_is_unknown_below_five_samples_and_shrinks_with_more():
    assert median_ci_halfwidth([1.0, 2.0, 3.0, 4.0]) is None
    rng = random.Random(4)
    few = [rng.gauss(100, 1) for _ in range(10)]
    many = few + [rng.gauss(100, 1) for _ in range(990)]
    assert median_ci_halfwidth(many) < median_ci_halfwidth(few)
