"""What the report shows, computed from a run's files: per-finding tables, sentences, phases.

Everything here is a function of a `harness.results.Run`: its summary rows and what the
run recorded of each finding when it was made (`finding_info`: title, claim, notes,
variants, declared phases); no findings module is imported and nothing measures. The
HTML templates receive the plain dicts and dataclasses built here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd

from harness.exits import UsageError
from harness.results import Run, load_run
from harness.measure.decision import DEFAULT_MARGIN
from harness.measure.stats import Verdict
from harness.report.headline import COUNTERS, Headline, headline, headline_case
from harness.report.summary import (
    compiled_line, format_seconds, load_line, process_line, sampling_line, signed_seconds,
    verdict_word,
)
from harness.report.verdicts import case_phrase, level_label, present, verdict_sentence



class ReportError(UsageError):
    """Bad input to the report (missing or corrupt run, other schema, other machine, an
    --out it cannot write): one line, exit 2."""


def open_run(run, results_dir, source: str | None = None) -> Run:
    """`load_run`, with every way a run cannot be read (missing, not UTF-8, empty,
    truncated, not a run, another schema, a field of the wrong kind) a ReportError that
    names the file; `source` names the argument `run` came from (`RUN`, `--compare`)."""
    try:
        return load_run(run, results_dir, source)
    except UsageError as err:
        raise ReportError(str(err)) from err


@dataclass(frozen=True)
class FindingText:
    """The claim's words for a finding, as the run recorded them (bare for older runs)."""

    id: str
    title: str
    claim: str
    ticket: str
    notes: tuple[str, ...]
    baseline: str
    claim_factor: float | None
    reviewed: str = ""
    """The reviewed code the baseline reproduces (file, lines, commit)."""
    fix: str = ""
    """The review's fix the proposed variant applies."""
    premise: str = ""
    """Where the review's premise does not hold, with the evidence."""
    ours: tuple[str, ...] = ()
    """Variants of this project's own design."""


def recorded_info(metadata: dict | None, finding_id: str) -> dict | None:
    """What the run recorded of `finding_id` when it was made (`finding_info`), or None
    for runs made before runs described their findings."""
    info = ((metadata or {}).get("finding_info") or {}).get(finding_id)
    return info if isinstance(info, dict) else None


def finding_text(finding_id: str, rows: pd.DataFrame, metadata: dict | None = None) -> FindingText:
    """Title, claim and notes of `finding_id` as the run recorded them; a run made before
    runs described their findings keeps the id and says so."""
    marked = rows.loc[rows["baseline"].astype(bool), "variant"]
    baseline = marked.iloc[0] if len(marked) else "baseline"
    info = recorded_info(metadata, finding_id)
    if info is None:
        return FindingText(finding_id, finding_id, "(a run older than schema 2 did not record "
                           "this finding's claim)", "", (), baseline, None)
    return FindingText(finding_id, info.get("title") or finding_id, info.get("claim") or "",
                       info.get("ticket") or "", tuple(info.get("notes") or ()),
                       info.get("baseline") or baseline, info.get("claim_factor"),
                       str(info.get("reviewed") or ""), str(info.get("fix") or ""),
                       str(info.get("premise") or ""),
                       tuple(str(v) for v in info.get("ours") or ()))


def param_columns(rows: pd.DataFrame) -> list[str]:
    """The `p_<param>` columns that hold a value for these rows, in column order."""
    return [c for c in rows.columns if c.startswith("p_") and rows[c].notna().any()]


def records(rows: pd.DataFrame) -> list[dict]:
    """Rows as dicts without the columns these rows leave empty (other findings' params)."""
    return rows[[c for c in rows.columns if rows[c].notna().any()]].to_dict("records")


def _number(row: dict, key: str, fmt: str = "{:.3g}") -> str:
    value = row.get(key)
    return fmt.format(value) if present(value) else "-"


