"""harness.measure.estimate: one process's paired ratio estimate, proven on synthetic rounds
(the process level, measured in every run, is proven in test_process_spread.py).

The synthetic clock draws rounds with a drift shared by every variant of a round (raw
times of neighbouring rounds correlate strongly), noise of each sample with a little
correlation left, rare pauses, and an offset of the ratio per process.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.measure.estimate import PairedEstimate, log_estimate, log_ratios, rounds_estimate


def ar1(rng: np.random.Generator, phi: float, sd: float, shape: tuple[int, ...]) -> np.ndarray:
    """Stationary AR(1) series along the last axis, with standard deviation `sd`."""
    shocks = rng.normal(0.0, sd * math.sqrt(1 - phi * phi), shape)
    out = np.empty(shape)
    out[..., 0] = rng.normal(0.0, sd, shape[:-1])
    for k in range(1, shape[-1]):
        out[..., k] = phi * out[..., k - 1] + shocks[..., k]
    return out


def synthetic_process(rng, ratio: float, rounds: int, process_sd: float, phi: float = 0.2,
                      noise: float = 0.08, pauses: float = 0.03):
    """(variant, baseline) seconds per call of one process's rounds."""
    offset = rng.normal(0.0, process_sd)
    drift = ar1(rng, 0.8, 0.1, (rounds,))  # shared by both samples of a round
    own = ar1(rng, phi, noise, (2, rounds))
    paused = (rng.random((2, rounds)) < pauses) * rng.exponential(0.5, (2, rounds))
    baseline = np.exp(-7.0 + drift + own[0] + paused[0])
    variant = np.exp(-7.0 + math.log(ratio) + offset + drift + own[1] + paused[1])
    return variant, baseline


def test_one_process_ignoring_its_offset_would_cover_too_rarely():
    """Why every run measures the process level: one process cannot see its own offset,
    and a short call's 2% offset makes its narrow interval miss the true ratio far more
    often than 5% of the time."""
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(800):
        variant, baseline = synthetic_process(rng, 0.8, 150, process_sd=0.02)
        low, high = rounds_estimate(variant, baseline).interval(0.95)
        hits += low <= 0.8 <= high
    assert hits / 800 < 0.85


def test_the_estimate_is_the_trimmed_mean_with_yuens_variance():
    """Rounds that alternate (negative correlation: no inflation) give Yuen's interval:
    20% trimmed from each end of the log ratios, the winsorised variance."""
    d = np.array([0.10, -0.02, 0.08, 0.00, 0.12, -0.04, 0.06, 0.02, 0.30, -0.20])
    baseline = np.full(d.size, 1e-3)
    estimate = rounds_estimate(baseline * np.exp(d), baseline)
    kept = np.sort(d)[2:8]
    winsorised = np.clip(d, np.sort(d)[2], np.sort(d)[7])
    yuen_se = math.sqrt(np.var(winsorised, ddof=1) / (0.6 ** 2 * d.size))
    assert estimate.log_ratio == pytest.approx(kept.mean())
    assert estimate.se == pytest.approx(yuen_se)
    assert estimate.df == 5  # kept rounds - 1
    assert estimate.rounds == 10 and estimate.processes == 1


def test_a_pause_in_a_few_rounds_does_not_move_the_estimate():
    rng = np.random.default_rng(1)
    baseline = np.exp(rng.normal(-7, 0.02, 40))
    variant = baseline * 0.5 * np.exp(rng.normal(0, 0.02, 40))
    variant[[3, 17, 30]] *= 20.0  # three rounds hit by a context switch
    assert rounds_estimate(variant, baseline).ratio == pytest.approx(0.5, rel=0.02)


def test_correlated_rounds_widen_the_interval():
    rng = np.random.default_rng(2)
    base = np.full(200, 1e-3)
    independent = base * np.exp(ar1(rng, 0.0, 0.05, (200,)))
    correlated = base * np.exp(ar1(rng, 0.6, 0.05, (200,)))
    assert (rounds_estimate(correlated, base).se
            > 1.5 * rounds_estimate(independent, base).se)


def test_p_values_agree_with_the_interval():
    estimate = PairedEstimate(log_ratio=math.log(0.9), se=0.02, df=30, rounds=31)
    low, high = estimate.interval(0.95)
    # the interval's ends are where each one-sided test reaches 2.5%
    assert estimate.p_below(math.log(high)) == pytest.approx(0.025)
    assert estimate.p_above(math.log(low)) == pytest.approx(0.025)
    assert estimate.p_below(math.log(high)) + estimate.p_above(math.log(high)) == pytest.approx(1)


def test_log_estimate_of_one_runs_samples():
    samples = np.full(30, 2e-3) * np.exp(np.random.default_rng(5).normal(0, 0.01, 30))
    estimate = log_estimate(samples)
    assert estimate.ratio == pytest.approx(2e-3, rel=0.01)  # seconds
    with pytest.raises(ValueError, match="samples: expected at least 2 finite positive seconds"):
        log_estimate([1e-3])


@pytest.mark.parametrize(("variant", "baseline", "message"), [
    ([1.0], [1.0], r"variant: expected at least 2 samples"),
    ([1.0, 2.0], [1.0, 2.0, 3.0], r"variant: expected 3 samples \(one per baseline round\); got 2"),
    ([1.0, float("nan")], [1.0, 1.0], r"variant: expected finite positive seconds; got nan"),
    ([1.0, 1.0], [1.0, -1.0], r"baseline: expected finite positive seconds; got -1.0"),
])
def test_log_ratios_reject_what_is_not_paired_seconds(variant, baseline, message):
    with pytest.raises(ValueError, match=message):
        log_ratios(variant, baseline)


@pytest.mark.parametrize("log_ratio", [0.0, -3.0, 3.0])
def test_an_interval_wider_than_floats_is_bounded_not_an_error(log_ratio):
    """One degree of freedom at a level raised for many looks (t quantile 63,662 at
    0.99999): half a width of 31,800 in log units, past what exp can return. The interval
    stays a pair of positive finite ratios around the estimate, at the floats' bound, and
    reads inconclusive; it was an OverflowError that ended the run (exit 3)."""
    from harness.measure.decision import Word, decide

    estimate = PairedEstimate(log_ratio, 0.5, 1.0, 3)
    low, high = estimate.interval(0.99999)
    assert 0.0 < low < estimate.ratio < high < math.inf
    assert low < 1e-299 and high > 1e299
    assert decide(low, high, 0.05) is Word.INCONCLUSIVE
