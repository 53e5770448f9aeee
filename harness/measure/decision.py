"""Words with a margin: from a ratio's interval to faster, slower, same or inconclusive.

A practical margin m (default 5%) says which changes matter. With the interval of a time
ratio (variant / baseline):

- *faster*: the whole interval lies below 1 / (1 + m);
- *slower*: the whole interval lies above 1 + m;
- *same*: the whole interval lies within [1 / (1 + m), 1 + m] (an equivalence verdict);
- *inconclusive*: neither; it leans the way its point estimate lies, and about
  `rounds_to_decide` rounds would decide it if the noise stays as it is.

A claim that states a factor ("~4x", "up to 25x") gets its own word about the speed-up
S = 1 / ratio and the factor F, with a tolerance t (default 25%, printed with it):
*exceeded* when the whole interval of S lies above F (1 + t), *met* when it lies at or
above F / (1 + t), *not met* when it lies below F / (1 + t), else *inconclusive*.

Sampling that stops as soon as a word is decided looks at the data more than once; each
look uses the level 1 - alpha / K for the K looks its schedule allows (Bonferroni), so
looking often does not inflate the errors (`Looks`). Over a whole run, `benjamini_hochberg`
says which decisive words hold at a false discovery rate q.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.measure.estimate import PairedEstimate
from harness.measure.numbers import is_real

__all__ = [
    "DEFAULT_MARGIN", "DEFAULT_TOLERANCE", "ClaimWord", "Looks", "Word", "benjamini_hochberg",
    "check_fraction", "claim_word", "decide", "lean", "rounds_to_decide",
    "word_p_value",
]

DEFAULT_MARGIN = 0.05
"""The practical margin: a change smaller than 5% either way is *same*."""
DEFAULT_TOLERANCE = 0.25
"""How far a claimed factor ("~4x") may be off and still be *met*."""
ALPHA = 0.05
"""Error rate of one word's interval (95%)."""


def check_fraction(value: object, field: str) -> float:
    """`value` as a float in (0, 1); ValueError naming `field`, the expected and the
    received value otherwise (a bool, NaN or inf included)."""
    if not (is_real(value) and 0.0 < value < 1.0):
        raise ValueError(f"{field}: expected a fraction in (0, 1), e.g. 0.05; got {value!r}")
    return float(value)


class Word(str, enum.Enum):
    """What a ratio's interval says against the margin."""

    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"
    INCONCLUSIVE = "inconclusive"

    @property
    def decisive(self) -> bool:
        return self is not Word.INCONCLUSIVE


def decide(low: float, high: float, margin: float = DEFAULT_MARGIN) -> Word:
    """The word for a ratio interval `[low, high]` (variant / baseline) at `margin`."""
    upper = 1.0 + margin
    lower = 1.0 / upper
    if high < lower:
        return Word.FASTER
    if low > upper:
        return Word.SLOWER
    if lower <= low and high <= upper:
        return Word.SAME
    return Word.INCONCLUSIVE


def lean(ratio: float, margin: float = DEFAULT_MARGIN) -> Word:
    """Which word an inconclusive interval leans to: where its point estimate lies."""
    return decide(ratio, ratio, margin)


def _needed_halfwidth(log_ratio: float, margin: float) -> float:
    """The largest half-width (log units) at which an interval around `log_ratio` is
    decided: the distance to the nearest margin edge."""
    edge = math.log1p(margin)
    return abs(abs(log_ratio) - edge)


def rounds_to_decide(estimate: PairedEstimate, confidence: float,
                     margin: float = DEFAULT_MARGIN) -> int | None:
    """About how many rounds in all would decide `estimate`'s word at `confidence`, if its
    point estimate and per-round noise stayed as they are (the half-width shrinks as
    1/sqrt(rounds)); None when the estimate sits on a margin edge (no number would)."""
    needed = _needed_halfwidth(estimate.log_ratio, margin)
    half = estimate.quantile(confidence) * estimate.se
    if needed < 1e-9 * max(1.0, half):
        return None
    if half <= needed:
        return estimate.rounds
    return int(math.ceil(estimate.rounds * (half / needed) ** 2))


