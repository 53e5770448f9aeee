"""The lines behind a counter change, from runs recorded with `harness.run --sources`.

Such a run's cell journal holds, per profiled variant, its counters split by the line of
the project's code and the op (`harness.measure.sources`). Between two runs (`--compare`)
or between a finding's baseline and its headline variant in one run (`--markdown`), a
counter that changed is then worded with the ops that appeared or disappeared and their
lines: `host syncs 0 -> 4: +4 aten::item at mylib/buffer.py:212 in add()`. Runs recorded
without `--sources` give None, and the callers keep their counts-only text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from harness import explain
from harness.measure.numbers import is_real
from harness.measure.sources import Sources
from harness.results import Run, RunFileError, read_cells

Key = tuple[str, str, str]
"""(finding, case label, variant)."""


def run_sources(run: Run) -> dict[Key, Sources]:
    """Every recorded attribution of `run` (none for a run without `--sources`; a variant
    whose attribution failed is left out)."""
    out: dict[Key, Sources] = {}
    try:
        cells = read_cells(run.folder)
    except RunFileError:  # the report already read these cells; a race is not worth a crash
        return out
    for cell in cells:
        for variant, raw in (cell.get("sources") or {}).items():
            if isinstance(raw, list):
                out[(cell["finding"], cell["case"], variant)] = Sources.from_json(raw)
    return out


def _counts(row: Mapping, counters: Iterable[str]) -> dict[str, int]:
    """The `counters` a summary row has (numbers, not NaN)."""
    out = {}
    for name in counters:
        value = row.get(name)
        if is_real(value):
            out[name] = int(value)
    return out


def words(before_row: Mapping, after_row: Mapping, before: Sources | None,
          after: Sources | None, counters: Iterable[str]) -> str | None:
    """Each of `counters` that differs between two summary rows, with the ops and lines
    that differ between their attributions; None where either has none, or none differs."""
    if before is None or after is None:
        return None
    text = explain.between(_counts(before_row, counters), _counts(after_row, counters),
                           before, after)
    return text or None


def missing_sources_note(new: Run, old: Run) -> str | None:
    """A sentence for a compare page when only one of the two runs recorded the lines
    behind its counters (`harness.run --sources`): its counter changes are then shown
    without their lines, and the page says why. None when both or neither did."""
    recorded = {label: bool(run_sources(run)) for label, run in (("new", new), ("old", old))}
    if len(set(recorded.values())) == 1:
        return None
    label = next(label for label, has in recorded.items() if not has)
    run = new if label == "new" else old
    return (f"The {label} run ({run.run_id}) was recorded without --sources: counter changes "
            "are shown without the ops and lines behind them. Record both runs with "
            "`python -m harness.run --sources` to see them.")
