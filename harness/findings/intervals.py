"""Intervals for the stability findings: rates over episodes and mean differences.

Timing ratios have their intervals in `harness.measure.stats`; the findings that count
events (how often a seed's gradient norm exceeds a limit, how often a host diverges) or
compare learning outcomes need a rate's interval and a mean difference's.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

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


def bootstrap_mean_ci(values: Sequence[float], *, n_boot: int = 4000, confidence: float = 0.95,
                      seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` with a percentile-bootstrap interval. For a
    paired comparison pass the per-pair differences (variant minus baseline)."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or data.size == 0 or not np.isfinite(data).all():
        raise ValueError(f"bootstrap_mean_ci: expected a non-empty list of finite numbers; "
                         f"got {values!r}")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(n_boot, data.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(data.mean()), float(low), float(high)