def _correctness(row: dict) -> str:
    error = row.get("max_error")
    if row.get("status") == Verdict.MISMATCH.value:
        return f"FAIL (max error {error:.2g})" if present(error) else "FAIL"
    if present(error):
        return f"ok (max error {error:.2g})"
    return "-"


def _decimal(value: float, unit: str) -> str:
    """5.8e9, 'B/s' -> '5.8 GB/s' (decimal prefixes, 3 significant digits)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def format_bandwidth(bytes_per_s: float | None) -> str:
    """5.8e9 -> '5.8 GB/s'; None/NaN -> '-'."""
    return _decimal(bytes_per_s, "B/s") if present(bytes_per_s) else "-"


def has_bandwidth(rows: pd.DataFrame) -> bool:
    """Whether these rows carry achieved bandwidths (a finding with `min_bytes`)."""
    return "achieved_bytes_per_s" in rows.columns and rows["achieved_bytes_per_s"].notna().any()


def bandwidth_cell(row: dict) -> str:
    """`3.1 GB/s (16% of L3)`: the bytes a call must move over its median time, and that
    as a share of the floor's bandwidth (= floor time / median); '-' if untimed."""
    achieved = row.get("achieved_bytes_per_s")
    if not present(achieved):
        return "-"
    if present(row.get("floor_s")) and present(row.get("median_s")):
        share = 100 * row["floor_s"] / row["median_s"]  # percent of the floor's bandwidth
        digits = f"{share:.0f}" if share >= 10 else f"{share:.2g}"
        level = row.get("floor_level") if present(row.get("floor_level")) else "copy"
        return f"{format_bandwidth(achieved)} ({digits}% of {level})"
    return format_bandwidth(achieved)


#: why sampling stopped (`harness.measure.timing.StopReason`), in words
STOPPED_BY = {"precision_reached": "precision reached", "time_budget": "budget spent",
              "max_samples": "sample cap", "target_reached": "spread target"}


def sampling_cell(row: dict) -> str:
    """`34 (precision reached)`: samples taken and why sampling stopped, and how many
    processes the row combines where more than one; '-' if untimed."""
    if not present(row.get("n")):
        return "-"
    why = STOPPED_BY.get(row.get("stopped_by"), row.get("stopped_by"))
    notes = [why] if present(why) else []
    if present(row.get("processes")) and row["processes"] > 1:
        notes.append(f"{int(row['processes'])} processes")
    return f"{int(row['n'])} ({'; '.join(notes)})" if notes else f"{int(row['n'])}"


def interval_cell(row: dict) -> str:
    """`±2.1%`: the half-width of the row's ratio interval relative to the ratio (the
    baseline row: the widest of its cell at the last check); '-' where there is none."""
    width = row.get("ci_halfwidth")
    if not present(width):
        width = row.get("precision_reached")
    return f"\u00b1{100 * width:.2g}%" if present(width) else "-"


def format_bytes(nbytes: float | None) -> str:
    """24576 -> '24.6 kB'; None/NaN -> '-'."""
    return _decimal(nbytes, "B") if present(nbytes) else "-"


def case_bandwidth(row: dict) -> str:
    """A case's floor and label: `floor 66.6 us (5.78 MB at L3 bandwidth): launch-bound`
    (older runs: `at copy bandwidth`); '' for rows without a floor."""
    if not present(row.get("floor_s")):
        return ""
    level = row.get("floor_level") if present(row.get("floor_level")) else "copy"
    text = (f"floor {format_seconds(row['floor_s'])} ({_decimal(row['min_bytes'], 'B')} at "
            f"{level} bandwidth)")
    return f"{text}: {row['bound']}" if present(row.get("bound")) else text


