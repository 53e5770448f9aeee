"""Every number a report prints is checked for sense before it is printed.

A floor that a call beats is no floor; a word that its own interval contradicts, a
"faster" ratio above 1 or a NaN where a number is shown are bugs of the harness, never
facts about the code measured. `problems` lists what is wrong in a run's summary rows; the
report and the findings modules' tools refuse to print a run that has any (`harness.exits.Nonsense`:
exit 3, an internal error, with each problem named).
"""

from __future__ import annotations

import math

import pandas as pd

from harness.measure.decision import decide
from harness.report.verdicts import present

#: the words whose interval decides them (runs since paired estimates)
_WORDS = ("faster", "slower", "same", "inconclusive")


def _where(row: dict) -> str:
    return f"{row.get('finding')} {row.get('case')} {row.get('variant')}"


def row_problems(row: dict) -> list[str]:
    """What makes no sense in one summary row (empty when nothing)."""
    found = []
    timed = row.get("status") == "ok"
    median = row.get("median_s")
    if timed and not (present(median) and math.isfinite(median) and median > 0):
        found.append(f"{_where(row)}: timed, but its median time is {median!r}")
    ratio, low, high = row.get("ratio"), row.get("ci_low"), row.get("ci_high")
    verdict = row.get("verdict")
    if present(ratio):
        if not all(present(v) and math.isfinite(v) and v > 0 for v in (ratio, low, high)):
            found.append(f"{_where(row)}: ratio {ratio!r} with interval [{low!r}, {high!r}]")
        elif not low <= ratio <= high:
            found.append(f"{_where(row)}: ratio {ratio:.4g} outside its own interval "
                         f"[{low:.4g}, {high:.4g}]")
        elif verdict == "faster" and ratio >= 1:
            found.append(f"{_where(row)}: 'faster' at a time ratio of {ratio:.4g} (above 1)")
        elif verdict == "slower" and ratio <= 1:
            found.append(f"{_where(row)}: 'slower' at a time ratio of {ratio:.4g} (below 1)")
        elif verdict in _WORDS and row.get("interval") == "paired" and present(row.get("margin")):
            said = decide(low, high, row["margin"]).value
            if said != verdict:
                found.append(f"{_where(row)}: the word {verdict!r} against its own interval "
                             f"[{low:.4g}, {high:.4g}], which says {said!r}")
    floor = row.get("floor_s")
    if timed and present(floor) and present(median) and median < floor:
        found.append(f"{_where(row)}: {median:.3g} s per call, faster than its floor of "
                     f"{floor:.3g} s (the floor's bandwidth is no bound for this call)")
    return found


def problems(summary: pd.DataFrame) -> list[str]:
    """What makes no sense in a run's summary rows, row by row."""
    if summary.empty:
        return []
    rows = summary.astype(object).where(summary.notna(), None).to_dict("records")
    return [problem for row in rows for problem in row_problems(row)]
