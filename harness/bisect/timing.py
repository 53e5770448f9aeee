"""Bisecting on time: each commit timed against the good commit, paired, with a margin.

A commit is timed against the good commit by the gate's paired A/B check
(`harness.gate.ab`: worker processes that import both trees and time them in alternation,
a sign-test 95% interval over the sessions) with `threshold` = the margin. The bad commit
defines the change: the cells whose interval lies wholly beyond the margin, and on which
side (slower or faster). Another commit is then

- BAD when one of those cells is beyond the margin on the same side,
- GOOD when every one of them lies wholly within the margin ([1/(1+m), 1+m]),
- inconclusive otherwise: measured once more, the sessions of both measurements pooled
  into one interval; still inconclusive, it is UNDECIDED and the search stops there;
- SKIP when it cannot be timed (the findings are missing or do not import there).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.bisect.search import Decision
from harness.exits import UsageError
from harness.gate import ab as gate_ab
from harness.gate.table import GateRow, Outcome

Key = tuple[str, str, str]
#: the outcomes of the A/B check that are a change beyond the margin
CHANGED = (Outcome.REGRESSION, Outcome.IMPROVED)


def sessions_against(good_tree: Path, tree: Path, options: gate_ab.ABOptions,
                     progress: Callable[[str], None]) -> list[dict] | str:
    """`options.sessions` A/B sessions of `tree` against `good_tree`, or why the trees
    cannot be timed (a worker failed: the findings do not import there)."""
    try:
        return gate_ab.run_sessions(tree, good_tree, options, progress)
    except UsageError as err:  # run_sessions' only one: a worker that failed on the trees
        return str(err).removeprefix("--against: ")


def rows_by_cell(rows: list[GateRow]) -> dict[Key, GateRow]:
    return {(r.finding, r.case, r.variant): r for r in rows}


def change_of(rows: list[GateRow]) -> dict[Key, Outcome]:
    """The cells the bad commit changed beyond the margin, with the side (REGRESSION:
    slower, IMPROVED: faster)."""
    return {key: row.outcome for key, row in rows_by_cell(rows).items() if row.outcome in CHANGED}


def time_decision(rows: list[GateRow], change: dict[Key, Outcome], margin: float
                  ) -> tuple[Decision, str]:
    """A commit's A/B rows against the good commit, held to the bad commit's `change`
    (module docstring); UNDECIDED stands for one inconclusive measurement here."""
    by_cell = rows_by_cell(rows)
    inconclusive = []
    for key, side in change.items():
        row = by_cell.get(key)
        if row is None or row.ci is None:
            why = "not timed" if row is None else f"{row.outcome.value}: {row.note}"
            return Decision.SKIP, f"{key[0]} {key[2]} [{key[1]}]: {why}"
        if row.outcome is side:
            return Decision.BAD, f"{key[0]} {key[2]} [{key[1]}]: {row.change}"
        if not (row.ci.low >= 1.0 / (1.0 + margin) and row.ci.high <= 1.0 + margin):
            inconclusive.append(f"{key[0]} {key[2]} [{key[1]}] {row.change}")
    if inconclusive:
        return Decision.UNDECIDED, "inconclusive: " + "; ".join(inconclusive)
    return Decision.GOOD, "within the margin"