def table_rows(rows: pd.DataFrame) -> list[dict]:
    """One display row per case x variant, grouped by case in run order; cells are strings.

    Each dict: case, case_note (its bandwidth floor and label, or ''), variant, baseline,
    median, iqr, ratio (with its interval and that interval's level), speedup, bandwidth (achieved, and its share of
    the copy bandwidth), one entry per COUNTERS key, peak (memory), sampling (samples
    and why they stopped), interval (the ratio's half-width), correctness, verdict (a word), css
    (the verdict value, for colour) and note (reason or error of a row that was not timed).
    """
    out = []
    for row in records(rows):
        ratio = "-"
        if present(row.get("ratio")):
            ratio = f"{row['ratio']:.3g} [{row['ci_low']:.3g}-{row['ci_high']:.3g}]"
            ratio += f" ({level_label([row.get('ci_level')])})"
        note = next((row[k] for k in ("error", "reason", "profile_note") if present(row.get(k))), "")
        out.append({
            "case": case_phrase(row),
            "case_note": case_bandwidth(row),
            "variant": row["variant"],
            "baseline": bool(row.get("baseline")),
            "median": format_seconds(row.get("median_s")),
            "iqr": format_seconds(row.get("iqr_s")),
            "ratio": ratio,
            "speedup": _number(row, "speedup", "{:.3g}x"),
            "bandwidth": bandwidth_cell(row),
            **{key: _number(row, key, "{:.0f}") for key in COUNTERS},
            "peak": format_bytes(row.get("peak_bytes")),
            "sampling": sampling_cell(row),
            "interval": interval_cell(row),
            "correctness": _correctness(row),
            "verdict": verdict_word(row),
            "css": row.get("verdict") or row.get("status"),
            "note": note,
        })
    return out


def sentences(rows: pd.DataFrame, text: FindingText,
              case: str | None) -> tuple[list[str], list[str]]:
    """(verdict sentences, every sentence) for a finding's rows.

    The verdict sentences: one per non-baseline variant at the headline `case`, then
    every failure and mismatch of the other cases.
    """
    every, verdict = [], []
    broken = (Verdict.FAILED.value, Verdict.MISMATCH.value)
    for row in records(rows):
        sentence = verdict_sentence(row, against=text.baseline, claim=text.claim_factor)
        every.append(sentence)
        if row["variant"] == text.baseline:
            continue
        if row["case"] == case or row.get("status") in broken:
            verdict.append(sentence)
    return verdict, every


def finding_headline(finding_id: str, rows: pd.DataFrame, metadata: dict,
                     summary: pd.DataFrame | None = None) -> Headline:
    """The headline of `finding_id` in a run (its rows and the run's metadata); with the
    run's whole `summary`, a finding that names its iteration (`Reading.per_iteration`)
    gets its share of that iteration's baseline time."""
    text = finding_text(finding_id, rows, metadata)
    info = recorded_info(metadata, finding_id) or {}
    cases = info.get("cases")
    per_iteration = info.get("per_iteration")
    per_iteration = (float(per_iteration[0]), str(per_iteration[1])) if per_iteration else None
    iteration_s = (baseline_seconds(summary, metadata, per_iteration[1])
                   if per_iteration and summary is not None else None)
    return headline(finding_id, rows, claim=text.claim, baseline=text.baseline,
                    claim_factor=text.claim_factor, peers=tuple(info.get("peers") or ()),
                    cases_expected=len(cases) if isinstance(cases, list) else None,
                    answer=tuple(info.get("answer") or ()), proposed=info.get("proposed"),
                    ours=text.ours, per_iteration=per_iteration, iteration_s=iteration_s)


def baseline_seconds(summary: pd.DataFrame, metadata: dict, finding_id: str) -> float | None:
    """The baseline's median seconds of `finding_id` at its headline case in a run's
    `summary`, or None where the run has none."""
    rows = summary[summary["finding"] == finding_id]
    if rows.empty:
        return None
    baseline = (recorded_info(metadata, finding_id) or {}).get("baseline")
    case = headline_case(rows, baseline)
    at = rows[(rows["case"] == case) & (rows["variant"] == baseline)]
    value = at["median_s"].iloc[0] if len(at) and "median_s" in at else None
    return float(value) if present(value) else None


