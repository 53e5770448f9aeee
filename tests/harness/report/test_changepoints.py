"""Change points of a series of runs (`harness.report.changepoints`), on synthetic series.

Series of 30 runs with log-normal noise of 2% (sigma), as a headline ratio or a median time
varies between runs of one commit: a planted 10% step must be found at the right run in
at least 95 of 100 seeds, and a flat series must give a change point in at most 5 of 100.
The seeds (0-99) are not those the penalty was calibrated on (1000-1999).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.report.changepoints import ChangePoint, change_points, noise

RUNS, STEP_AT, NOISE, SEEDS = 30, 15, 0.02, range(100)


def _series(seed: int, step: float = 1.0, at: int = STEP_AT, runs: int = RUNS) -> np.ndarray:
    values = np.random.default_rng(seed).lognormal(0.0, NOISE, runs)
    values[at:] *= step
    return values


def test_a_10_percent_step_is_found_at_the_right_run_in_95_of_100_seeds():
    found = [change_points(_series(seed, 1.10)) for seed in SEEDS]
    right = sum([c.index for c in points] == [STEP_AT] for points in found)
    sizes = [points[0] for points in found if [c.index for c in points] == [STEP_AT]]
    covered = sum(c.low <= 1.10 <= c.high for c in sizes)
    print(f"10% step at run {STEP_AT} of {RUNS}: found there in {right} of 100 seeds; "
          f"its interval holds 1.10 in {covered} of {len(sizes)}")
    assert right >= 95
    assert covered >= 0.9 * len(sizes)


def test_a_flat_series_gives_a_change_point_in_at_most_5_of_100_seeds():
    alarms = sum(bool(change_points(_series(seed))) for seed in SEEDS)
    print(f"flat series of {RUNS} runs: a change point in {alarms} of 100 seeds")
    assert alarms <= 5


def test_a_change_point_has_a_size_with_an_interval_and_words():
    points = change_points(_series(0, 0.8))
    assert [c.index for c in points] == [STEP_AT]
    point = points[0]
    assert point.low < point.size < point.high and 0.76 < point.size < 0.84
    assert point.text().startswith("-1") and point.text().count("%") == 3


def test_two_steps_and_exact_values_are_each_one_change_point():
    values = [1.0] * 6 + [2.0] * 6 + [1.5] * 6  # no noise at all: sigma is floored
    assert [(c.index, round(c.size, 3)) for c in change_points(values)] == [(6, 2.0), (12, 0.75)]


def test_too_short_or_bad_series():
    assert change_points([1.0, 2.0, 2.0]) == []  # needs two runs on each side
    for bad in ([1.0, -1.0, 1.0, 1.0], [1.0, float("nan"), 1.0, 1.0]):
        with pytest.raises(ValueError, match="expected a 1-D series of finite numbers > 0"):
            change_points(bad)


def test_noise_ignores_a_step():
    logs = np.log(_series(3, 1.5))
    assert math.isclose(noise(logs), NOISE, rel_tol=0.5)
    assert isinstance(change_points(_series(3, 1.5))[0], ChangePoint)