def word_p_value(estimate: PairedEstimate, word: Word, margin: float = DEFAULT_MARGIN) -> float:
    """Two-sided p-value of a decisive `word` (twice the one-sided p of its claim, so that
    p < alpha exactly when the (1 - alpha) interval decides it): faster "theta below
    -log(1 + m)", slower "above log(1 + m)", same both one-sided tests of equivalence
    (TOST, the larger p). 1.0 for an inconclusive word."""
    edge = math.log1p(margin)
    if word is Word.FASTER:
        p = estimate.p_below(-edge)
    elif word is Word.SLOWER:
        p = estimate.p_above(edge)
    elif word is Word.SAME:
        p = max(estimate.p_above(-edge), estimate.p_below(edge))
    else:
        return 1.0
    return min(1.0, 2.0 * p)


def benjamini_hochberg(p_values: Sequence[float], q: float = 0.05) -> list[bool]:
    """Which of `p_values` are discoveries at false discovery rate `q` (Benjamini and
    Hochberg 1995, by statsmodels' `multipletests`: the largest k with p_(k) <= k q / m,
    and every p at or below it)."""
    check_fraction(q, "q")
    p = np.asarray(p_values, dtype=np.float64)
    if p.size == 0:
        return []
    if not ((p >= 0) & (p <= 1)).all():
        raise ValueError(f"p_values: expected values in [0, 1]; got {float(p[(p < 0) | (p > 1)][0])!r}")
    # imported here: statsmodels loads scipy.stats (1.7 s), which the measuring path and
    # every worker process would otherwise pay before their first cell
    from statsmodels.stats.multitest import multipletests

    return [bool(r) for r in multipletests(p, q, method="fdr_bh")[0]]


@dataclass(frozen=True)
class Looks:
    """The rounds at which sampling checks whether a word is decided, and the level each
    check uses so that all of them together keep the error rate at `alpha`.

    Checks at `first`, then each at `growth` times the previous, up to `last`; the level
    of every check is 1 - alpha / K (Bonferroni over the K checks the schedule holds,
    whichever of them actually happen). With `sequential` False there is one check, at
    the end, at 1 - alpha.
    """

    first: int = 8
    """Rounds before the first check."""
    last: int = 200
    """The most rounds (the cap): the last check."""
    growth: float = 2.0
    """Each check after `growth` times the rounds of the one before."""
    alpha: float = ALPHA
    sequential: bool = True
    """False: one look, at the end (sampling runs to its budget)."""

    def __post_init__(self) -> None:
        if not isinstance(self.first, int) or self.first < 2:
            raise ValueError(f"Looks.first: expected an integer >= 2 rounds; got {self.first!r}")
        if not isinstance(self.last, int) or self.last < self.first:
            raise ValueError(f"Looks.last: expected an integer >= first ({self.first}); got "
                             f"{self.last!r}")
        if not (math.isfinite(self.growth) and self.growth > 1.0):
            raise ValueError(f"Looks.growth: expected a factor > 1; got {self.growth!r}")
        check_fraction(self.alpha, "Looks.alpha")

    @property
    def schedule(self) -> tuple[int, ...]:
        """The rounds of each check."""
        if not self.sequential:
            return (self.last,)
        rounds, at = [], self.first
        while at < self.last:
            rounds.append(at)
            at = max(at + 1, int(math.ceil(at * self.growth)))
        return (*rounds, self.last)

    @property
    def count(self) -> int:
        """K: how many checks the schedule holds."""
        return len(self.schedule)

    @property
    def confidence(self) -> float:
        """The level of every check's interval: 1 - alpha / K."""
        return 1.0 - self.alpha / self.count

    def due(self, rounds: int) -> bool:
        """Whether a check is due after `rounds` rounds."""
        return rounds in self.schedule


class ClaimWord(str, enum.Enum):
    """What the measured speed-up says about a claim's stated factor."""

    EXCEEDED = "exceeded"
    MET = "met"
    NOT_MET = "not met"
    INCONCLUSIVE = "inconclusive"


def claim_word(speedup_low: float, speedup_high: float, factor: float,
               tolerance: float = DEFAULT_TOLERANCE) -> ClaimWord:
    """The word for a claimed speed-up `factor` against the measured speed-up interval
    `[speedup_low, speedup_high]` (baseline time / variant time), with `tolerance`."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor: expected a finite speed-up > 0; got {factor!r}")
    floor = factor / (1.0 + tolerance)
    if speedup_low > factor * (1.0 + tolerance):
        return ClaimWord.EXCEEDED
    if speedup_low >= floor:
        return ClaimWord.MET
    if speedup_high < floor:
        return ClaimWord.NOT_MET
    return ClaimWord.INCONCLUSIVE
