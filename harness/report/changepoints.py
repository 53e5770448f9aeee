"""Change points: where a series of runs changed level, and by how much.

A series is one number per run in commit order (a finding's headline speed-up, or a
variant's median time, on one machine), always positive. Its logarithm is segmented by
PELT with the least-squares cost (`ruptures.Pelt`, model "l2": the exact optimum of
"squared deviations from each segment's mean + a penalty per change point"), every
segment at least `MIN_SIZE` runs long, so that one odd run is never a level of its own.

The penalty is BIC-like, `PENALTY_BETA * sigma^2 * ln(n)`, with `sigma` the series' own
noise: the spread of run-to-run differences (their median absolute deviation, 1.4826 x
MAD / sqrt(2), which a step moves by one difference only). `PENALTY_BETA` = 6 was
calibrated on synthetic series (seeds 1000-1999, log-normal noise of 2%, 30 runs): a 10%
step is found at the right run in 97% of series (95% with the step 3 runs from the end),
and a flat series gives a change point in 1% (7% with only 10 runs, where sigma is
estimated from 9 differences). `tests/harness/report/test_changepoints.py` holds it to >= 95% and <= 5%
on seeds 0-99. Apache Otava's E-divisive would give a significance level directly, but
pins numpy to 2.2 and brings a BigQuery, Postgres and Slack client with it.

Each change point's size is the ratio of the geometric means of the runs after and
before it, over the segments on either side, with a 95% Welch interval on the log scale
(each segment's variance at least sigma^2, so two identical runs do not look certain).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import ruptures

from harness.measure.estimate import PairedEstimate

#: runs on each side of a change point, at least
MIN_SIZE = 2
#: penalty per change point, in units of sigma^2 * ln(n) (calibrated: module docstring)
PENALTY_BETA = 6.0
#: sigma never below this (log units): a series of identical values still segments
SIGMA_FLOOR = 1e-9


@dataclass(frozen=True)
class ChangePoint:
    """A change of level in a series, between run `index - 1` and run `index`."""

    index: int
    """The first run of the new level (0-based position in the series)."""
    size: float
    """New level / old level: the geometric mean of the segment after over that of the
    segment before (1.10: 10% higher)."""
    low: float
    """Lower bound of the 95% interval of `size`."""
    high: float
    """Upper bound."""

    def text(self) -> str:
        """'+10.2% [+8.1%, +12.4%]'."""
        return f"{self.size - 1:+.1%} [{self.low - 1:+.1%}, {self.high - 1:+.1%}]"


def noise(log_values: np.ndarray) -> float:
    """Run-to-run noise of a log series (log units, one sigma), robust to steps: 1.4826
    times the median absolute deviation of successive differences, over sqrt(2)."""
    if log_values.size < 3:
        return SIGMA_FLOOR
    diffs = np.diff(log_values)
    mad = np.median(np.abs(diffs - np.median(diffs)))
    return max(float(1.4826 * mad / math.sqrt(2)), SIGMA_FLOOR)


def _as_logs(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError(f"values: expected a 1-D series of finite numbers > 0 (times, "
                         f"ratios); got {list(values)!r}")
    return np.log(array)


def _size(before: np.ndarray, after: np.ndarray, sigma: float, confidence: float
          ) -> tuple[float, float, float]:
    """exp(mean(after) - mean(before)) with its Welch interval, each variance >= sigma^2."""
    va = max(float(np.var(before, ddof=1)), sigma ** 2) / before.size
    vb = max(float(np.var(after, ddof=1)), sigma ** 2) / after.size
    dof = (va + vb) ** 2 / (va ** 2 / (before.size - 1) + vb ** 2 / (after.size - 1))
    shift = PairedEstimate(float(after.mean() - before.mean()), math.sqrt(va + vb), dof,
                           rounds=before.size + after.size)
    return (shift.ratio, *shift.interval(confidence))


def change_points(values: Sequence[float], *, beta: float = PENALTY_BETA,
                  confidence: float = 0.95) -> list[ChangePoint]:
    """The change points of a positive series (module docstring), oldest first; none for
    a series shorter than 2 * MIN_SIZE runs."""
    logs = _as_logs(values)
    if logs.size < 2 * MIN_SIZE:
        return []
    sigma = noise(logs)
    penalty = beta * sigma ** 2 * math.log(logs.size)
    ends = ruptures.Pelt(model="l2", min_size=MIN_SIZE, jump=1).fit(logs).predict(pen=penalty)
    bounds = [0, *ends]  # segment k is logs[bounds[k]:bounds[k + 1]]
    out = []
    for k in range(1, len(bounds) - 1):
        before, after = logs[bounds[k - 1]:bounds[k]], logs[bounds[k]:bounds[k + 1]]
        out.append(ChangePoint(bounds[k], *_size(before, after, sigma, confidence)))
    return out
