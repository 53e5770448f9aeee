"""Tests for harness.measure.stats: known answers and seeded synthetic samples."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.measure.stats import RatioCI, Verdict, iqr, median


# --- median and iqr ----------------------------------------------------------------------


def test_median_and_iqr_of_known_samples():
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert median(samples) == 3.0
    assert iqr(samples) == 2.0  # percentiles 25/75 at 2.0 and 4.0


def test_iqr_interpolates_linearly_between_samples():
    assert iqr([1.0, 2.0, 3.0, 4.0]) == pytest.approx(3.25 - 1.75)


def test_iqr_of_a_single_sample_is_zero():
    assert (median([0.5]), iqr([0.5])) == (0.5, 0.0)


@pytest.mark.parametrize("fn", [median, iqr])
@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([], r"samples: expected a non-empty 1-D sequence of seconds; got shape \(0,\)"),
        ([[1.0, 2.0]], r"samples: expected a non-empty 1-D sequence .*; got shape \(1, 2\)"),
        ([1.0, -2.0], r"samples: expected finite positive seconds; got -2.0 at index 1"),
        ([0.0], r"samples: expected finite positive seconds; got 0.0 at index 0"),
        ([1.0, float("nan")], r"samples: expected finite positive seconds; got nan at index 1"),
        ([float("inf")], r"samples: expected finite positive seconds; got inf at index 0"),
    ],
)
def test_bad_samples_raise_value_error_naming_the_problem(fn, samples, message):
    with pytest.raises(ValueError, match=message):
        fn(samples)


# --- RatioCI -----------------------------------------------------------------------------


def test_speedup_is_the_inverse_ratio_with_bounds_swapped():
    ci = RatioCI(ratio=0.5, low=0.25, high=0.8)
    assert ci.speedup == 2.0
    assert ci.speedup_interval == (1.25, 4.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ratio": 0.0, "low": 0.5, "high": 1.0}, r"RatioCI.ratio: expected a finite positive"),
        ({"ratio": 1.0, "low": -1.0, "high": 1.0}, r"RatioCI.low: expected a finite positive"),
        ({"ratio": 1.0, "low": 0.5, "high": np.inf}, r"RatioCI.high: expected a finite positive"),
        (
            {"ratio": 1.0, "low": 2.0, "high": 1.5},
            r"RatioCI.low: expected low <= high \(1.5\); got 2.0",
        ),
    ],
)
def test_ratio_ci_rejects_bad_fields(fields, message):
    with pytest.raises(ValueError, match=message):
        RatioCI(**fields)


def test_ratio_ci_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RatioCI(1.0, 0.9, 1.1).ratio = 2.0


# --- Verdict -----------------------------------------------------------------------------


def test_verdicts_serialize_as_their_values():
    assert Verdict("faster") is Verdict.FASTER
    assert Verdict.NEEDS_CUDA.value == "needs_cuda"
    assert {v.value for v in Verdict} >= {"failed", "not_timed", "same", "inconclusive", "slower",
                                          "no_difference"}  # older runs' words still read


# --- paired intervals, medians, rates, means ----------------------------------------------


def test_paired_ratio_ci_cancels_work_that_varies_round_to_round():
    """Round k costs k ms in the baseline and 2k ms in the variant: every per-round ratio
    is 2, so the paired interval is exactly 2."""
    from harness.measure.stats import paired_ratio_ci

    baseline = [k * 1e-3 for k in range(1, 21)]
    variant = [2 * b for b in baseline]
    ci = paired_ratio_ci(variant, baseline)
    assert (ci.ratio, ci.low, ci.high) == pytest.approx((2.0, 2.0, 2.0))
    with pytest.raises(ValueError, match="variant_samples: expected 20 paired samples"):
        paired_ratio_ci(variant[:-1], baseline)


def test_paired_difference_interval_holds_its_estimate():
    from harness.measure.stats import paired_difference_ci

    rng = np.random.default_rng(0)
    base = rng.normal(10.0, 1.0, 200)
    diff, low, high = paired_difference_ci(base - 0.5 + rng.normal(0, 0.05, 200), base)
    assert low <= diff <= high and diff == pytest.approx(-0.5, abs=0.02) and high < 0
    with pytest.raises(ValueError, match="variant_values: expected"):
        paired_difference_ci([1.0], [1.0, 2.0])


def test_wilson_intervals():
    from harness.measure.stats import wilson_interval

    assert wilson_interval(0, 4) == pytest.approx((0.0, 0.4899), abs=1e-3)
    low, high = wilson_interval(4, 4)
    assert high == 1.0 and low == pytest.approx(0.5101, abs=1e-3)
    with pytest.raises(ValueError, match="expected 0 <= successes <= trials"):
        wilson_interval(5, 4)
