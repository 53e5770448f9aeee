"""Tests for harness.measure.stats: known answers, seeded synthetic samples, a verdict table."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness.measure.stats import (
    RatioCI,
    Verdict,
    bootstrap_ratio_ci,
    classify,
    iqr,
    median,
    median_ratio_interval,
    min_units_for,
)


def lognormal_samples(median_s: float, sigma: float, n: int, seed: int) -> np.ndarray:
    """Seeded lognormal timing samples whose true median is `median_s`."""
    return median_s * np.random.default_rng(seed).lognormal(0.0, sigma, n)


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


# --- bootstrap_ratio_ci ------------------------------------------------------------------


def test_interval_contains_the_true_ratio_about_as_often_as_its_confidence():
    """Coverage over 200 seeded experiments with a known ratio of medians (1.5)."""
    true_ratio, trials, hits = 1.5, 200, 0
    for trial in range(trials):
        baseline = lognormal_samples(1e-3, 0.2, 40, seed=2 * trial)
        variant = lognormal_samples(1e-3 * true_ratio, 0.2, 40, seed=2 * trial + 1)
        ci = bootstrap_ratio_ci(variant, baseline, n_boot=1000, seed=trial)
        hits += ci.low < true_ratio < ci.high
    assert 0.90 <= hits / trials <= 0.99


def test_point_estimate_is_the_ratio_of_medians():
    baseline = lognormal_samples(1e-3, 0.2, 31, seed=1)
    variant = lognormal_samples(2e-3, 0.2, 17, seed=2)
    ci = bootstrap_ratio_ci(variant, baseline)
    assert ci.ratio == np.median(variant) / np.median(baseline)
    assert ci.low < ci.ratio < ci.high


def test_interval_excludes_one_for_a_twofold_difference():
    baseline = lognormal_samples(1e-3, 0.3, 30, seed=1)
    variant = lognormal_samples(2e-3, 0.3, 30, seed=2)
    ci = bootstrap_ratio_ci(variant, baseline)
    assert 1.0 < ci.low < 2.0 < ci.high


def test_interval_contains_one_for_identical_distributions():
    baseline = lognormal_samples(1e-3, 0.3, 50, seed=3)
    variant = lognormal_samples(1e-3, 0.3, 50, seed=4)
    ci = bootstrap_ratio_ci(variant, baseline)
    assert ci.low < 1.0 < ci.high


def test_interval_narrows_with_more_samples():
    def width(n: int) -> float:
        ci = bootstrap_ratio_ci(
            lognormal_samples(1e-3, 0.3, n, seed=5), lognormal_samples(1e-3, 0.3, n, seed=6)
        )
        return ci.high - ci.low

    assert width(400) < width(25) / 2


def test_higher_confidence_gives_a_wider_interval():
    baseline = lognormal_samples(1e-3, 0.3, 40, seed=7)
    variant = lognormal_samples(1.2e-3, 0.3, 40, seed=8)
    narrow = bootstrap_ratio_ci(variant, baseline, confidence=0.5)
    wide = bootstrap_ratio_ci(variant, baseline, confidence=0.99)
    assert wide.low < narrow.low and narrow.high < wide.high


def test_same_seed_same_interval_other_seed_other_interval():
    baseline = lognormal_samples(1e-3, 0.3, 40, seed=7)
    variant = lognormal_samples(1.2e-3, 0.3, 40, seed=8)
    first = bootstrap_ratio_ci(variant, baseline, seed=42)
    assert bootstrap_ratio_ci(variant, baseline, seed=42) == first
    assert bootstrap_ratio_ci(variant, baseline, seed=43) != first


def test_constant_samples_give_a_point_interval():
    ci = bootstrap_ratio_ci([2.0] * 5, [4.0] * 7)
    assert (ci.ratio, ci.low, ci.high) == (0.5, 0.5, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variant_samples": []}, r"variant_samples: expected a non-empty"),
        ({"baseline_samples": [1.0, 0.0]}, r"baseline_samples: expected finite positive seconds"),
        ({"n_boot": 0}, r"n_boot: expected an integer >= 1; got 0"),
        ({"confidence": 1.0}, r"confidence: expected a fraction in \(0, 1\); got 1.0"),
        ({"confidence": 0.0}, r"confidence: expected a fraction in \(0, 1\); got 0.0"),
    ],
)
def test_bootstrap_rejects_bad_arguments(kwargs, message):
    arguments = {"variant_samples": [1.0, 2.0], "baseline_samples": [1.0, 2.0]} | kwargs
    with pytest.raises(ValueError, match=message):
        bootstrap_ratio_ci(**arguments)


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


# --- classify ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "low", "high", "min_factor", "expected"),
    [
        (0.5, 0.4, 0.6, 1.0, Verdict.FASTER),
        (2.0, 1.8, 2.2, 1.0, Verdict.SLOWER),
        (1.0, 0.9, 1.1, 1.0, Verdict.NO_DIFFERENCE),
        (0.7, 0.4, 1.0, 1.0, Verdict.NO_DIFFERENCE),  # touching 1.0 is not excluding it
        (1.3, 1.0, 1.6, 1.0, Verdict.NO_DIFFERENCE),
        (0.5, 0.05, 2.0, 1.0, Verdict.NO_DIFFERENCE),  # big point change, wide interval
        (0.97, 0.96, 0.98, 1.0, Verdict.FASTER),  # small but significant counts without a factor
        (0.97, 0.96, 0.98, 1.05, Verdict.WITHIN_FACTOR),
        (1.03, 1.02, 1.04, 1.05, Verdict.WITHIN_FACTOR),
        (0.9, 0.85, 0.95, 1.1, Verdict.FASTER),  # 0.9 * 1.1 = 0.99 < 1
        (0.95, 0.85, 0.99, 1.1, Verdict.WITHIN_FACTOR),
        (1.2, 1.15, 1.25, 1.1, Verdict.SLOWER),
        (1.1, 1.05, 1.15, 1.1, Verdict.WITHIN_FACTOR),  # exactly the factor is not beyond it
        (1.5, 1.0, 2.0, 1.1, Verdict.NO_DIFFERENCE),
    ],
)
def test_classify(ratio, low, high, min_factor, expected):
    assert classify(RatioCI(ratio, low, high), min_factor=min_factor) is expected


@pytest.mark.parametrize("min_factor", [0.9, 0.0, float("nan"), float("inf")])
def test_classify_rejects_a_factor_below_one(min_factor):
    with pytest.raises(ValueError, match=r"min_factor: expected a finite factor >= 1.0; got"):
        classify(RatioCI(1.0, 0.9, 1.1), min_factor=min_factor)


def test_verdicts_serialize_as_their_values():
    assert Verdict("faster") is Verdict.FASTER
    assert Verdict.NEEDS_CUDA.value == "needs_cuda"
    assert {v.value for v in Verdict} >= {"failed", "not_timed", "no_difference", "slower"}


# --- median_ratio_interval ------------------------------------------------------------------


@pytest.mark.parametrize("n, low, high", [(6, 1, 6), (8, 1, 8), (9, 2, 8), (10, 2, 9), (20, 6, 15)])
def test_median_ratio_interval_takes_the_widest_order_statistics_that_cover_95(n, low, high):
    ci = median_ratio_interval([float(v) for v in range(n, 0, -1)])  # unsorted on purpose
    assert (ci.low, ci.high) == (low, high) and ci.ratio == pytest.approx((n + 1) / 2)


def test_median_ratio_interval_covers_the_median_of_a_skewed_distribution():
    rng = np.random.default_rng(0)
    true_median = 1.25  # lognormal: median exp(mu)
    trials = rng.lognormal(np.log(true_median), 0.3, size=(4000, 6))
    covered = [median_ratio_interval(row).low <= true_median <= median_ratio_interval(row).high
               for row in trials]
    assert np.mean(covered) >= 0.95  # 1 - 2 / 2**6 = 0.969 in theory


def test_median_ratio_interval_names_how_many_values_it_needs():
    assert min_units_for(0.95) == 6 and min_units_for(0.99) == 8
    with pytest.raises(ValueError, match="ratios: expected at least 6 values for a 95% interval; got 5"):
        median_ratio_interval([1.0] * 5)
    with pytest.raises(ValueError, match="ratios: expected finite positive seconds"):
        median_ratio_interval([1.0] * 5 + [0.0])


# --- paired intervals, medians, rates, means ----------------------------------------------


def test_paired_ratio_ci_cancels_work_that_varies_round_to_round():
    """Round k costs k ms in the baseline and 2k ms in the variant: every per-round ratio
    is 2, so the paired interval is exactly 2; the unpaired one is wide."""
    from harness.measure.stats import paired_ratio_ci

    baseline = [k * 1e-3 for k in range(1, 21)]
    variant = [2 * b for b in baseline]
    ci = paired_ratio_ci(variant, baseline)
    assert (ci.ratio, ci.low, ci.high) == pytest.approx((2.0, 2.0, 2.0))
    unpaired = bootstrap_ratio_ci(variant, baseline)
    assert unpaired.high - unpaired.low > 0.5
    with pytest.raises(ValueError, match="variant_samples: expected 20 paired samples"):
        paired_ratio_ci(variant[:-1], baseline)


def test_paired_difference_and_median_intervals_hold_their_estimate():
    from harness.measure.stats import bootstrap_median_ci, paired_difference_ci, relative_halfwidth

    rng = np.random.default_rng(0)
    base = rng.normal(10.0, 1.0, 200)
    diff, low, high = paired_difference_ci(base - 0.5 + rng.normal(0, 0.05, 200), base)
    assert low <= diff <= high and diff == pytest.approx(-0.5, abs=0.02) and high < 0
    with pytest.raises(ValueError, match="variant_values: expected"):
        paired_difference_ci([1.0], [1.0, 2.0])
    ci = bootstrap_median_ci(np.full(50, 3e-3))
    assert (ci.ratio, relative_halfwidth(ci)) == pytest.approx((3e-3, 0.0))


def test_wilson_and_bootstrap_mean_intervals():
    from harness.measure.stats import bootstrap_mean_ci, wilson_interval

    assert wilson_interval(0, 4) == pytest.approx((0.0, 0.4899), abs=1e-3)
    low, high = wilson_interval(4, 4)
    assert high == 1.0 and low == pytest.approx(0.5101, abs=1e-3)
    with pytest.raises(ValueError, match="expected 0 <= successes <= trials"):
        wilson_interval(5, 4)
    mean, low, high = bootstrap_mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and 1.0 <= low < 2.5 < high <= 4.0
