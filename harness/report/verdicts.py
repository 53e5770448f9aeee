"""Verdict sentences: one summary row (plus the ticket's claimed factor) -> plain English.

Pure functions of the numbers already in a run's summary rows; nothing here measures.
A row's `verdict` is one of `harness.measure.stats.Verdict`; `ratio` is variant / baseline time,
so the speed-up is `1 / ratio` and its interval `[1 / ci_high, 1 / ci_low]`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from harness.measure.stats import Verdict
from harness.report.summary import format_seconds

#: how a case parameter reads in a sentence: `num_envs=4` -> "4 envs"
PARAM_WORDS = {"num_envs": "envs", "max_steps": "steps"}


def present(value) -> bool:
    """True for a real number or string; False for None and NaN (a missing cell)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def format_param(value) -> str:
    """4.0 -> '4' (params come back as floats when another finding lacks them)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def case_phrase(row: Mapping) -> str:
    """'4 envs x 25 steps (dones=episode)' from a row's `p_<param>` cells."""
    sized, other = [], []
    for key, value in row.items():
        if not (isinstance(key, str) and key.startswith("p_") and present(value)):
            continue
        name = key[2:]
        if name in PARAM_WORDS:
            sized.append(f"{format_param(value)} {PARAM_WORDS[name]}")
        else:
            other.append(f"{name}={format_param(value)}")
    text = " x ".join(sized)
    if other:
        text = f"{text} ({', '.join(other)})" if text else ", ".join(other)
    return text or str(row.get("case", "the only case"))


def level_label(levels) -> str:
    """How every page, table and figure names the level of the intervals it shows: '95%',
    or '95-99.3%' where rows looked more than once while sampling (their `ci_level`);
    95% where no row says."""
    found = sorted({round(100 * float(v), 1) for v in levels if present(v)}) or [95.0]
    low, high = f"{found[0]:g}", f"{found[-1]:g}"
    return f"{low}%" if low == high else f"{low}-{high}%"


def _interval(low: float, high: float, level=None) -> str:
    """'95% CI 0.95-1.02', or '99.2% CI ...' where sampling looked more than once."""
    return f"{level_label([level])} CI {low:.3g}-{high:.3g}"


def _margin(row: Mapping) -> str:
    """'+-5%': the row's margin in words."""
    margin = row.get("margin")
    return f"\u00b1{100 * margin:.2g}%" if present(margin) else "the margin"


def _claim_note(factor: float | None, low: float, high: float, row: Mapping | None = None) -> str:
    """'; the ticket estimated ~4x: exceeded (tolerance 25%)' from the row's claim word, or
    for older runs where the speed-up interval lies against the factor."""
    if factor is None:
        return ""
    if row is not None and present(row.get("claim_word")):
        tolerance = row.get("claim_tolerance")
        told = f" (tolerance {100 * tolerance:.0f}%)" if present(tolerance) else ""
        return f"; the ticket estimated ~{factor:g}x: {row['claim_word']}{told}"
    if low > factor:
        where = "the measured interval is above it"
    elif high < factor:
        where = "the measured interval is below it"
    else:
        where = "the measured interval contains it"
    return f"; the ticket estimated ~{factor:g}x ({where})"


def _require(row: Mapping, *fields: str) -> None:
    for name in fields:
        if not present(row.get(name)):
            raise ValueError(
                f"verdict_sentence: field {name!r}: expected a number for verdict "
                f"{row.get('verdict')!r}; got {row.get(name)!r}"
            )


def verdict_sentence(row: Mapping, *, against: str, claim: float | None = None) -> str:
    """One sentence saying what `row` (a summary row) shows against the baseline `against`.

    `claim` is the speed-up the ticket estimated (e.g. 4.0 for "~4x"), quoted next to a
    measured speed-up. Raises ValueError naming the field when `verdict` is unknown or a
    number the verdict needs is missing.
    """
    variant, where = row.get("variant", "?"), case_phrase(row)
    raw = row.get("verdict") if present(row.get("verdict")) else row.get("status")
    try:
        verdict = Verdict(raw)
    except ValueError:
        raise ValueError(
            f"verdict_sentence: field 'verdict': expected one of "
            f"{', '.join(v.value for v in Verdict)}; got {raw!r}"
        ) from None
    if verdict is Verdict.BASELINE:
        _require(row, "median_s")
        return f"{variant} is the baseline: {format_seconds(row['median_s'])} per call at {where}."
    if verdict in (Verdict.FASTER, Verdict.SLOWER, Verdict.SAME, Verdict.INCONCLUSIVE,
                   Verdict.WITHIN_FACTOR, Verdict.NO_DIFFERENCE):
        _require(row, "ratio", "ci_low", "ci_high")
        ratio, low, high = row["ratio"], row["ci_low"], row["ci_high"]
        speed_low, speed_high = 1.0 / high, 1.0 / low
        interval = _interval(low, high, row.get("ci_level"))
        older = ("" if row.get("interval") == "paired"
                 else " (interval from unpaired samples, older run)")
        claim_note = _claim_note(claim, speed_low, speed_high, row)
        if verdict is Verdict.NO_DIFFERENCE:
            return (f"No measurable difference between {variant} and {against} at {where}: "
                    f"time ratio {ratio:.3g} ({interval} contains 1){older}{claim_note}.")
        margin = _margin(row)
        if verdict is Verdict.SAME:
            return (f"{variant} takes the same time as {against} at {where}: time ratio "
                    f"{ratio:.3g} ({interval} lies within {margin}){claim_note}.")
        if verdict is Verdict.INCONCLUSIVE:
            text = (f"Inconclusive between {variant} and {against} at {where}: time ratio "
                    f"{ratio:.3g} ({interval} reaches across a {margin} edge)")
            if present(row.get("lean")):
                text += f"; it leans {row['lean']}"
            if present(row.get("rounds_to_decide")):
                text += f", and about {row['rounds_to_decide']:,.0f} rounds would decide it"
            elif present(row.get("lean")):
                text += ", and sits on the edge: no number of rounds would decide it"
            return text + claim_note + "."
        faster = ratio < 1.0
        factor, f_low, f_high = (1.0 / ratio, speed_low, speed_high) if faster else (ratio, low, high)
        direction = "faster" if faster else "slower"
        text = (f"{variant} is {factor:.3g}x ({_interval(f_low, f_high, row.get('ci_level'))}) "
                f"{direction} than {against} at {where}")
        if verdict is Verdict.WITHIN_FACTOR:
            text += ": measurable, but below the factor that counts"
        return text + older + (claim_note if faster else "") + "."
    if verdict is Verdict.FAILED:
        return f"{variant} failed at {where}: {row.get('error') or 'no error recorded'}."
    if verdict is Verdict.MISMATCH:
        detail = row.get("reason") if present(row.get("reason")) else "wrong output"
        return f"{variant} disagrees with the reference at {where} ({detail}), so it was not timed."
    if verdict is Verdict.NEEDS_CUDA:
        return f"{variant} needs CUDA; this run had no GPU, so it was not measured at {where}."
    detail = row.get("reason") if present(row.get("reason")) else "no reason recorded"
    return f"{variant} was not timed at {where}: {detail}."
