"""Statistics over samples: median, IQR, bootstrap intervals of paired differences and
means, Student-t intervals of means, Wilson intervals of rates, and the `Verdict` a result
row carries.

Samples are per-call durations in seconds: non-empty, finite and positive. A row's
ratio and its word come from `harness.measure.estimate` and `harness.measure.decision`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special as scipy_special  # scipy.stats costs seconds of import

__all__ = [
    "RatioCI",
    "Verdict",
    "as_samples",
    "iqr",
    "median",
    "paired_difference_ci",
    "paired_ratio_ci",
    "t_mean_ci",
    "wilson_interval",
]


def as_samples(values: Sequence[float] | np.ndarray, name: str = "samples") -> np.ndarray:
    """`values` as a 1-D float64 array of seconds; ValueError naming `name` otherwise."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"{name}: expected a non-empty 1-D sequence of seconds; "
            f"got shape {array.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(array) | (array <= 0.0))
    if bad.size:
        index = int(bad[0])
        value = float(array[index])
        raise ValueError(
            f"{name}: expected finite positive seconds; got {value!r} at index {index}"
        )
    return array


def median(samples: Sequence[float] | np.ndarray) -> float:
    """Median of `samples` (seconds)."""
    return float(np.median(as_samples(samples)))


def iqr(samples: Sequence[float] | np.ndarray) -> float:
    """Interquartile range (75th minus 25th percentile, linear interpolation) of `samples`."""
    q25, q75 = np.percentile(as_samples(samples), [25.0, 75.0])
    return float(q75 - q25)


@dataclass(frozen=True)
class RatioCI:
    """Ratio of medians `variant / baseline` with a confidence interval `[low, high]`.

    Below 1.0 the variant takes less time than the baseline.
    """

    ratio: float
    """Point estimate: median(variant) / median(baseline)."""
    low: float
    """Lower bound of the interval."""
    high: float
    """Upper bound of the interval."""

    def __post_init__(self) -> None:
        for field in ("ratio", "low", "high"):
            value = getattr(self, field)
            if not (np.isfinite(value) and value > 0.0):
                raise ValueError(
                    f"RatioCI.{field}: expected a finite positive ratio; got {value!r}"
                )
        if self.low > self.high:
            raise ValueError(
                f"RatioCI.low: expected low <= high ({self.high!r}); got {self.low!r}"
            )

    @property
    def speedup(self) -> float:
        """baseline / variant: how many times faster the variant is (below 1.0: slower)."""
        return 1.0 / self.ratio

    @property
    def speedup_interval(self) -> tuple[float, float]:
        """The interval of `speedup`, low bound first."""
        return 1.0 / self.high, 1.0 / self.low


def _bootstrap_medians(samples: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of `n_boot` resamples (with replacement) of `samples [n]` -> `[n_boot]`."""
    draws = rng.integers(0, samples.size, size=(n_boot, samples.size))  # [n_boot, n] indices
    return np.median(samples[draws], axis=1)


def _percentiles(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` interval of bootstrap `estimates`: (low, high)."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(estimates, [tail, 1.0 - tail])
    return float(low), float(high)


def _median_interval(values: np.ndarray, n_boot: int, confidence: float,
                     seed: int) -> tuple[float, float, float]:
    """(median, low, high): the median of `values` with its percentile-bootstrap interval."""
    rng = np.random.default_rng(seed)
    low, high = _percentiles(_bootstrap_medians(values, n_boot, rng), confidence)
    return float(np.median(values)), low, high


def paired_ratio_ci(
    variant_samples: Sequence[float] | np.ndarray,
    baseline_samples: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> RatioCI:
    """Median of the per-round ratios `variant[k] / baseline[k]` with a percentile-bootstrap
    interval that resamples rounds (pairs), for samples where round k of both did the
    same work: what varies from round to round (the work, the machine) cancels in each
    ratio instead of widening the interval."""
    variant = as_samples(variant_samples, "variant_samples")
    baseline = as_samples(baseline_samples, "baseline_samples")
    if variant.size != baseline.size:
        raise ValueError(f"variant_samples: expected {baseline.size} paired samples (one per "
                         f"baseline sample); got {variant.size}")
    ratio, low, high = _median_interval(variant / baseline, n_boot, confidence, seed)
    return RatioCI(ratio=ratio, low=low, high=high)


def paired_difference_ci(
    variant_values: Sequence[float] | np.ndarray,
    baseline_values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(median, low, high) of the per-round differences `variant[k] - baseline[k]` (any
    unit, any sign, e.g. seconds of one phase), with a percentile-bootstrap interval over
    rounds."""
    variant = np.asarray(variant_values, dtype=np.float64)
    baseline = np.asarray(baseline_values, dtype=np.float64)
    if variant.shape != baseline.shape or variant.ndim != 1 or variant.size == 0:
        raise ValueError(f"variant_values: expected {baseline.shape} paired values; "
                         f"got {variant.shape}")
    return _median_interval(variant - baseline, n_boot, confidence, seed)


# --- rates and means: the stability findings count events and compare learning outcomes

Z95 = 1.959963984540054  # two-sided 95% quantile of the standard normal


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a rate `successes / trials`.

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or
    `trials` successes. Raises ValueError unless 0 <= successes <= trials and trials > 0.
    """
    if not (isinstance(trials, int) and trials > 0 and isinstance(successes, int)
            and 0 <= successes <= trials):
        raise ValueError(f"wilson_interval: expected 0 <= successes <= trials, trials > 0; "
                         f"got {successes} of {trials}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def t_mean_ci(values: Sequence[float], *, confidence: float = 0.95
              ) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` with a Student-t interval, `mean -+
    t(n - 1) * s / sqrt(n)` (s the sample standard deviation). For a few independent
    outcomes (one per seed), where a percentile bootstrap of so few values is too narrow;
    for a paired comparison pass the per-pair differences. Values that are all equal give
    the point interval (mean, mean, mean): say what bounds the rate then (e.g. a Wilson
    interval of how many units saw the event at all)."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size < 2 or not np.isfinite(data).all():
        raise ValueError(f"t_mean_ci: expected at least 2 finite numbers; got {values!r}")
    mean = float(data.mean())
    half = (float(scipy_special.stdtrit(data.size - 1, 0.5 + confidence / 2.0))
            * float(data.std(ddof=1)) / math.sqrt(data.size))
    return mean, mean - half, mean + half


class Verdict(str, enum.Enum):
    """What one row of a comparison says; the report renders text from these."""

    BASELINE = "baseline"
    """The row the others are compared against."""
    FASTER = "faster"
    """The whole interval lies below 1 / (1 + margin): the variant takes less time."""
    SLOWER = "slower"
    """The whole interval lies above 1 + margin: the variant takes more time."""
    SAME = "same"
    """The whole interval lies within the margin either way (an equivalence verdict)."""
    INCONCLUSIVE = "inconclusive"
    """Neither: more rounds (or processes) would be needed to say."""
    WITHIN_FACTOR = "within_factor"
    """Older runs only: the interval excluded 1.0 but the change was below the factor."""
    NO_DIFFERENCE = "no_difference"
    """Older runs only: the interval contained 1.0."""
    FAILED = "failed"
    """The variant raised; the row carries the error instead of samples."""
    MISMATCH = "mismatch"
    """The variant's output disagreed with the reference, so it was not timed."""
    NEEDS_CUDA = "needs_cuda"
    """The variant needs a CUDA device and none was available."""
    NOT_TIMED = "not_timed"
    """Not measured in this run (excluded by a filter or the run's budget)."""