def run_headlines(run: Run) -> list[Headline]:
    """One headline per finding in the run, in run order: the summary table's rows."""
    if run.summary.empty:
        return []
    return [finding_headline(f, run.summary[run.summary["finding"] == f], run.metadata,
                             run.summary)
            for f in dict.fromkeys(run.summary["finding"])]


def run_sampling_line(run: Run) -> str | None:
    """How the run's sampling went and the process level it measured, in a line or two:
    `harness.report.summary.sampling_line` and `process_line` of its rows and options."""
    lines = [sampling_line(run.summary, run.metadata.get("precision") or 0.0,
                           run.metadata.get("margin") or DEFAULT_MARGIN),
             process_line(run.summary, run.metadata.get("process_level")),
             compiled_line(run.summary), load_line(run.summary)]
    return "; ".join(filter(None, lines)) or None


def counters_at(rows: pd.DataFrame, case: str | None) -> list[dict]:
    """Per variant at `case`: its counters as strings (variant, then one per COUNTERS key)."""
    at = rows[rows["case"] == case] if case is not None else rows.iloc[0:0]
    return [{"variant": r["variant"], **{k: _number(r, k, "{:,.0f}") for k in COUNTERS}}
            for r in records(at)]


@dataclass(frozen=True)
class PhaseBreakdown:
    """A case's call split into its finding's phases, and Amdahl's prediction from them.

    Phase seconds are medians over the timed calls of each variant. In a paired finding
    (call k of both variants does the same work, e.g. iteration k of two trainers), each
    phase also has the time it saved per call, the median of the per-call differences with
    its 95% interval, and so does the whole call.
    """

    case: str
    baseline: str
    variant: str
    phases: tuple[str, ...]
    baseline_s: tuple[float, ...]
    """Seconds of each phase in the baseline's call."""
    variant_s: tuple[float, ...]
    baseline_median_s: float
    variant_median_s: float
    measured_ratio: float
    measured_ci: tuple[float, float]
    saved_s: tuple[tuple[float, float, float] | None, ...] = ()
    """Per phase: seconds saved per call (baseline - variant), (median, low, high)."""
    total_saved_s: tuple[float, float, float] | None = None
    """The whole call's seconds saved, (median, low, high), where paired."""
    baseline_device_s: tuple[float, ...] | None = None
    """On CUDA: each phase's device-timeline seconds in the baseline (None on the CPU)."""
    variant_device_s: tuple[float, ...] | None = None

    @property
    def predicted_ratio(self) -> float:
        """Amdahl: sum over phases of (baseline phase share) x (variant / baseline phase).

        The shares weight each phase's gain, so the sum reduces to
        sum(variant phases) / sum(baseline phases); below 1: faster.
        """
        return sum(self.variant_s) / sum(self.baseline_s)

    @property
    def predicted_s(self) -> float:
        """The variant's predicted time per call: the baseline's median x predicted ratio."""
        return self.baseline_median_s * self.predicted_ratio

    @property
    def predicted_saved(self) -> str:
        """Seconds per call the Amdahl prediction saves (the baseline's median less the
        predicted time), formatted; below 0 a loss."""
        return signed_seconds(self.baseline_median_s - self.predicted_s)

    @property
    def total_saved_text(self) -> str:
        """The whole call's measured saving with its interval, formatted."""
        return format_saving(self.total_saved_s)

    def phase_rows(self) -> list[dict]:
        """Per phase: seconds in both variants (and on the device, on CUDA), share of the
        baseline, gain (x) and the time saved per call with its interval."""
        total = sum(self.baseline_s)
        rows = []
        for index, (name, b, v) in enumerate(zip(self.phases, self.baseline_s, self.variant_s)):
            saved = self.saved_s[index] if index < len(self.saved_s) else None
            row = {"phase": name, "baseline": format_seconds(b), "variant": format_seconds(v),
                   "share": f"{b / total:.1%}", "gain": f"{b / v:.3g}x" if v > 0 else "-",
                   "predicted_saved": signed_seconds(b - v), "saved": format_saving(saved)}
            if self.baseline_device_s is not None and self.variant_device_s is not None:
                row["baseline_device"] = format_seconds(self.baseline_device_s[index])
                row["variant_device"] = format_seconds(self.variant_device_s[index])
            rows.append(row)
        return rows


