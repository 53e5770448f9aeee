"""Short markdown summaries for CI (`python -m harness.report --markdown`).

One table row per finding, from the same `Headline`s (a run) or `CompareHeadline`s (two
runs) as the HTML page's summary table, so that the two cannot disagree; then the run's
metadata in a line and a link to the HTML report.
"""

from __future__ import annotations

from harness.measure.decision import DEFAULT_MARGIN
from harness.report import attribution
from harness.report.compare import (
    check_comparable, compare_headlines, compare_runs,
)
from harness.report.headline import COUNTERS as HEADLINE_COUNTERS
from harness.report.data import metadata_line, run_headlines, run_sampling_line, status_banner
from harness.report.reliability import reliability
from harness.results import Run


def cell(text: str) -> str:
    """Escape what would break a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def run_markdown(run: Run, link: str) -> str:
    """A run's summary: one row per finding (claim, headline case, verdict with the ratio
    and its interval, counters that changed, with their lines where the run recorded
    them), the metadata line, the report's link."""
    lines = [f"### esper-bench run {run.run_id}", ""]
    banner = status_banner(run.metadata)
    if banner:
        lines += [f"> **Run not complete.** {banner}", ""]
    recorded = attribution.run_sources(run)
    rows = [(h.finding, h.claim, h.where + (f" ({h.coverage_text()})" if h.coverage_text() else ""),
             h.verdict_text(), _counters_text(run, h, recorded)) for h in run_headlines(run)]
    lines += _table(("finding", "claim", "headline case", "verdict (interval)",
                     "counters that changed"), rows) if rows else ["This run holds no rows."]
    trust = reliability(run.summary)
    notes = [run_sampling_line(run), trust.placebo_line(), trust.words_line()]
    lines += ["", metadata_line(run.metadata)]
    for note in filter(None, notes):
        lines += ["", note]
    lines += ["", f"HTML report: [{link}]({link})"]
    return "\n".join(lines)


def _counters_text(run: Run, head, recorded: dict) -> str:
    """The headline's counters that differ from the baseline's, with the ops and lines
    behind them where the run recorded them (`harness.run --sources`)."""
    rows = {r["variant"]: r for r in run.summary.to_dict("records")
            if r["finding"] == head.finding and r["case"] == head.case}
    if head.variant in rows and head.baseline in rows:
        text = attribution.words(rows[head.baseline], rows[head.variant],
                                 recorded.get((head.finding, head.case, head.baseline)),
                                 recorded.get((head.finding, head.case, head.variant)),
                                 HEADLINE_COUNTERS)
        if text:
            return text
    return head.counters_text()


def compare_markdown(new: Run, old: Run, link: str, *, margin: float = DEFAULT_MARGIN,
                     force: bool = False) -> str:
    """Two runs' summary: per finding, its headline variant new against old with the
    interval, how many of its rows changed, and the counters that changed."""
    table = compare_runs(new, old, margin=margin, force=force)
    rows = [(h.finding, h.where, h.ratio_text(), h.changes_text(), h.counters_text())
            for h in compare_headlines(new, old, table)]
    lines = [f"### esper-bench {new.run_id} (new) vs {old.run_id} (old)", ""]
    for note in check_comparable(new, old, force):
        lines += [f"> {note}", ""]
    for label, run in (("new", new), ("old", old)):
        banner = status_banner(run.metadata)
        if banner:
            lines += [f"> **The {label} run is not complete.** {banner}", ""]
    lines += _table(("finding", "headline case", f"headline variant, ratio to the reference new / old (95% CI; "
                     f"margin {margin:.0%})", "rows changed", "counters that changed"),
                    rows)
    lines += ["", f"new: {metadata_line(new.metadata)}", "",
              f"old: {metadata_line(old.metadata)}", "", f"HTML report: [{link}]({link})"]
    return "\n".join(lines)
