"""Paired ratio estimates: a variant's time over the baseline's, from per-round log ratios.

Round k of a cell times every variant once, in an order shuffled per round, so the k-th
samples of two variants saw the same machine moments apart, and their log ratio

    d_k = log(variant_k / baseline_k)

cancels what drifts from round to round (frequency, other load, cache state). A cell's
answer is exp(theta), theta the 20%-trimmed mean of the d_k (rounds hit by a pause or
a context switch do not move it), with a Yuen t interval: the variance of the trimmed
mean from the winsorised d_k, scaled up for the correlation of neighbouring rounds
(`_long_run_factor`), with n - 2*floor(0.2 n) - 1 degrees of freedom. Pairing removes
most of that correlation: measured here, raw times of neighbouring rounds correlate at
0.4-0.8 and their log ratios at -0.2 to +0.2.

The noise lives at more than one level (Kalibera and Jones, ISMM 2013). A fresh process
runs one variant a little faster or slower against another than the next process does
(code placement, allocator state): an offset of the ratio per process, of standard
deviation `process_sd` on the log scale. One process cannot see its own offset, so its
variance is added to the within-process variance; where the same cell was measured in
several processes (the gate's sessions), their estimates are averaged with the variance
the within-process variances plus `process_sd`^2 predict, unless their spread exceeds
that prediction (a chi-square test at 5%): then their spread, with P - 1 degrees of
freedom, is the variance. A run's cell measured in two or three processes (its replicas)
moderates the prediction with their spread instead (`paired_estimate`'s `prior_df`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

__all__ = ["PROCESS_SD_DF", "PairedEstimate", "ProcessNoise", "TRIM", "log_estimate",
           "log_ratios", "paired_estimate", "rounds_estimate"]

#: the share of rounds trimmed from each end of the per-round log ratios
TRIM = 0.2
#: the degrees of freedom a process offset's standard deviation carries: `ProcessNoise`
#: was measured from 5 fresh processes per row, a finding's `between_runs` as a standard
#: deviation over 9 runs (counted as 4: a rare mode, one run in ten, is poorly estimated)
PROCESS_SD_DF = 4.0


def log_ratios(variant: Sequence[float], baseline: Sequence[float]) -> np.ndarray:
    """`[n]` per-round log(variant_k / baseline_k) from `n` paired samples (seconds > 0);
    ValueError naming the argument that is not a matching, finite, positive sequence."""
    v = np.asarray(variant, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    for name, array in (("variant", v), ("baseline", b)):
        if array.ndim != 1 or array.size < 2:
            raise ValueError(f"{name}: expected at least 2 samples per round list; got shape "
                             f"{array.shape}")
        if not (np.isfinite(array).all() and (array > 0).all()):
            bad = float(array[~(np.isfinite(array) & (array > 0))][0])
            raise ValueError(f"{name}: expected finite positive seconds; got {bad!r}")
    if v.size != b.size:
        raise ValueError(f"variant: expected {b.size} samples (one per baseline round); "
                         f"got {v.size}")
    return np.log(v) - np.log(b)


@dataclass(frozen=True)
class PairedEstimate:
    """A log ratio with its standard error and degrees of freedom: enough for an interval
    at any level and a p-value against any boundary.

    Below 0 (a ratio below 1) the variant takes less time than the baseline.
    """

    log_ratio: float
    """theta: the estimate of log(variant time / baseline time)."""
    se: float
    """Standard error of theta (log units), every level of noise included."""
    df: float
    """Degrees of freedom of the t distribution the interval uses."""
    rounds: int
    """Paired rounds behind it, over every process."""
    processes: int = 1
    """Processes the rounds came from."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.log_ratio) and math.isfinite(self.se) and self.se >= 0
                and self.df > 0):
            raise ValueError(f"PairedEstimate: expected a finite log ratio, se >= 0 and df > 0; "
                             f"got {self.log_ratio!r}, {self.se!r}, {self.df!r}")

    @property
    def ratio(self) -> float:
        """variant time / baseline time."""
        return math.exp(self.log_ratio)

    def quantile(self, confidence: float) -> float:
        """The two-sided t quantile for `confidence` (0.95 -> about 2 for many rounds)."""
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence: expected a fraction in (0, 1); got {confidence!r}")
        return float(scipy_stats.t.ppf(0.5 + confidence / 2.0, self.df))

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """(low, high) of the ratio at `confidence`, two-sided."""
        half = self.quantile(confidence) * self.se
        return math.exp(self.log_ratio - half), math.exp(self.log_ratio + half)

    def p_above(self, log_boundary: float) -> float:
        """One-sided p-value of "theta > log_boundary" (small: the data say it is above)."""
        if self.se == 0.0:
            return 0.0 if self.log_ratio > log_boundary else 1.0
        return float(scipy_stats.t.sf((self.log_ratio - log_boundary) / self.se, self.df))

    def p_below(self, log_boundary: float) -> float:
        """One-sided p-value of "theta < log_boundary"."""
        if self.se == 0.0:
            return 0.0 if self.log_ratio < log_boundary else 1.0
        return float(scipy_stats.t.cdf((self.log_ratio - log_boundary) / self.se, self.df))


