"""Rows of the CI gate and their markdown table.

Every check (counters, invariants, A/B) turns what it measured into `GateRow`s: the
outcome is an enum and the numbers behind a timing verdict are kept as data
(`ci`, `threshold`); the text columns are only for people. `render_markdown` lays the
rows out in one table: check, finding, variant, case, baseline, current, change, verdict.
`UsageError` (harness.exits) is the one kind of error the gate reports without a
traceback (exit 2).
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from harness.exits import UsageError  # noqa: F401 (re-exported: the gate's error, exit 2)
from harness.measure.stats import RatioCI


class Outcome(str, enum.Enum):
    """What one gate row says. REGRESSION and ERROR fail the gate (exit 1); so does NEW,
    a cell the baseline lacks (exit 2 when nothing else fails: the baseline is incomplete)."""

    PASS = "pass"
    """Counts equal (within the stated tolerance), or the ratio is on the good side."""
    REGRESSION = "regression"
    """More ops/allocations/syncs than the baseline, an invariant broken, or slower than REV."""
    IMPROVED = "improved"
    """Fewer counts than the baseline, or faster than REV beyond the threshold."""
    INCONCLUSIVE = "inconclusive"
    """Invariant: the interval straddles the threshold; not a failure."""
    NEW = "new"
    """Measured now but absent from the baseline: fails (`--update-baseline` adds it)."""
    NEW_ALLOWED = "new (allowed)"
    """NEW under `--allow-new`, beside cells that were compared: passes."""
    MISSING = "missing"
    """In the baseline but not measured on this machine (e.g. a method not in METHODS)."""
    SKIPPED = "skipped"
    """Not run here; the note says why."""
    NOT_COMPARABLE = "not comparable"
    """A/B: the other revision cannot run this cell."""
    ERROR = "error"
    """The variant raised on the current code."""

    @property
    def fails(self) -> bool:
        """Whether this outcome fails the gate."""
        return self in (Outcome.REGRESSION, Outcome.ERROR, Outcome.NEW)


@dataclasses.dataclass(frozen=True)
class GateRow:
    """One line of the gate's table."""

    check: str
    """`counters`, `invariant <id>` or `A/B vs <rev>`."""
    finding: str
    variant: str
    case: str
    baseline: str
    """What the current value is compared with: baseline counts, a threshold, REV's time."""
    current: str
    change: str
    outcome: Outcome
    note: str = ""
    """Why a row is skipped/new/missing, or the error; rendered after the outcome."""
    ci: RatioCI | None = None
    """Timing checks: the ratio and its 95% interval behind the outcome."""
    threshold: float | None = None
    """Timing checks: the bound the interval was held against."""
    not_compared: tuple[str, ...] = ()
    """Counters: the counters of this cell not compared with the baseline (recorded on
    other CPU kernel paths only); the note says why."""


COLUMNS = ("check", "finding", "variant", "case", "baseline", "current", "change", "verdict")


def _cell(text: str) -> str:
    """Escape what would break a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(rows: Iterable[GateRow]) -> str:
    """The rows as one markdown table, in the order given."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        verdict = row.outcome.value + (f": {row.note}" if row.note else "")
        cells = (row.check, row.finding, row.variant, row.case, row.baseline, row.current,
                 row.change, verdict)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


SCHEMA_VERSION = 1


def rows_document(rows: Iterable[GateRow], notes: Iterable[str] = ()) -> dict:
    """The rows as versioned JSON-ready data (outcome as its value, the interval as numbers),
    with the notes printed after the table."""
    out = []
    for row in rows:
        data = dataclasses.asdict(row)
        data["outcome"] = row.outcome.value
        data["fails"] = row.outcome.fails
        out.append(data)
    return {"schema_version": SCHEMA_VERSION, "rows": out, "notes": list(notes)}


def summary_line(rows: Iterable[GateRow]) -> str:
    """`FAIL: 1 regression, 40 pass, 2 skipped`: failing outcomes first, then enum order."""
    counts = Counter(row.outcome for row in rows)
    failed = any(outcome.fails for outcome in counts)
    order = sorted(Outcome, key=lambda o: not o.fails)  # stable: enum order within each group
    parts = [f"{counts[o]} {o.value}" for o in order if counts[o]]
    return ("FAIL: " if failed else "PASS: ") + (", ".join(parts) or "no rows")


#: the environment variable through which GitHub Actions names a job's summary file
STEP_SUMMARY_VARIABLE = "GITHUB_STEP_SUMMARY"


def step_summary_path() -> Path | None:
    """The file $GITHUB_STEP_SUMMARY names, or None when it is unset or empty."""
    value = os.environ.get(STEP_SUMMARY_VARIABLE, "")
    return Path(value) if value else None


def append_step_summary(rows: list[GateRow], path: Path, notes: Iterable[str] = ()) -> None:
    """Append the gate's table, its notes and its summary line to `path` (a job summary:
    markdown that GitHub shows on the run's page), keeping what earlier steps wrote there."""
    said = "".join(f"- {note}\n" for note in notes)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"### harness.gate\n\n{render_markdown(rows)}\n\n"
                     f"{said + chr(10) if said else ''}{summary_line(rows)}\n\n")
