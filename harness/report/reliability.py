"""How far a run's words can be trusted: its placebo and its many words at once.

Every run times, in each finding's headline cell, the baseline against a second copy of
itself: the placebo. Its true ratio is 1, so its word should be *same*; a placebo that
reads *faster* or *slower* says the machine moved more than the intervals allowed, and
the run is called noisy. A run also says many words at once: each decisive word is
checked against the others with the Benjamini-Hochberg procedure (false discovery rate
q = 5%), and what noise made of the run is measured: the placebos, and how many rows' processes
disagreed (`harness.combine`).

Pure functions of a run's summary rows (`placebo` and `pvalue` columns, written by
runs since the paired estimates); older runs give None.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness.measure.decision import benjamini_hochberg

#: the false discovery rate the run's decisive words are held to
FDR_Q = 0.05
#: the words that take a side
DECISIVE = ("faster", "slower", "same")


def _present(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column] if column in frame else pd.Series(index=frame.index, dtype=object)


def is_placebo(summary: pd.DataFrame) -> pd.Series:
    """Which rows are placebos (none in older runs)."""
    if "placebo" not in summary:
        return pd.Series(False, index=summary.index)
    return summary["placebo"].fillna(False).astype(bool)


def without_placebo(summary: pd.DataFrame) -> pd.DataFrame:
    """The rows of the findings' own variants."""
    return summary[~is_placebo(summary)]


def placebo_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The run's placebo rows that were timed (empty for older runs)."""
    rows = summary[is_placebo(summary)]
    return rows[_present(rows, "ratio").notna()]


def compared_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """Rows with a word against their baseline (paired runs), the placebos left out."""
    if summary.empty or "pvalue" not in summary:
        return summary.iloc[0:0]
    rows = summary[summary["pvalue"].notna() & summary["verdict"].isin(
        [*DECISIVE, "inconclusive"])]
    return without_placebo(rows)


@dataclass(frozen=True)
class Reliability:
    """What a run's placebos and words say about how far its words hold."""

    placebos: int
    """Placebo rows timed."""
    placebo_same: int
    """Of them, read *same* (as they should)."""
    placebo_decisive: tuple[str, ...]
    """'MY-rowsums slower 1.07 [1.06-1.09]' for each placebo that read faster or slower."""
    placebo_halfwidth: float | None
    """Median relative half-width of the placebos' intervals."""
    words: int
    """Rows with a word (the placebos left out)."""
    decisive: int
    """Of them, faster, slower or same."""
    kept: int
    """Decisive words that hold under Benjamini-Hochberg at FDR_Q over the run."""
    inconclusive: int

    @property
    def noisy(self) -> bool:
        """A placebo read faster or slower: the machine moved more than the intervals allow."""
        return bool(self.placebo_decisive)

    def placebo_line(self) -> str | None:
        """'noise floor: 12 placebos (baseline vs itself), 12 same, median interval +-1.9%',
        with NOISY and the placebos that took a side; None without placebos."""
        if not self.placebos:
            return None
        width = (f", median interval \u00b1{100 * self.placebo_halfwidth:.2g}%"
                 if self.placebo_halfwidth is not None else "")
        line = (f"noise floor: {self.placebos} placebo{'s' * (self.placebos != 1)} (the baseline "
                f"against a copy of itself), {self.placebo_same} same{width}")
        if self.noisy:
            line += ("; NOISY: " + "; ".join(self.placebo_decisive) + " (a placebo took a side: "
                     "the machine moved more than the intervals allow; measure again on a "
                     "quieter machine before acting on a close word)")
        return line

    def words_line(self) -> str | None:
        """'words: 180 decisive of 223, 43 inconclusive; 178 hold at a 5% false discovery
        rate (Benjamini-Hochberg over the run)'; None without words. What noise makes of
        a run is measured, not assumed: the placebo line, and how many rows' processes
        disagreed (`harness.combine`)."""
        if not self.words:
            return None
        return (f"words: {self.decisive} decisive of {self.words}, {self.inconclusive} "
                f"inconclusive; {self.kept} hold at a {100 * FDR_Q:.0f}% false discovery rate "
                f"(Benjamini-Hochberg over the run)")


def reliability(summary: pd.DataFrame) -> Reliability:
    """The `Reliability` of a run from its summary rows."""
    placebos = placebo_rows(summary)
    decisive_placebos = placebos[placebos["verdict"].isin(["faster", "slower"])] \
        if not placebos.empty else placebos
    compared = compared_rows(summary)
    decisive = compared[compared["verdict"].isin(DECISIVE)] if not compared.empty else compared
    kept = sum(benjamini_hochberg(compared["pvalue"].astype(float).tolist(), FDR_Q)) \
        if not compared.empty else 0
    width = None
    if not placebos.empty and "ci_halfwidth" in placebos:
        width = float(placebos["ci_halfwidth"].median())
    return Reliability(
        placebos=len(placebos), placebo_same=int((placebos["verdict"] == "same").sum())
        if not placebos.empty else 0,
        placebo_decisive=tuple(
            f"{r['finding']} {r['verdict']} {r['ratio']:.3g} [{r['ci_low']:.3g}-{r['ci_high']:.3g}]"
            for r in decisive_placebos.to_dict("records")),
        placebo_halfwidth=width, words=len(compared), decisive=len(decisive),
        kept=min(kept, len(decisive)), inconclusive=len(compared) - len(decisive))