def _trimmed_stats(d: np.ndarray) -> tuple[float, float, float]:
    """(trimmed mean, its variance, df) of one process's log ratios `d [n]` (module
    docstring: Yuen's interval, its winsorised variance scaled for autocorrelation)."""
    n = d.size
    cut = int(math.floor(TRIM * n))
    ordered = np.sort(d)
    theta = float(ordered[cut:n - cut].mean())
    winsorised = np.clip(d, ordered[cut], ordered[n - cut - 1])
    centred = winsorised - winsorised.mean()
    gamma0 = float(centred @ centred) / n
    kept = n - 2 * cut
    # Yuen: the winsorised variance (n - 1 denominator) over ((1 - 2 g)^2 n) = kept^2 / n
    variance = gamma0 * n / (n - 1) * n / (kept * kept)
    return theta, variance * _long_run_factor(centred, gamma0), float(max(kept - 1, 1))


def _long_run_factor(centred: np.ndarray, gamma0: float) -> float:
    """How much autocorrelation inflates the variance of a mean of `centred [n]`: the
    AR(1) long-run factor (1 + r) / (1 - r), r the lag-1 autocorrelation corrected for
    its small-sample bias (+(1 + 3r)/n) and capped at 0.9; never below 1, so that
    negative correlation (alternating luck) never narrows the interval."""
    n = centred.size
    if gamma0 <= 0.0 or n < 3:
        return 1.0
    r = float(centred[1:] @ centred[:-1]) / n / gamma0
    r = min(0.9, r + (1.0 + 3.0 * r) / n)
    return max(1.0, (1.0 + r) / (1.0 - r))


def log_estimate(samples: Sequence[float]) -> PairedEstimate:
    """log of one variant's time per call (seconds) in one process: the 20%-trimmed mean of
    its log samples with the same interval as a ratio's (`log_ratio` holds log seconds,
    `ratio` seconds). For comparing runs, each with its own estimate."""
    values = np.asarray(samples, dtype=np.float64)
    if values.ndim != 1 or values.size < 2 or not (np.isfinite(values).all()
                                                   and (values > 0).all()):
        raise ValueError(f"samples: expected at least 2 finite positive seconds; got "
                         f"{values.size} values" + ("" if values.size < 2 else " with a bad one"))
    theta, variance, df = _trimmed_stats(np.log(values))
    return PairedEstimate(theta, math.sqrt(variance), df, values.size, 1)


def rounds_estimate(variant: Sequence[float], baseline: Sequence[float], *,
                    process_sd: float = 0.0) -> PairedEstimate:
    """The estimate from one process's paired rounds (`variant[k]` and `baseline[k]`,
    seconds per call, from round k), with `process_sd` (log units) for the offset this
    process may carry (module docstring)."""
    return paired_estimate([(variant, baseline)], process_sd=process_sd)


