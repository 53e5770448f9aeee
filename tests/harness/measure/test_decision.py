"""harness.measure.decision: words with a margin, a claim's word, looks, and many words."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.measure.decision import (
    ClaimWord, Looks, Word, benjamini_hochberg, check_fraction, claim_word, decide, lean,
    rounds_to_decide, word_p_value,
)
from harness.measure.estimate import PairedEstimate, rounds_estimate


@pytest.mark.parametrize(("low", "high", "word"), [
    (0.80, 0.90, Word.FASTER),        # wholly below 1 / 1.05
    (1.06, 1.20, Word.SLOWER),        # wholly above 1.05
    (0.97, 1.04, Word.SAME),          # wholly within the margin
    (1 / 1.05, 1.05, Word.SAME),      # the edges belong to "same"
    (0.90, 1.01, Word.INCONCLUSIVE),  # faster or same: not decided
    (1.02, 1.08, Word.INCONCLUSIVE),  # the B4-DRL-03 case: 1.04x is no "slower" at 5%
    (0.50, 2.00, Word.INCONCLUSIVE),
])
def test_words_follow_the_interval_and_the_margin(low, high, word):
    assert decide(low, high, 0.05) is word
    assert word.decisive == (word is not Word.INCONCLUSIVE)


def test_a_wider_margin_turns_a_small_change_into_same():
    assert decide(1.06, 1.08, 0.05) is Word.SLOWER
    assert decide(1.06, 1.08, 0.10) is Word.SAME


def test_an_inconclusive_word_leans_where_its_estimate_lies():
    assert lean(1.04) is Word.SAME and lean(1.07) is Word.SLOWER and lean(0.9) is Word.FASTER


def test_rounds_to_decide_scales_with_the_square_of_the_half_width():
    estimate = PairedEstimate(log_ratio=math.log(1.10), se=0.04, df=1e6, rounds=20)
    half = estimate.quantile(0.95) * 0.04
    needed = math.log(1.10) - math.log(1.05)
    assert rounds_to_decide(estimate, 0.95) == math.ceil(20 * (half / needed) ** 2)
    decided = PairedEstimate(log_ratio=math.log(1.5), se=0.01, df=1e6, rounds=20)
    assert rounds_to_decide(decided, 0.95) == 20
    on_the_edge = PairedEstimate(log_ratio=math.log(1.05), se=0.01, df=1e6, rounds=20)
    assert rounds_to_decide(on_the_edge, 0.95) is None


@pytest.mark.parametrize("log_ratio", [math.log(0.9), math.log(0.955), math.log(1.0),
                                       math.log(1.047), math.log(1.06), math.log(1.2)])
@pytest.mark.parametrize("se", [0.005, 0.02])
def test_a_words_p_value_is_below_alpha_exactly_when_the_interval_decides_it(log_ratio, se):
    estimate = PairedEstimate(log_ratio=log_ratio, se=se, df=40, rounds=41)
    low, high = estimate.interval(0.95)
    word = decide(low, high)
    candidates = [Word.FASTER, Word.SLOWER, Word.SAME]
    decided = [w for w in candidates if word_p_value(estimate, w) < 0.05]
    assert decided == ([word] if word.decisive else [])
    assert word_p_value(estimate, Word.INCONCLUSIVE) == 1.0


def test_benjamini_hochberg_keeps_the_largest_passing_rank():
    # m = 5 at q = 0.05: thresholds 0.01, 0.02, 0.03, 0.04, 0.05
    assert benjamini_hochberg([0.001, 0.025, 0.029, 0.2, 0.9]) == [True, True, True, False, False]
    assert benjamini_hochberg([0.02, 0.03]) == [True, True]  # the 2nd passes, so both hold
    assert benjamini_hochberg([0.2, 0.5]) == [False, False]
    assert benjamini_hochberg([]) == []
    with pytest.raises(ValueError, match=r"p_values: expected values in \[0, 1\]; got 1.5"):
        benjamini_hochberg([0.1, 1.5])


def test_benjamini_hochberg_keeps_false_discoveries_near_q():
    """200 nulls among 800 real effects: the share of nulls among the kept stays <= q."""
    rng = np.random.default_rng(0)
    shares = []
    for _ in range(200):
        nulls = rng.random(200)
        effects = rng.beta(0.05, 8.0, 800)
        kept = benjamini_hochberg(np.concatenate([nulls, effects]).tolist(), 0.05)
        found = sum(kept)
        shares.append(sum(kept[:200]) / max(found, 1))
    assert np.mean(shares) <= 0.05


def test_looks_double_up_to_the_cap_and_split_alpha_over_them():
    looks = Looks(first=8, last=200)
    assert looks.schedule == (8, 16, 32, 64, 128, 200)
    assert looks.confidence == pytest.approx(1 - 0.05 / 6)
    assert looks.due(32) and not looks.due(33)
    assert Looks(first=8, last=200, sequential=False).schedule == (200,)
    assert Looks(first=8, last=200, sequential=False).confidence == pytest.approx(0.95)


def _sequential_errors(confidence_of, trials: int = 1500, seed: int = 1) -> float:
    """How often sampling that stops at its first decided look ends decisive on a ratio
    that sits exactly on the margin's edge (where any decisive word is an error)."""
    looks = Looks(first=8, last=200)
    rng = np.random.default_rng(seed)
    errors = 0
    for _ in range(trials):
        d = rng.normal(math.log(1.05), 0.05, looks.last)
        base = np.full(looks.last, 1e-3)
        for count, at in enumerate(looks.schedule, 1):
            estimate = rounds_estimate(base[:at] * np.exp(d[:at]), base[:at])
            if decide(*estimate.interval(confidence_of(looks, count))).decisive:
                errors += 1
                break
    return errors / trials


def test_the_looks_correction_keeps_errors_at_alpha_where_naive_looks_inflate_them():
    corrected = _sequential_errors(lambda looks, count: looks.confidence)
    naive = _sequential_errors(lambda looks, count: 0.95)
    assert corrected <= 0.05
    assert naive > 1.5 * corrected


@pytest.mark.parametrize(("low", "high", "word"), [
    (5.5, 7.0, ClaimWord.EXCEEDED),     # above 4 x 1.25
    (3.3, 9.0, ClaimWord.MET),          # at or above 4 / 1.25 = 3.2
    (1.5, 3.0, ClaimWord.NOT_MET),      # below 3.2
    (2.5, 4.5, ClaimWord.INCONCLUSIVE),
])
def test_a_claims_factor_gets_its_own_word(low, high, word):
    assert claim_word(low, high, 4.0, 0.25) is word


def test_claim_word_rejects_a_factor_that_is_not_a_speed_up():
    with pytest.raises(ValueError, match=r"factor: expected a finite speed-up > 0; got inf"):
        claim_word(1.0, 2.0, float("inf"))


@pytest.mark.parametrize("value", [0, 1, -0.1, 1.5, float("nan"), float("inf"), True, "0.05"])
def test_check_fraction_names_the_field(value):
    with pytest.raises(ValueError, match=r"--margin: expected a fraction in \(0, 1\)"):
        check_fraction(value, "--margin")
    assert check_fraction(0.05, "--margin") == 0.05
