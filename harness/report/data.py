"""What the report shows, computed from a run's files: per-finding tables, sentences, phases.

Everything here is a function of a `harness.results.Run` (or its summary rows) and the
finding registry's text (title, claim, notes); nothing measures. The HTML templates
receive the plain dicts and dataclasses built here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from harness import findings as registry
from harness.results import Run, load_run
from harness.measure.stats import Verdict
from harness.report.summary import format_seconds, verdict_word
from harness.report.verdicts import case_phrase, claim_factor, present, verdict_sentence

#: per-call counters shown in tables and the counters chart: column -> label
COUNTERS = {"allocations": "allocations", "host_syncs": "host syncs",
            "kernel_launches": "kernel launches"}
#: the E2E-iteration phases, in the order an iteration runs them
PHASES = ("env_step", "policy_forward", "buffer_add", "gae", "update")
E2E_ID = "E2E-iteration"


class ReportError(Exception):
    """Bad input to the report (missing run, other schema, other machine): one line, exit 2."""


def open_run(run, results_dir) -> Run:
    """`load_run`, with its not-found and wrong-schema errors turned into a ReportError."""
    try:
        return load_run(run, results_dir)
    except (FileNotFoundError, ValueError) as err:
        raise ReportError(str(err)) from err


@dataclass(frozen=True)
class FindingText:
    """The ticket's words for a finding; from the registry, or bare when it is unknown."""

    id: str
    title: str
    claim: str
    ticket: str
    notes: tuple[str, ...]
    baseline: str
    claim_factor: float | None


def finding_text(finding_id: str, rows: pd.DataFrame) -> FindingText:
    """Title, claim and notes of `finding_id`; a finding no longer registered keeps its id."""
    registry.select(None)  # loads the built-in findings
    known = registry.FINDINGS.get(finding_id)
    marked = rows.loc[rows["baseline"].astype(bool), "variant"]
    baseline = known.baseline if known else (marked.iloc[0] if len(marked) else "baseline")
    if known is None:
        return FindingText(finding_id, finding_id, "(this finding is not in the registry)", "",
                           (), baseline, None)
    return FindingText(known.id, known.title, known.claim, known.ticket, known.notes, baseline,
                       claim_factor(known.claim))


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
    """`3.1 GB/s (16% of copy)`: the bytes a call must move over its median time, and
    that as a share of the run's copy bandwidth (= floor time / median); '-' if untimed."""
    achieved = row.get("achieved_bytes_per_s")
    if not present(achieved):
        return "-"
    if present(row.get("floor_s")) and present(row.get("median_s")):
        share = 100 * row["floor_s"] / row["median_s"]  # percent of the copy bandwidth
        digits = f"{share:.0f}" if share >= 10 else f"{share:.2g}"
        return f"{format_bandwidth(achieved)} ({digits}% of copy)"
    return format_bandwidth(achieved)


def case_bandwidth(row: dict) -> str:
    """A case's floor and label: `floor 312 us (5.78 MB at copy bandwidth): bandwidth-bound`;
    '' for rows without a floor."""
    if not present(row.get("floor_s")):
        return ""
    text = (f"floor {format_seconds(row['floor_s'])} ({_decimal(row['min_bytes'], 'B')} at "
            "copy bandwidth)")
    return f"{text}: {row['bound']}" if present(row.get("bound")) else text


def table_rows(rows: pd.DataFrame) -> list[dict]:
    """One display row per case x variant, grouped by case in run order; cells are strings.

    Each dict: case, case_note (its bandwidth floor and label, or ''), variant, baseline,
    median, iqr, ratio (with its 95% CI), speedup, bandwidth (achieved, and its share of
    the copy bandwidth), one entry per COUNTERS key, correctness, verdict (a word), css
    (the verdict value, for colour) and note (reason or error of a row that was not timed).
    """
    out = []
    for row in records(rows):
        ratio = "-"
        if present(row.get("ratio")):
            ratio = f"{row['ratio']:.3g} [{row['ci_low']:.3g}-{row['ci_high']:.3g}]"
        note = row.get("error") if present(row.get("error")) else row.get("reason")
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
            "correctness": _correctness(row),
            "verdict": verdict_word(row),
            "css": row.get("verdict") or row.get("status"),
            "note": note if present(note) else "",
        })
    return out


