"""harness.measure.estimate: paired ratio estimates, proven on synthetic rounds.

The synthetic clock draws rounds the way this machine's look: a drift shared by every
variant of a round (raw times of neighbouring rounds correlate at 0.4-0.8 here), noise of
each sample with a little correlation left (the log ratios of neighbouring rounds
correlate at -0.2 to +0.2), rare pauses, and an offset of the ratio per process.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.measure.estimate import (
    PROCESS_SD_DF, PairedEstimate, ProcessNoise, log_estimate, log_ratios, paired_estimate, rounds_estimate,
)


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


def coverage(processes: int, rounds: int, process_sd: float, trials: int = 1500,
             seed: int = 0, prior_df: float | None = None) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        runs = [synthetic_process(rng, 0.8, rounds, process_sd) for _ in range(processes)]
        low, high = paired_estimate(runs, process_sd=process_sd,
                                    prior_df=prior_df).interval(0.95)
        hits += low <= 0.8 <= high
    return hits / trials


@pytest.mark.parametrize(("processes", "rounds", "process_sd"), [
    (1, 12, 0.01),   # the fewest rounds a default cell takes
    (1, 60, 0.01),   # a budget's worth of rounds
    (1, 150, 0.02),  # a short call's offset dominates
    (4, 30, 0.01),   # several processes (the gate's sessions)
    (6, 30, 0.03),
])
def test_95_percent_intervals_cover_the_true_ratio_93_to_97_percent_of_the_time(
        processes, rounds, process_sd):
    assert 0.93 <= coverage(processes, rounds, process_sd) <= 0.97


@pytest.mark.parametrize("process_sd", [0.01, 0.05])
def test_a_run_s_cell_in_two_processes_with_a_prior_covers_93_to_98_percent(process_sd):
    """A run's cell and its replica (`prior_df`): the predicted variance is never lowered,
    so the interval errs wide, a little."""
    assert 0.93 <= coverage(2, 40, process_sd, prior_df=PROCESS_SD_DF) <= 0.98


def test_a_pair_that_disagrees_moderates_the_prediction_rather_than_replacing_it():
    rng = np.random.default_rng(5)
    runs = []
    for offset in (0.8, 1.0):  # 22% apart, where 5% is predicted
        base = np.exp(rng.normal(-7, 0.01, 40))
        runs.append((base * offset * np.exp(rng.normal(0, 0.01, 40)), base))
    own = [rounds_estimate(v, b) for v, b in runs]
    predicted = np.mean([e.se ** 2 for e in own]) + 0.05 ** 2
    spread = np.var([e.log_ratio for e in own], ddof=1)
    moderated = paired_estimate(runs, process_sd=0.05, prior_df=4)
    assert moderated.df == 5 and moderated.processes == 2
    assert moderated.se == pytest.approx(math.sqrt((4 * predicted + spread) / 5 / 2))
    # the chi-square rule would leave the spread alone, with 1 degree of freedom
    replaced = paired_estimate(runs, process_sd=0.05)
    assert replaced.df == 1
    low, high = moderated.interval(0.95)
    wide_low, wide_high = replaced.interval(0.95)
    assert math.log(high / low) < math.log(wide_high / wide_low) / 3
    # processes that agree keep the prediction: never narrower
    agreeing = [runs[0], (runs[0][0] * 1.001, runs[0][1])]
    kept = paired_estimate(agreeing, process_sd=0.05, prior_df=4)
    assert kept.se == pytest.approx(math.sqrt(
        (np.mean([rounds_estimate(v, b).se ** 2 for v, b in agreeing]) + 0.05 ** 2) / 2))


def test_one_process_ignoring_its_offset_would_cover_too_rarely():
    """Why the offset is added: without it, a short call's 2% offset makes a narrow
    interval miss the true ratio far more often than 5% of the time."""
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(800):
        variant, baseline = synthetic_process(rng, 0.8, 150, process_sd=0.02)
        low, high = rounds_estimate(variant, baseline, process_sd=0.0).interval(0.95)
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


def test_processes_that_disagree_beyond_the_offset_are_trusted_with_their_spread():
    """Four processes whose ratios differ by 10%, where the model allows 0.4%: their own
    spread is the variance, with 3 degrees of freedom."""
    rng = np.random.default_rng(4)
    runs = []
    for offset in (0.85, 0.95, 1.05, 1.15):
        base = np.exp(rng.normal(-7, 0.01, 30))
        runs.append((base * offset * np.exp(rng.normal(0, 0.01, 30)), base))
    estimate = paired_estimate(runs, process_sd=0.004)
    thetas = [rounds_estimate(v, b).log_ratio for v, b in runs]
    assert estimate.df == 3 and estimate.processes == 4 and estimate.rounds == 120
    assert estimate.se == pytest.approx(np.std(thetas, ddof=1) / 2)


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


def test_paired_estimate_rejects_no_processes_and_a_bad_offset():
    with pytest.raises(ValueError, match="processes: expected at least one"):
        paired_estimate([])
    with pytest.raises(ValueError, match=r"process_sd: expected a finite standard deviation"):
        paired_estimate([([1.0, 1.0], [1.0, 1.0])], process_sd=float("nan"))
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match=r"prior_df: expected None or degrees of freedom"):
            paired_estimate([([1.0, 1.0], [1.0, 1.0])], prior_df=bad)


def test_process_noise_falls_with_call_length_and_is_validated():
    noise = ProcessNoise(anchors=((1e-6, 0.02), (1e-3, 0.004)))
    assert noise(1e-9) == 0.02 and noise(1.0) == 0.004
    assert 0.02 > noise(3e-5) > 0.004
    assert noise(math.sqrt(1e-6 * 1e-3)) == pytest.approx(math.sqrt(0.02 * 0.004))
    default = ProcessNoise()
    assert default(3e-8) > default(2e-6) > default(2e-4) > default(2e-3) == default(0.05)
    with pytest.raises(ValueError, match="ProcessNoise: expected anchors"):
        ProcessNoise(anchors=((1e-3, 0.01), (1e-5, 0.02)))
    with pytest.raises(ValueError, match="ProcessNoise: expected anchors"):
        ProcessNoise(anchors=((1e-3, float("nan")),))
