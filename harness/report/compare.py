"""Run vs run: per finding x case x variant, how its speed against its reference moved.

Each run words its rows as ratios: a variant's time over its reference's (the finding's
baseline), measured in the same rounds of the same processes, so that whatever pace the
machine kept during that run (another job, a slower core) falls on both and cancels. Two
runs are compared through those ratios, never their samples pooled and never their
absolute times: the new run's ratio over the old run's, with the standard error of each
(`log_se`: its rounds and the spread of its own fresh processes, measured in that run),
so the run-to-run noise is what the two runs measured, not a constant. The word is the
run's own (`harness.measure.decision.Word`, `--margin` 0.05: 5%): faster, slower, same or
inconclusive. The reference rows themselves have no ratio: their time is not compared
(it moves with the machine's pace between runs), and a change to the reference's code
shows as every other variant's ratio moving the other way. Runs measured on machines
whose fingerprints differ are refused unless forced: their ratios say more about the
machines than the code; so are runs whose CPU kernel paths differ
(`harness.measure.machine.kernel_path`), which may be one machine.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import pandas as pd

from harness.measure.decision import DEFAULT_MARGIN, Word, decide
from harness.measure.estimate import PairedEstimate
from harness.measure.machine import (
    KERNEL_FIELDS, fingerprint_changes, records_kernel_path,
)
from harness.report import attribution
from harness.report.data import ReportError, finding_headline
from harness.report.headline import COUNTERS as HEADLINE_COUNTERS, CounterChange, counter_changes
from harness.results import Run
from harness.measure.stats import Verdict
from harness.report.verdicts import case_phrase, present

KEY = ["finding", "case", "variant"]
COLUMNS = [*KEY, "where", "old_status", "new_status", "old_median_s", "new_median_s", "ratio",
           "ci_low", "ci_high", "change", "note"]
_BROKEN = {Verdict.FAILED.value, Verdict.MISMATCH.value}


class Change(str, enum.Enum):
    """What happened to one finding x case x variant between the old and the new run."""

    FASTER = "faster"
    """The whole interval of new / old lies below 1 / (1 + margin): against its reference,
    the variant takes less time in the new run."""
    SLOWER = "slower"
    """The whole interval lies above 1 + margin: the new run takes more time."""
    SAME = "same"
    """The whole interval lies within the margin either way."""
    INCONCLUSIVE = "inconclusive"
    """Neither: the runs cannot tell."""
    NEW_FAILURE = "new_failure"
    """Failed or mismatched in the new run, not in the old one."""
    FIXED = "fixed"
    """Failed or mismatched in the old run, not in the new one."""
    NOT_COMPARABLE = "not_comparable"
    """Missing from one run, or not timed in one of them."""


_FROM_WORD = {Word.FASTER: Change.FASTER, Word.SLOWER: Change.SLOWER,
              Word.SAME: Change.SAME, Word.INCONCLUSIVE: Change.INCONCLUSIVE}


def check_comparable(new: Run, old: Run, force: bool) -> list[str]:
    """What keeps two runs from being comparable, each a sentence for the page: the
    machines or the CPU kernel paths they differ in (a ReportError naming the fields,
    unless `force`), a run that did not record its kernel path (never refused), and a run
    that did not record the lines behind its counters where the other did."""
    changes = fingerprint_changes(old.metadata, new.metadata)
    machine = [f"{k}: old {a!r}, new {b!r}" for k, a, b in changes if k not in KERNEL_FIELDS]
    kernels = [f"{k}: old {a!r}, new {b!r}" for k, a, b in changes if k in KERNEL_FIELDS]
    if machine and not force:
        raise ReportError(
            f"runs {old.run_id} and {new.run_id} were measured on different machines "
            f"({'; '.join(machine)}); their times are not comparable. "
            "Pass --force to compare them anyway.")
    if kernels and not force:
        raise ReportError(
            f"runs {old.run_id} and {new.run_id} ran different CPU kernels "
            f"({'; '.join(kernels)}); this may be the same machine (ATEN_CPU_CAPABILITY, "
            "ONEDNN_MAX_CPU_ISA and the thread count choose the kernels), and a difference "
            "of kernels would read as a change of the code: their times are not comparable. "
            + ("A run not given --threads times at fewer threads beside busy processes: "
               "rerun one with the other's --threads N. "
               if any(k == "threads" for k, _, _ in changes) else "")
            + "Pass --force to compare them anyway.")
    notes = []
    if machine:
        notes.append(f"Compared with --force across different machines: {'; '.join(machine)}. "
                     "Differences in time may come from the machines, not the code.")
    if kernels:
        notes.append(f"Compared with --force across different CPU kernels: "
                     f"{'; '.join(kernels)} (this may be the same machine). Differences in "
                     "time may come from the kernels, not the code.")
    for label, run in (("new", new), ("old", old)):
        if not records_kernel_path(run.metadata):
            notes.append(f"The {label} run ({run.run_id}) did not record its CPU kernel path "
                         "(it predates that record): a difference of kernels between the "
                         "runs cannot be ruled out.")
    notes += filter(None, [attribution.missing_sources_note(new, old)])
    return notes


def _change(old_status: str | None, new_status: str | None, word: Word | None) -> Change:
    """A status change wins over timing; `word` is None where there is no ratio."""
    if new_status in _BROKEN and old_status not in _BROKEN:
        return Change.NEW_FAILURE
    if old_status in _BROKEN and new_status not in _BROKEN and new_status is not None:
        return Change.FIXED
    return Change.NOT_COMPARABLE if word is None else _FROM_WORD[word]


def _why_not_compared(new: dict, old: dict) -> str:
    """Why `ratio_difference` found nothing to compare in a row both runs have."""
    runs = (("the new run", new), ("the old run", old))
    missing = [label for label, row in runs if not present(row.get("ratio"))]
    if missing:
        return (f"no ratio in {' and '.join(missing)} (the reference's own time is not "
                "compared: it moves with the machine's pace between runs)")
    if new.get("compared_to") != old.get("compared_to"):
        return (f"compared to {old.get('compared_to')} in the old run, "
                f"{new.get('compared_to')} in the new")
    older = [label for label, row in runs if not present(row.get("log_se"))]
    return (f"{' and '.join(older)} recorded no standard error of its ratio (a run of an "
            "older schema)")


def ratio_difference(new: dict, old: dict) -> PairedEstimate | None:
    """log(new run's ratio / old run's ratio) of one row (summary rows of each run, with
    `ratio`, `log_se` and `df`), the variance the sum of the two runs' own; None where a
    run has no ratio with a standard error, or the two compare against different
    references (`compared_to`)."""
    if not all(present(row.get(k)) and row[k] > 0 for row in (new, old)
               for k in ("ratio", "log_se")):
        return None
    if new.get("compared_to") != old.get("compared_to"):
        return None
    variance = new["log_se"] ** 2 + old["log_se"] ** 2
    carried = sum(row["log_se"] ** 4 / row["df"] for row in (new, old)
                  if present(row.get("df")) and row["df"] > 0)
    df = min(variance ** 2 / carried, 1e6) if carried > 0 else 1e6  # Welch-Satterthwaite
    return PairedEstimate(math.log(new["ratio"] / old["ratio"]), math.sqrt(variance), df,
                          rounds=int(new.get("n") or 0) + int(old.get("n") or 0),
                          processes=int(new.get("processes") or 1) + int(old.get("processes") or 1))


def cell_device(row: dict, run: Run) -> str | None:
    """The device a cell was measured on: its row's own `device_name` (a sharded run's
    cells carry the rank's), else its run's."""
    return row.get("device_name") if present(row.get("device_name")) else run.metadata.get("device_name")


def compare_runs(new: Run, old: Run, *, margin: float = DEFAULT_MARGIN,
                 force: bool = False) -> pd.DataFrame:
    """One row per finding x case x variant found in either run's summary.

    Columns: finding, case, variant, where (the case in words), old_status, new_status,
    old_median_s, new_median_s, ratio (the new run's ratio to the reference over the old
    run's, module docstring), ci_low, ci_high (95%), change (a `Change` value), note; in
    the new run's order, then what only the old run has. A cell measured on another
    device in one run than in the other (runs sharded over a mixed cluster) is not
    compared unless `force`: its change is not_comparable and the note names both.
    """
    if not (math.isfinite(margin) and margin > 0.0):
        raise ReportError(f"--margin: expected a finite fraction > 0, e.g. 0.05; got {margin!r}")
    old_summary = {tuple(r[k] for k in KEY): r for r in old.summary.to_dict("records")}
    new_summary = {tuple(r[k] for k in KEY): r for r in new.summary.to_dict("records")}
    out = []
    for key in dict.fromkeys([*new_summary, *old_summary]):
        o, n = old_summary.get(key, {}), new_summary.get(key, {})
        row = {**dict(zip(KEY, key)), "where": case_phrase(n or o),
               "old_status": o.get("status"), "new_status": n.get("status"),
               "old_median_s": o.get("median_s"), "new_median_s": n.get("median_s"),
               "ratio": None, "ci_low": None, "ci_high": None, "note": ""}
        word = None
        devices = (cell_device(o, old), cell_device(n, new)) if o and n else (None, None)
        if devices[0] != devices[1] and not force:
            row["note"] = (f"measured on different devices (old {devices[0]!r}, new "
                           f"{devices[1]!r}); --force compares them anyway")
        elif o and n:
            estimate = ratio_difference(n, o)
            if estimate is None:
                row["note"] = _why_not_compared(n, o)
            else:
                low, high = estimate.interval(0.95)
                row.update(ratio=estimate.ratio, ci_low=low, ci_high=high)
                word = decide(low, high, margin)
        change = _change(row["old_status"], row["new_status"], word)
        out.append({**row, "change": change.value})
    return pd.DataFrame(out, columns=COLUMNS)


#: changes a compare summary counts per finding, worst first
NOTABLE = (Change.NEW_FAILURE, Change.SLOWER, Change.FIXED, Change.FASTER)


@dataclass(frozen=True)
class CompareHeadline:
    """One finding in a run-vs-run summary: its headline variant at its headline case
    (from the new run, else the old), new against old, and the changes of all its rows."""

    finding: str
    claim: str
    where: str
    variant: str | None
    ratio: float | None
    """The headline variant's ratio to the reference there, new run's over the old
    run's; its 95% interval below."""
    ci_low: float | None
    ci_high: float | None
    change: str
    """The headline row's `Change` value."""
    changes: tuple[tuple[str, int], ...]
    """(Change value, count) of the finding's rows, NOTABLE ones only, where non-zero."""
    rows: int
    counters: tuple[CounterChange, ...]
    """The headline variant's counters that differ, old -> new."""
    sources: str | None = None
    """Those counters with the ops and lines behind the change, where both runs were
    recorded with `harness.run --sources` (`harness.report.attribution`)."""

    def ratio_text(self) -> str:
        """'scan: new / old 0.98 [0.95-1.01], no difference'."""
        words = self.change.replace("_", " ")
        if self.ratio is None:
            return f"{self.variant or '-'}: {words}"
        return (f"{self.variant}: new / old {self.ratio:.3g} [{self.ci_low:.3g}-"
                f"{self.ci_high:.3g}], {words}")

    def changes_text(self) -> str:
        """'2 slower, 1 faster of 36 rows', or 'no change of 36 rows'."""
        found = ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in self.changes)
        return f"{found or 'no change'} of {self.rows} rows"

    def counters_text(self) -> str:
        return self.sources or ", ".join(c.text() for c in self.counters) or "unchanged"