def format_saving(saved: tuple[float, float, float] | None) -> str:
    """(median, low, high) seconds saved -> '2.9 ms [2.5 ms, 3.3 ms]' ('-0.4 ms' is a loss)."""
    if saved is None:
        return "-"
    median, low, high = (signed_seconds(v) for v in saved)
    return f"{median} [{low}, {high}]"


def _saving(row: dict, name: str) -> tuple[float, float, float] | None:
    """Seconds saved per call from a row's paired difference `name` (variant -
    baseline): (median, low, high) of baseline - variant, or None."""
    keys = (f"{name}_diff", f"{name}_diff_low", f"{name}_diff_high")
    if name == "time":
        keys = ("time_diff_s", "time_diff_low_s", "time_diff_high_s")
    if not all(present(row.get(k)) for k in keys):
        return None
    diff, low, high = (float(row[k]) for k in keys)
    return -diff, -high, -low


def finding_phases(metadata: dict | None, finding_id: str) -> tuple[str, ...]:
    """The phases a finding declared (`Recording.phases`), as the run recorded them."""
    return tuple((recorded_info(metadata, finding_id) or {}).get("phases") or ())


def phase_breakdowns(rows: pd.DataFrame, baseline: str,
                     phases: tuple[str, ...]) -> list[PhaseBreakdown]:
    """One PhaseBreakdown per case x non-baseline variant that has every phase's seconds
    (`phase_<name>_s`, `Recording.phases`) and a ratio."""
    if not phases:
        return []
    columns = [f"phase_{p}_s" for p in phases]
    device = [f"phase_{p}_device_s" for p in phases]
    if not set(columns) <= set(rows.columns):
        return []
    out = []
    for _, case_rows in rows.groupby("case", sort=False):
        by_variant = {r["variant"]: r for r in case_rows.to_dict("records")}
        base = by_variant.get(baseline)
        if base is None or not all(present(base[c]) for c in columns):
            continue
        for name, row in by_variant.items():
            if name == baseline or not present(row.get("ratio")):
                continue
            if not all(present(row[c]) for c in columns):
                continue
            on_device = all(present(r.get(c)) for r in (base, row) for c in device)
            out.append(PhaseBreakdown(
                case=case_phrase(row), baseline=baseline, variant=name, phases=phases,
                baseline_s=tuple(float(base[c]) for c in columns),
                variant_s=tuple(float(row[c]) for c in columns),
                baseline_median_s=float(base["median_s"]), variant_median_s=float(row["median_s"]),
                measured_ratio=float(row["ratio"]),
                measured_ci=(float(row["ci_low"]), float(row["ci_high"])),
                saved_s=tuple(_saving(row, c) for c in columns),
                total_saved_s=_saving(row, "time"),
                baseline_device_s=tuple(float(base[c]) for c in device) if on_device else None,
                variant_device_s=tuple(float(row[c]) for c in device) if on_device else None,
            ))
    return out