def _workload(row: dict, params: list[str]) -> float:
    """Product of a row's numeric params: which case is the largest."""
    size = 1.0
    for p in params:
        value = row.get(p)
        if isinstance(value, (int, float)) and present(value):
            size *= float(value)
    return size


def sentences(rows: pd.DataFrame, text: FindingText) -> tuple[list[str], list[str]]:
    """(headlines, all sentences) for a finding's rows.

    A headline per non-baseline variant: its row at the largest case where it has a time
    ratio, else its first row (why it was not measured); mismatches and failures always.
    """
    params = param_columns(rows)
    every, headline = [], []
    by_variant: dict[str, list[dict]] = {}
    for row in records(rows):
        sentence = verdict_sentence(row, against=text.baseline, claim=text.claim_factor)
        every.append(sentence)
        if row["variant"] != text.baseline:
            by_variant.setdefault(row["variant"], []).append({**row, "_sentence": sentence})
    for variant_rows in by_variant.values():
        broken = [r for r in variant_rows
                  if r.get("status") in (Verdict.FAILED.value, Verdict.MISMATCH.value)]
        compared = [r for r in variant_rows if present(r.get("ratio"))]
        if compared:
            headline.append(max(compared, key=lambda r: _workload(r, params))["_sentence"])
        elif not broken:
            headline.append(variant_rows[0]["_sentence"])
        headline += [r["_sentence"] for r in broken]
    return headline, every


@dataclass(frozen=True)
class PhaseBreakdown:
    """An E2E case's iteration split into phases, and Amdahl's prediction from them.

    Phase seconds come from one profiled iteration per variant; the measured ratio is
    the unprofiled ratio of medians with its bootstrap interval.
    """

    case: str
    baseline: str
    variant: str
    phases: tuple[str, ...]
    baseline_s: tuple[float, ...]
    """Seconds of each phase in the baseline's profiled iteration."""
    variant_s: tuple[float, ...]
    baseline_gae_share: float
    variant_gae_share: float
    baseline_median_s: float
    variant_median_s: float
    measured_ratio: float
    measured_ci: tuple[float, float]

    @property
    def predicted_ratio(self) -> float:
        """Amdahl: sum over phases of (baseline phase share) x (variant / baseline phase).

        The shares weight each phase's gain, so the sum reduces to
        sum(variant phases) / sum(baseline phases); below 1: faster.
        """
        return sum(self.variant_s) / sum(self.baseline_s)

    @property
    def predicted_s(self) -> float:
        """The variant's predicted time per iteration: the baseline's median x predicted ratio."""
        return self.baseline_median_s * self.predicted_ratio

    def phase_rows(self) -> list[dict]:
        """Per phase: seconds in both variants, share of the baseline, and gain (x)."""
        total = sum(self.baseline_s)
        return [{"phase": name, "baseline": format_seconds(b), "variant": format_seconds(v),
                 "share": f"{b / total:.1%}", "gain": f"{b / v:.3g}x" if v > 0 else "-"}
                for name, b, v in zip(self.phases, self.baseline_s, self.variant_s)]


def phase_breakdowns(rows: pd.DataFrame, baseline: str) -> list[PhaseBreakdown]:
    """One PhaseBreakdown per case x non-baseline variant that has phase seconds and a ratio."""
    columns = [f"phase_{p}_s" for p in PHASES]
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
            out.append(PhaseBreakdown(
                case=case_phrase(row), baseline=baseline, variant=name, phases=PHASES,
                baseline_s=tuple(float(base[c]) for c in columns),
                variant_s=tuple(float(row[c]) for c in columns),
                baseline_gae_share=float(base["gae_share"]),
                variant_gae_share=float(row["gae_share"]),
                baseline_median_s=float(base["median_s"]), variant_median_s=float(row["median_s"]),
                measured_ratio=float(row["ratio"]),
                measured_ci=(float(row["ci_low"]), float(row["ci_high"])),
            ))
    return out


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
        ("budget", f"{metadata.get('time_budget_s')} s per case"
                   + (", quick" if metadata.get("quick") else "")),
        ("seed", metadata.get("seed")),
    ]
    return [(label, str(value)) for label, value in fields if value is not None]
