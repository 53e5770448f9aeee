"""Run vs run: per finding x case x variant, the time new / old with its interval and word.

Each run is one process, and the two processes are compared through their own
estimates, never by pooling their samples: each run's time of a row is the 20%-trimmed
mean of its log samples with its own interval (`harness.measure.estimate`), and the
difference of the two carries a between-run term, the standard deviation of a row's log
time from one run of a commit to the next on one machine. That term is measured from
the results folder's repeated runs of one commit where there are some, else the figure
measured on the 2-core CPU this project is developed on (`BETWEEN_RUN_SD`). The word is
the run's own words (`harness.measure.decision.Word`, `--margin` 0.05: 5%): faster, slower, same or
inconclusive. Runs measured on machines whose fingerprints differ are refused unless
forced: their times say more about the machines than the code; so are runs whose CPU
kernel paths differ (`harness.measure.machine.kernel_path`), which may be one machine.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.measure.decision import DEFAULT_MARGIN, Word, decide
from harness.measure.estimate import PairedEstimate, log_estimate
from harness.measure.machine import (
    KERNEL_FIELDS, fingerprint, fingerprint_changes, records_kernel_path,
)
from harness.report import attribution
from harness.report.data import ReportError, finding_headline
from harness.report.headline import COUNTERS as HEADLINE_COUNTERS, CounterChange, counter_changes
from harness.results import Run
from harness.measure.stats import Verdict
from harness.report.verdicts import case_phrase, present

#: the standard deviation (log units) of one row's time between two default runs of one
#: commit, one after the other, on the 2-core CPU (docs/statistics.md); used where the
#: results folder holds no repeated runs of a commit to measure it from
BETWEEN_RUN_SD = 0.03
#: the fewest rows two runs of one commit must share to measure the between-run term
MIN_SHARED_ROWS = 20
KEY = ["finding", "case", "variant"]
COLUMNS = [*KEY, "where", "old_status", "new_status", "old_median_s", "new_median_s", "ratio",
           "ci_low", "ci_high", "change", "note"]
_BROKEN = {Verdict.FAILED.value, Verdict.MISMATCH.value}


class Change(str, enum.Enum):
    """What happened to one finding x case x variant between the old and the new run."""

    FASTER = "faster"
    """The whole interval of new / old lies below 1 / (1 + margin): the new run takes less time."""
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


def samples_by_key(rows: pd.DataFrame) -> dict[tuple, list[float]]:
    """A run's timing samples (its `rows`) grouped by (finding, case, variant)."""
    if rows.empty:
        return {}
    return {key: group["seconds"].tolist() for key, group in rows.groupby(KEY, sort=False)}


def _change(old_status: str | None, new_status: str | None, word: Word | None) -> Change:
    """A status change wins over timing; `word` is None where there is no ratio."""
    if new_status in _BROKEN and old_status not in _BROKEN:
        return Change.NEW_FAILURE
    if old_status in _BROKEN and new_status not in _BROKEN and new_status is not None:
        return Change.FIXED
    return Change.NOT_COMPARABLE if word is None else _FROM_WORD[word]


def run_difference(new: Sequence[float], old: Sequence[float], between_sd: float) -> PairedEstimate:
    """log(new time / old time) of one row from each run's own estimate (seconds per call
    samples of each run), with `between_sd` (log units) of run-to-run noise on each side."""
    a, b = log_estimate(new), log_estimate(old)
    variance = a.se ** 2 + b.se ** 2 + 2.0 * between_sd ** 2
    carried = a.se ** 4 / a.df + b.se ** 4 / b.df
    df = min(variance ** 2 / carried, 1e6) if carried > 0 else 1e6
    return PairedEstimate(a.log_ratio - b.log_ratio, math.sqrt(variance), df,
                          rounds=a.rounds + b.rounds, processes=2)


def between_run_sd(runs: Sequence[Run]) -> tuple[float, str]:
    """(standard deviation, where it comes from) of a row's log time between runs of one
    commit on one machine: the robust spread (1.4826 x MAD) of the per-row log differences
    of each pair of clean runs of one commit and fingerprint, over sqrt(2), where such
    pairs share at least MIN_SHARED_ROWS rows; else `BETWEEN_RUN_SD`."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        m = run.metadata
        if m.get("git_commit") and m.get("git_dirty") is False and not run.summary.empty:
            key = (m["git_commit"], tuple(sorted(fingerprint(m).items())), bool(m.get("quick")))
            groups.setdefault(key, []).append(run)
    differences = []
    for same in groups.values():
        for first, second in zip(same, same[1:]):
            a, b = _medians(first), _medians(second)
            shared = [k for k in a if k in b]
            if len(shared) >= MIN_SHARED_ROWS:
                differences += [math.log(a[k] / b[k]) for k in shared]
    if len(differences) < MIN_SHARED_ROWS:
        return BETWEEN_RUN_SD, "measured on the 2-core development CPU (docs/statistics.md)"
    spread = 1.4826 * float(np.median(np.abs(np.asarray(differences) - np.median(differences))))
    return spread / math.sqrt(2.0), f"measured from {len(differences)} rows of repeated runs"


def _medians(run: Run) -> dict[tuple, float]:
    rows = run.summary
    if "median_s" not in rows:
        return {}
    timed = rows[rows["median_s"].notna() & (rows["median_s"] > 0)]
    return {tuple(r[k] for k in KEY): float(r["median_s"]) for r in timed.to_dict("records")}


def cell_device(row: dict, run: Run) -> str | None:
    """The device a cell was measured on: its row's own `device_name` (a sharded run's
    cells carry the rank's), else its run's."""
    return row.get("device_name") if present(row.get("device_name")) else run.metadata.get("device_name")


def compare_runs(new: Run, old: Run, *, margin: float = DEFAULT_MARGIN,
                 seed: int = 0, force: bool = False,
                 between_sd: float | None = None) -> pd.DataFrame:
    """One row per finding x case x variant found in either run's summary.

    Columns: finding, case, variant, where (the case in words), old_status, new_status,
    old_median_s, new_median_s, ratio (new / old: each run's own estimate, module
    docstring), ci_low, ci_high (95%), change (a `Change` value), note; in the new run's
    order, then what only the old run has. `between_sd` is the run-to-run noise (log
    units; default `between_run_sd` of the two runs). A cell measured on another device
    in one run than in the other (runs sharded over a mixed cluster) is not compared
    unless `force`: its change is not_comparable and the note names both.
    """
    if not (math.isfinite(margin) and margin > 0.0):
        raise ReportError(f"--margin: expected a finite fraction > 0, e.g. 0.05; got {margin!r}")
    if between_sd is None:
        between_sd = between_run_sd([new, old])[0]
    old_samples, new_samples = samples_by_key(old.rows), samples_by_key(new.rows)
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
        elif len(old_samples.get(key, ())) >= 2 and len(new_samples.get(key, ())) >= 2:
            estimate = run_difference(new_samples[key], old_samples[key], between_sd)
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
    """Median time new / old of the headline variant there; its 95% interval below."""
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