def format_date(stamp: str | None) -> str | None:
    """'2026-11-24T03:05:00+00:00' -> '2026-11-24 03:05 UTC' (as written if unreadable)."""
    try:
        moment = datetime.fromisoformat(stamp or "")
    except ValueError:
        return stamp or None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def metadata_line(metadata: dict) -> str:
    """Where and how a run was measured, in one line: device, threads, versions, commit,
    date, budget."""
    commit = (metadata.get("git_commit") or "unknown")[:10]
    if metadata.get("git_dirty"):
        commit += " (uncommitted changes)"
    parts = [metadata.get("device_name") or metadata.get("device"),
             f"{metadata['threads']} torch threads" if metadata.get("threads") else None,
             f"torch {metadata['torch']}" if metadata.get("torch") else None,
             f"CUDA {metadata['cuda']}" if metadata.get("cuda") else None,
             f"Python {metadata['python']}" if metadata.get("python") else None,
             f"commit {commit}",
             format_date(metadata.get("created")),
             ("quick, " if metadata.get("quick") else "") + budget_text(metadata)]
    return " \u00b7 ".join(p for p in parts if p)


def budget_text(metadata: dict) -> str:
    """'140 s budget, 131 s spent': the run's one budget, and what it spent (a run made
    before the whole-run budget: its sampling seconds per case)."""
    if present(metadata.get("budget_s")):
        spent = metadata.get("seconds")
        return (f"{metadata['budget_s']:g} s budget"
                + (f", {spent:.0f} s spent" if present(spent) else ""))
    if present(metadata.get("time_budget_s")):
        return f"{metadata['time_budget_s']:g} s of sampling per case"
    return "default budget"


#: how a run that did not finish is described: status -> (what happened, why)
UNFINISHED = {"running": ("is still running", ", or its process stopped without saying so"),
              "interrupted": ("was interrupted", ""),
              "killed": ("was killed", " (its process died without finishing)")}


def status_banner(metadata: dict) -> str | None:
    """A warning for a run that is not complete: how far it got and how to resume it,
    e.g. 'This run was interrupted after 7 of 36 cells; resume it with python -m
    harness.run --resume RUN_ID. ...'; None for a complete run."""
    status = metadata.get("status")
    if status == "complete":
        return None
    what, why = UNFINISHED.get(status, (f"has status {status!r}, not complete", ""))
    done, total = metadata.get("cells_done"), metadata.get("cells_total")
    progress = ""
    if present(done):
        progress = f"{done:g} of {total:g} cells" if present(total) else f"{done:g} cells"
        progress = f" ({progress} so far)" if status == "running" else f" after {progress}"
    text = f"This run {what}{progress}{why}"
    if status in ("interrupted", "killed"):
        text += (f"; resume it with python -m harness.run --resume "
                 f"{metadata.get('run_id', 'RUN_ID')}")
    return text + ". The report shows what it had measured: some findings may lack cases."


def metadata_panel(metadata: dict) -> list[tuple[str, str]]:
    """(label, value) pairs describing where and how a run was measured."""
    copy = metadata.get("copy_bandwidth_bytes_per_s")
    commit = metadata.get("git_commit") or "unknown"
    dirty = metadata.get("git_dirty")
    commit += " (uncommitted changes)" if dirty else "" if dirty is False else " (state unknown)"
    fields = [
        ("run", metadata.get("run_id")),
        ("created (UTC)", metadata.get("created")),
        ("status", metadata.get("status")),
        ("device", f"{metadata.get('device')}: {metadata.get('device_name')}"),
        ("CPU", metadata.get("cpu_model")),
        ("torch threads", metadata.get("threads")),
        ("copy bandwidth", f"{format_bandwidth(copy)} (large tensor copy, read + write)"
         if present(copy) else None),
        ("torch", metadata.get("torch")),
        ("CUDA", metadata.get("cuda") or "not used"),
        ("Python", metadata.get("python")),
        ("platform", metadata.get("platform")),
        ("commit", commit),
        ("command", metadata.get("command")),
        ("budget", budget_text(metadata) + (", quick" if metadata.get("quick") else "")),
        ("seed", metadata.get("seed")),
    ]
    return [(label, str(value)) for label, value in fields if value is not None]
