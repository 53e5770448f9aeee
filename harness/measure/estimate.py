"""Paired ratio estimates: a variant's time over the baseline's, from per-round log ratios.

Round k of a cell times every variant once, in an order shuffled per round, so the k-th
samples of two variants saw the same machine moments apart, and their log ratio

    d_k = log(variant_k / baseline_k)

cancels what drifts from round to round (frequency, other load, cache state). A process's
answer is exp(theta), theta the 20%-trimmed mean of the d_k (rounds hit by a pause or
a context switch do not move it), with a Yuen t interval: the variance of the trimmed
mean from the winsorised d_k, scaled up for the correlation of neighbouring rounds
(`_long_run_factor`; in a run, measured over all its rows at once: `long_run_factor`),
with n - 2*floor(0.2 n) - 1 degrees of freedom (`rounds_estimate`).

The noise lives at more than one level (Kalibera and Jones, ISMM 2013). A fresh process
runs one variant a little faster or slower against another than the next process does
(code placement, allocator state, which core): an offset of the ratio per process, which
no number of rounds inside one process can see. How large it is depends on the machine,
its load and the length of the calls, so it is measured in every run, never assumed: each
cell is measured in two or more fresh processes (`RowProcesses`), the spread of their
estimates is pooled over the run's rows of similar call length (`pool_spread`: a robust,
median-based variance, with the degrees of freedom the rows' agreement gives it), each
row's variance is moderated between that pool and its own spread (`row_estimate`), a row
whose processes disagree more than the pool allows is named (`disagreement`) and gets more
processes, and a run whose rows disagree more often than chance allows widens every
interval until they do not (`calibrate`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special as scipy_special  # scipy.stats costs seconds of import

__all__ = ["BandSpread", "Calibration", "PairedEstimate", "ProcessSpread", "RowProcesses",
           "TRIM", "calibrate", "disagreement", "log_estimate", "log_ratios", "long_run_factor",
           "pool_spread", "row_estimate", "rounds_estimate"]

#: the share of rounds trimmed from each end of the per-round log ratios
TRIM = 0.2

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


#: |log| of the widest ratio an interval states (exp(690) is about 1e300; floats end at
#: exp(709.78))
MAX_LOG_BOUND = 690.0


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
        return float(scipy_special.stdtrit(self.df, 0.5 + confidence / 2.0))

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """(low, high) of the ratio at `confidence`, two-sided. Bounds past what floats
        hold (one degree of freedom at a level raised for many looks: t quantiles in the
        tens of thousands) stop at exp(+-MAX_LOG_BOUND): positive and finite, as every
        interval the results keep, and far past any margin."""
        half = self.quantile(confidence) * self.se if self.se > 0 else 0.0
        low = max(self.log_ratio - half, -MAX_LOG_BOUND)
        high = min(self.log_ratio + half, MAX_LOG_BOUND)
        return math.exp(low), math.exp(high)

    def p_above(self, log_boundary: float) -> float:
        """One-sided p-value of "theta > log_boundary" (small: the data say it is above)."""
        if self.se == 0.0:
            return 0.0 if self.log_ratio > log_boundary else 1.0
        return float(scipy_special.stdtr(self.df, (log_boundary - self.log_ratio) / self.se))

    def p_below(self, log_boundary: float) -> float:
        """One-sided p-value of "theta < log_boundary"."""
        if self.se == 0.0:
            return 0.0 if self.log_ratio < log_boundary else 1.0
        return float(scipy_special.stdtr(self.df, (self.log_ratio - log_boundary) / self.se))


def _winsorised(d: np.ndarray) -> tuple[float, np.ndarray, int]:
    """(20%-trimmed mean, the winsorised values less their mean [n], values kept by the
    trim) of one process's log ratios `d [n]`."""
    n = d.size
    cut = int(math.floor(TRIM * n))
    ordered = np.sort(d)
    winsorised = np.clip(d, ordered[cut], ordered[n - cut - 1])
    return (float(ordered[cut:n - cut].mean()), winsorised - winsorised.mean(),
            n - 2 * cut)