def _summary_row(run: Run, finding: str, case: str | None, variant: str | None) -> dict | None:
    """The summary row of `run` for finding x case x variant, or None."""
    s = run.summary
    if s.empty:
        return None
    hit = s[(s["finding"] == finding) & (s["case"] == case) & (s["variant"] == variant)]
    return hit.iloc[0].to_dict() if len(hit) else None


def compare_headlines(new: Run, old: Run, table: pd.DataFrame) -> list[CompareHeadline]:
    """One CompareHeadline per finding of `table` (`compare_runs(new, old)`), in its order:
    what the compare page's summary table and `--markdown` both show."""
    out = []
    old_sources, new_sources = attribution.run_sources(old), attribution.run_sources(new)
    for finding in dict.fromkeys(table["finding"]):
        rows = table[table["finding"] == finding]
        source = new if not new.summary.empty and finding in set(new.summary["finding"]) else old
        summary = source.summary[source.summary["finding"] == finding]
        head = finding_headline(finding, summary, source.metadata)
        at = rows[(rows["case"] == head.case) & (rows["variant"] == head.variant)]
        row = at.iloc[0].to_dict() if len(at) else {}
        counts = rows["change"].value_counts()
        counters, sources = (), None
        before, after = (_summary_row(r, finding, head.case, head.variant) for r in (old, new))
        if before is not None and after is not None:
            counters = counter_changes(after, before)[0]
            key = (finding, head.case, head.variant)
            sources = attribution.words(before, after, old_sources.get(key),
                                        new_sources.get(key), HEADLINE_COUNTERS)
        out.append(CompareHeadline(
            finding=finding, claim=head.claim, where=head.where, variant=head.variant,
            ratio=row.get("ratio") if present(row.get("ratio")) else None,
            ci_low=row.get("ci_low") if present(row.get("ci_low")) else None,
            ci_high=row.get("ci_high") if present(row.get("ci_high")) else None,
            change=row.get("change", Change.NOT_COMPARABLE.value),
            changes=tuple((c.value, int(counts[c.value])) for c in NOTABLE
                          if counts.get(c.value, 0)),
            rows=len(rows), counters=counters, sources=sources,
        ))
    return out