def paired_estimate(processes: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                    process_sd: float = 0.0, prior_df: float | None = None) -> PairedEstimate:
    """The estimate from one or more processes, each `(variant [n_p], baseline [n_p])`
    seconds per call paired by round (module docstring for how they combine).

    `prior_df`: the degrees of freedom `process_sd` carries, for a few processes (a run's
    cell and its replicas): their spread then moderates the predicted variance instead of
    replacing it, as `(prior_df * predicted + (P - 1) * spread) / (prior_df + P - 1)`
    with `prior_df + P - 1` degrees of freedom, never below the prediction. With two
    processes the spread alone would carry one degree of freedom (a t quantile of 12.7
    at 95%), so one pair that disagrees would leave no word at all. None: the chi-square
    rule (the gate's sessions, three or more)."""
    if not processes:
        raise ValueError("processes: expected at least one (variant, baseline) pair of "
                         "sample lists; got none")
    if prior_df is not None and not (math.isfinite(prior_df) and prior_df > 0):
        raise ValueError(f"prior_df: expected None or degrees of freedom > 0; got {prior_df!r}")
    if not (math.isfinite(process_sd) and process_sd >= 0):
        raise ValueError(f"process_sd: expected a finite standard deviation >= 0 (log units); "
                         f"got {process_sd!r}")
    parts = [_trimmed_stats(log_ratios(v, b)) for v, b in processes]
    thetas = np.array([p[0] for p in parts])
    within = np.array([p[1] for p in parts])
    dfs = np.array([p[2] for p in parts])
    rounds = sum(len(v) for v, _ in processes)
    count = len(parts)
    predicted = float(within.mean()) + process_sd ** 2  # variance of one process's theta
    # Welch-Satterthwaite: process_sd is a measured constant, so only `within` carries df
    carried = float(np.sum(within ** 2 / dfs))
    model_df = min(predicted ** 2 * count ** 2 / carried, 1e6) if carried > 0 else 1e6
    if count >= 2:
        spread = float(np.var(thetas, ddof=1))
        if prior_df is not None:  # a few processes: their spread moderates the prediction
            moderated = (prior_df * predicted + (count - 1) * spread) / (prior_df + count - 1)
            if moderated > predicted:
                return PairedEstimate(float(thetas.mean()), math.sqrt(moderated / count),
                                      float(prior_df + count - 1), rounds, count)
        # the processes disagree more than the model allows (a chi-square test at 5%):
        # their own spread, with count - 1 degrees of freedom, is the variance
        elif spread > predicted * scipy_stats.chi2.ppf(0.95, count - 1) / (count - 1):
            return PairedEstimate(float(thetas.mean()), math.sqrt(spread / count),
                                  float(count - 1), rounds, count)
    return PairedEstimate(float(thetas.mean()), math.sqrt(predicted / count), model_df,
                          rounds, count)


@dataclass(frozen=True)
class ProcessNoise:
    """How large the per-process offset of a ratio is, by how long the calls are.

    A ratio of short calls moves more from one fresh process to the next than a ratio of
    long ones (where code sits and how the allocator starts matter more to a few hundred
    nanoseconds of work). Measured on the 2-core CPU this project is developed on, idle
    (`benchmarks/verdict_stability.py processes`: eight rows, each in 5 fresh processes;
    the spread of their estimates less what their own rounds explain; docs/statistics.md):
    8% at 30 ns calls, 1-2% from 2 to 200 us, 0-0.4% from 2 to 50 ms. The standard
    deviation is interpolated on log-log axes between `anchors` and held beyond them.
    """

    anchors: tuple[tuple[float, float], ...] = (
        (3e-8, 0.08), (2e-6, 0.02), (2e-4, 0.012), (2e-3, 0.004))
    """(seconds per call, standard deviation of the log ratio's offset), by seconds."""
    same_code_sd: float = 0.004
    """The offset between two calls of the same code (the placebo): code placement is
    shared, and data placement too where the placebo shares the variants' inputs (every
    finding but a paired one). Measured with the placebo on a copy of the inputs: 0.1-0.6%
    whatever the call's length; kept as the bound for the shared case, whose offset is
    smaller."""

    def __post_init__(self) -> None:
        points = self.anchors
        if (not points or any(len(p) != 2 for p in points)
                or not all(math.isfinite(s) and s > 0 and math.isfinite(sd) and sd >= 0
                           for s, sd in points)
                or any(a[0] >= b[0] for a, b in zip(points, points[1:]))
                or not (math.isfinite(self.same_code_sd) and self.same_code_sd >= 0)):
            raise ValueError(f"ProcessNoise: expected anchors of (seconds > 0, sd >= 0) in "
                             f"increasing seconds and same_code_sd >= 0; got {self!r}")

    def __call__(self, seconds: float) -> float:
        """The standard deviation (log units) for calls of `seconds`."""
        points = self.anchors
        if not seconds > points[0][0]:
            return points[0][1]
        for (s0, sd0), (s1, sd1) in zip(points, points[1:]):
            if seconds == s1:
                return sd1
            if seconds < s1:
                position = math.log(seconds / s0) / math.log(s1 / s0)
                if sd0 == 0 or sd1 == 0:
                    return sd0 + position * (sd1 - sd0)
                return math.exp((1 - position) * math.log(sd0) + position * math.log(sd1))
        return points[-1][1]