def _trimmed_stats(d: np.ndarray, long_run: float | None = None) -> tuple[float, float, float]:
    """(trimmed mean, its variance, df) of one process's log ratios `d [n]` (module
    docstring: Yuen's interval, its winsorised variance scaled for autocorrelation by
    `long_run`, else by the factor these rounds alone give)."""
    n = d.size
    theta, centred, kept = _winsorised(d)
    energy = float(centred @ centred)
    # Yuen: the winsorised variance (n - 1 denominator) over ((1 - 2 g)^2 n) = kept^2 / n
    variance = energy / (n - 1) * n / (kept * kept)
    if long_run is None:
        long_run = _long_run_factor(float(centred[1:] @ centred[:-1]), energy, n)
    return theta, variance * long_run, float(max(kept - 1, 1))


def _long_run_factor(lagged: float, energy: float, n: float) -> float:
    """How much autocorrelation inflates the variance of a mean of n rounds: the AR(1)
    long-run factor (1 + r) / (1 - r), r = `lagged` / `energy` (the sums of neighbouring
    products and of squares of centred values) corrected for its small-sample bias
    (+(1 + 3r)/n) and capped at 0.9; never below 1, so that negative correlation
    (alternating luck) never narrows the interval."""
    if energy <= 0.0 or n < 3:
        return 1.0
    r = lagged / energy
    r = min(0.9, r + (1.0 + 3.0 * r) / n)
    return max(1.0, (1.0 + r) / (1.0 - r))


def long_run_factor(processes: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float:
    """The long-run factor of a run's rows, from every process's `(variant [n_p],
    reference [n_p])` rounds at once: the lag-1 autocorrelation of the log ratios pooled
    over them (sums of neighbouring products over sums of squares, each process's values
    centred on its own mean), its small-sample bias corrected at their mean length. One
    process's 8 rounds cannot measure it: its r has a standard error of about 0.35, and
    the factor, floored at 1, turned that noise into intervals 15% wider on average."""
    lagged = energy = 0.0
    lengths = []
    for variant, reference in processes:
        _, centred, _ = _winsorised(log_ratios(variant, reference))
        lagged += float(centred[1:] @ centred[:-1])
        energy += float(centred @ centred)
        lengths.append(centred.size)
    if not lengths:
        return 1.0
    return _long_run_factor(lagged, energy, float(np.mean(lengths)))


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


def rounds_estimate(variant: Sequence[float], baseline: Sequence[float]) -> PairedEstimate:
    """The estimate from one process's paired rounds (`variant[k]` and `baseline[k]`,
    seconds per call, from round k): what its rounds see, without the process level."""
    theta, variance, df = _trimmed_stats(log_ratios(variant, baseline))
    return PairedEstimate(theta, math.sqrt(variance), df, len(variant), 1)


# ------------------------------------------------------------ the process level, measured

#: call lengths (seconds) that part the run's rows into bands whose process spread is
#: pooled apart: a ratio of short calls moves more between processes than one of long
#: calls (code and data placement weigh more in less work)
BAND_EDGES_S = (20e-6, 2e-3)
#: rows a band needs to be pooled on its own; fewer borrow from the whole run's rows
MIN_BAND_ROWS = 6
#: a row whose processes disagree at this level (its F test) is a disagreeing row
DISAGREE_LEVEL = 0.05


@dataclass(frozen=True)
class RowProcesses:
    """One row (a variant against its reference at one cell) as each process measured it."""

    seconds: float
    """Seconds per call (the shorter of variant and reference): which band it pools in."""
    thetas: tuple[float, ...]
    """Per process, its estimate of the log ratio (`_trimmed_stats`)."""
    variances: tuple[float, ...]
    """Per process, that estimate's variance from its own rounds."""
    rounds: int
    """Paired rounds, over every process."""
    pooled: bool = True
    """Whether the row informs the run's process spread (the placebo, the baseline's own
    code against itself, has no offset of code placement to tell of)."""

    @classmethod
    def of(cls, processes: Sequence[tuple[Sequence[float], Sequence[float]]],
           pooled: bool = True, long_run: float | None = None) -> "RowProcesses":
        """From each process's `(variant [n_p], reference [n_p])` seconds, paired by round;
        `long_run`: the run's long-run factor (`long_run_factor` over all its rows), else
        each process's own."""
        if not processes:
            raise ValueError("processes: expected at least one (variant, reference) pair of "
                             "sample lists; got none")
        parts = [_trimmed_stats(log_ratios(v, b), long_run) for v, b in processes]
        seconds = min(min(float(np.median(v)), float(np.median(b))) for v, b in processes)
        return cls(seconds, tuple(p[0] for p in parts), tuple(p[1] for p in parts),
                   sum(len(v) for v, _ in processes), pooled)

    @property
    def processes(self) -> int:
        return len(self.thetas)

    @property
    def within(self) -> float:
        """The mean within-process variance of one process's estimate."""
        return float(np.mean(self.variances))

    @property
    def spread(self) -> float:
        """The variance of the processes' estimates (0 with one process)."""
        return float(np.var(self.thetas, ddof=1)) if self.processes > 1 else 0.0


@dataclass(frozen=True)
class BandSpread:
    """The between-process variance of a log ratio for calls up to `upper_s` seconds."""

    upper_s: float
    tau2: float
    """Variance (log units squared) of one process's offset."""
    df: float
    """The degrees of freedom `tau2` carries (0: nothing measured it)."""
    rows: int
    """Rows of two or more processes it was pooled from."""
    own: bool = True
    """Whether those were the band's own rows (else too few: the whole run's)."""


@dataclass(frozen=True)
class ProcessSpread:
    """How far a fresh process moves a ratio, as this run's own processes measured it: per
    call-length band, the variance of the offset and its degrees of freedom, times
    `inflation` where the run's calibration found its intervals too narrow."""

    bands: tuple[BandSpread, ...]
    inflation: float = 1.0

    def band(self, seconds: float) -> BandSpread:
        for band in self.bands:
            if seconds <= band.upper_s:
                return band
        return self.bands[-1]


def _band_index(seconds: float) -> int:
    return sum(seconds > edge for edge in BAND_EDGES_S)


def _median_tau2(rows: Sequence[RowProcesses]) -> float:
    """The offset variance at which each row's spread, scaled by what it predicts, sits at
    the median of its chi-square: half the rows above, half below. Robust: a row in two
    modes moves it no more than any one row (a mean would follow it)."""
    k = np.array([r.processes - 1 for r in rows], dtype=float)
    spread = np.array([r.spread for r in rows])
    within = np.array([r.within for r in rows])

    def above(tau2: float) -> float:  # the median CDF, less one half: falls with tau2
        return float(np.median(scipy_special.chdtr(k, k * spread / (tau2 + within)))) - 0.5

    if above(0.0) <= 0.0:
        return 0.0
    low, high = 0.0, max(float(spread.max()), 1e-12)
    while above(high) > 0.0:
        high *= 4.0
    for _ in range(60):
        middle = (low + high) / 2.0
        low, high = (middle, high) if above(middle) > 0.0 else (low, middle)
    return high


def _prior_df(rows: Sequence[RowProcesses], tau2: float) -> float:
    """The degrees of freedom the pooled `tau2` carries, from how much the rows' scaled
    spreads vary beyond what chi-square sampling explains (Smyth's empirical Bayes, as
    limma's fitFDist: the excess variance of their logs is trigamma(d0 / 2)); the log
    spreads are winsorised at their 10% tails, so a few rows in two modes, which get
    processes of their own, do not take every row's degrees of freedom. Never more than
    the rows' own."""
    k = np.array([r.processes - 1 for r in rows], dtype=float)
    total = float(k.sum())
    if len(rows) < 3:
        return total
    scaled = np.array([max(r.spread, 1e-300) / max(tau2 + r.within, 1e-300) for r in rows])
    logs = np.log(scaled) - (scipy_special.digamma(k / 2.0) - np.log(k / 2.0))
    low, high = np.quantile(logs, [0.1, 0.9])
    logs = np.clip(logs, low, high)
    excess = float(np.var(logs, ddof=1)) - float(np.mean(scipy_special.polygamma(1, k / 2.0)))
    if excess <= 0.0:
        return total
    return float(min(total, 2.0 * _trigamma_inverse(excess)))


def _trigamma_inverse(y: float) -> float:
    """x with trigamma(x) = y (y > 0), by Newton's method from limma's start."""
    x = 0.5 + 1.0 / y if y < 1e6 else 1.0 / math.sqrt(y)
    for _ in range(50):
        step = float(scipy_special.polygamma(1, x) - y) / float(scipy_special.polygamma(2, x))
        x = max(x - step, x / 10.0)
        if abs(step) < 1e-8 * x:
            break
    return x


def _shared(rows: Sequence[RowProcesses], tau2: float, df: float) -> tuple[float, float]:
    """(tau2, df) once an offset that one process gives all its rows alike is allowed for:
    the first two processes measured every row (the run's own and its first worker), and
    the mean of their signed differences over the rows estimates twice that shared
    variance, with one degree of freedom (one pair of processes), however many rows show
    it. The pooled variance is kept at least that large, and its degrees of freedom are
    Satterthwaite's for the sum of the shared part (1) and the rest (`df`)."""
    differences = np.array([r.thetas[1] - r.thetas[0] for r in rows if r.processes > 1])
    if differences.size < 3:
        return tau2, df
    shared = max(0.0, float(differences.mean()) ** 2
                 - float(np.var(differences, ddof=1)) / differences.size) / 2.0
    if shared <= 0.0:
        return tau2, df
    total = max(tau2, shared)
    rest = total - shared
    carried = shared * shared / 1.0 + (rest * rest / df if df > 0 else 0.0)
    return total, float(min(df, total * total / carried)) if carried > 0 else df


def pool_spread(rows: Sequence[RowProcesses]) -> ProcessSpread:
    """The run's process spread, per call-length band (`BAND_EDGES_S`), from its rows of two
    or more processes that inform it (`RowProcesses.pooled`); a band of fewer than
    `MIN_BAND_ROWS` such rows takes the whole run's. No such row at all: every band 0
    with 0 degrees of freedom (nothing measured; `row_estimate` then says what it can)."""
    measured = [r for r in rows if r.pooled and r.processes > 1]

    def pooled(some: Sequence[RowProcesses]) -> tuple[float, float]:
        tau2 = _median_tau2(some)
        return _shared(some, tau2, _prior_df(some, tau2))

    overall = pooled(measured) if measured else (0.0, 0.0)
    bands = []
    for index, upper in enumerate((*BAND_EDGES_S, math.inf)):
        own = [r for r in measured if _band_index(r.seconds) == index]
        if len(own) >= MIN_BAND_ROWS:
            bands.append(BandSpread(upper, *pooled(own), len(own)))
        else:
            bands.append(BandSpread(upper, *overall, len(measured), own=False))
    return ProcessSpread(tuple(bands))


def disagreement(row: RowProcesses, spread: ProcessSpread) -> float:
    """The p-value of "the row's processes agree as the run's spread says they should": its
    spread over the predicted variance, an F test with the band's degrees of freedom (1.0
    with one process)."""
    if row.processes < 2:
        return 1.0
    band = spread.band(row.seconds)
    predicted = band.tau2 * spread.inflation + row.within
    if predicted <= 0.0:
        return 0.0 if row.spread > 0.0 else 1.0
    ratio = row.spread / predicted
    k = row.processes - 1
    if band.df <= 0.0:
        return 1.0  # nothing to hold it against
    return float(scipy_special.fdtrc(k, band.df, ratio))


def row_estimate(row: RowProcesses, spread: ProcessSpread) -> PairedEstimate:
    """The row's log ratio: the mean of its processes' estimates, with the variance of one
    process's estimate moderated between the band's prediction (its offset variance plus
    the row's own within-process variance, `df` degrees of freedom) and the row's own
    spread (`processes - 1`): `(df * predicted + k * spread) / (df + k)`, with
    `df + k` degrees of freedom (Smyth's moderated variance). A row whose processes
    disagree with the band (`disagreement` below `DISAGREE_LEVEL`) is not held to it: its
    own spread alone, with `processes - 1` degrees of freedom. A row the run cannot hold
    against anything (one process, a band no process measured) gets its within-process
    variance doubled and one degree of freedom: wide, never narrow."""
    band = spread.band(row.seconds)
    k = row.processes - 1
    theta = float(np.mean(row.thetas))
    if band.df <= 0.0 and k == 0:
        return PairedEstimate(theta, math.sqrt(2.0 * row.within), 1.0, row.rounds, 1)
    if k > 0 and disagreement(row, spread) < DISAGREE_LEVEL:
        own = max(row.spread, row.within)
        return PairedEstimate(theta, math.sqrt(own / row.processes), float(k), row.rounds,
                              row.processes)
    predicted = band.tau2 * spread.inflation + row.within
    df = band.df + k
    variance = (band.df * predicted + k * row.spread) / df
    return PairedEstimate(theta, math.sqrt(max(variance, 0.0) / row.processes),
                          float(min(df, 1e6)), row.rounds, row.processes)


@dataclass(frozen=True)
class Calibration:
    """Whether the run's rows disagree between processes as often as its spread allows."""

    rows: int
    """Pooled rows of two or more processes."""
    disagreeing: int
    """Of them, those whose processes disagree at `DISAGREE_LEVEL`."""
    expected: int
    """The most that chance alone makes likely (the 99% binomial quantile)."""
    inflation: float
    """The factor on the offset variance that brings `disagreeing` down to `expected`
    (1.0 where it already is)."""

    @property
    def too_narrow(self) -> bool:
        return self.inflation > 1.0


def calibrate(rows: Sequence[RowProcesses], spread: ProcessSpread) -> tuple[ProcessSpread,
                                                                            Calibration]:
    """Hold the run's intervals against its own processes: if more pooled rows disagree
    between processes than chance makes likely (a model too narrow for this machine:
    heavy tails, processes in two modes), the offset variance is inflated until they do
    not, and the returned spread carries the factor."""
    measured = [r for r in rows if r.pooled and r.processes > 1]
    count = len(measured)
    # the 99th percentile of Binomial(count, DISAGREE_LEVEL): its least k with CDF >= 0.99
    expected = int(np.searchsorted(scipy_special.bdtr(np.arange(count + 1), count,
                                                      DISAGREE_LEVEL), 0.99))

    def disagreeing(factor: float) -> int:
        widened = dataclasses.replace(spread, inflation=factor)
        return sum(disagreement(r, widened) < DISAGREE_LEVEL for r in measured)

    found = disagreeing(1.0)
    if found <= expected:
        return spread, Calibration(count, found, expected, 1.0)
    low, high = 1.0, 2.0
    while disagreeing(high) > expected and high < 1e4:
        low, high = high, high * 2.0
    for _ in range(30):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if disagreeing(middle) > expected else (low, middle)
    return (dataclasses.replace(spread, inflation=high),
            Calibration(count, found, expected, high))
