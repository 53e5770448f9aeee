"""The end-of-run table: finding, variant, case, median, ratio with CI, counters, verdict."""

from __future__ import annotations

import collections
import math

import pandas as pd

from harness.measure.decision import DEFAULT_MARGIN

from harness.plan import BUDGET_LEFT_OUT, BUDGET_UNPROFILED


def format_seconds(seconds: float | None) -> str:
    """1.5e-05 -> '15.0 us'; None/NaN -> '-'."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def signed_seconds(seconds: float) -> str:
    """format_seconds with a sign for negative values: '-0.4 ms'."""
    return ("-" if seconds < 0 else "") + format_seconds(abs(seconds))


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def format_ratio(row: dict) -> str:
    """'0.057 [0.055-0.060]' (variant time / baseline time) or '-'."""
    if not _present(row.get("ratio")):
        return "-"
    return f"{row['ratio']:.3g} [{row['ci_low']:.3g}-{row['ci_high']:.3g}]"


def _count(row: dict, key: str) -> str:
    value = row.get(key)
    return str(int(value)) if _present(value) else "-"


def verdict_word(row: dict) -> str:
    """The row's word for tables: 'faster', 'same', 'inconclusive (leans slower)', 'FAIL'..."""
    verdict = row.get("verdict") or row.get("status")
    if verdict == "inconclusive" and _present(row.get("lean")):
        return f"inconclusive (leans {row['lean']})"
    words = {"no_difference": "no difference", "within_factor": "within factor",
             "mismatch": "FAIL", "failed": "ERROR", "needs_cuda": "needs CUDA",
             "not_timed": "not timed"}
    return words.get(verdict, verdict)


def summary_table(summary: pd.DataFrame) -> str:
    """A plain-text table of the summary rows, one line per finding x case x variant."""
    if summary.empty:
        return "(no rows)"
    lines = []
    for row in summary.to_dict("records"):
        lines.append({
            "finding": row["finding"],
            "variant": row["variant"],
            "case": row["case"],
            "median": format_seconds(row.get("median_s")),
            "ratio [interval]": format_ratio(row),
            "allocs": _count(row, "allocations"),
            "syncs": _count(row, "host_syncs"),
            "verdict": verdict_word(row),
        })
    return pd.DataFrame(lines).to_string(index=False)


#: how a cell's sampling ended, from its rows' `stopped_by` (the first present wins)
_CELL_ENDS = (("time_budget", "{} spent {} budget"), ("max_samples", "{} hit the round cap"),
              ("precision_reached", "{} reached +-{precision}"),
              ("target_reached", "{} reached the spread target"),
              ("decided", "{} decided every word to +-{precision}"))


def sampling_line(summary: pd.DataFrame, precision: float,
                  margin: float = DEFAULT_MARGIN) -> str | None:
    """How a run's sampling went, in one line: how the timed cells ended (every word
    decided; stopped undecided at the `precision` half-width; the budget spent; the
    round cap), and the median IQR/median of the timed rows, called noisy above the
    run's `margin` (a sample's spread wider than the change that matters): e.g. 'sampling: 30 of 48 timed cells decided every word, 18 spent their
    budget; timing spread (median IQR/median) 4.1%'. None when nothing was timed."""
    if summary.empty or not {"stopped_by", "median_s", "iqr_s"} <= set(summary.columns):
        return None
    timed = summary[summary.stopped_by.notna() & summary.median_s.notna()]
    if timed.empty:
        return None
    ends = timed.groupby(["finding", "case"]).stopped_by.agg(set)
    counts = collections.Counter(
        next((reason for reason, _ in _CELL_ENDS if reason in reasons), "other") for reasons in ends)
    told = ", ".join(
        text.format(counts[reason], "its" if counts[reason] == 1 else "their",
                    precision=f"{100 * precision:.2g}%")
        for reason, text in _CELL_ENDS if counts[reason])
    cells = f"{len(ends)} timed cell" + ("" if len(ends) == 1 else "s")
    mode = "" if precision > 0 else "fixed budget (--precision 0), "
    line = f"sampling: {mode}{cells}" + (f": {told}" if told else "")
    spread = float((timed.iqr_s / timed.median_s).median())
    line += f"; timing spread (median IQR/median) {100 * spread:.2g}%"
    if spread > margin:
        line += (f" (noisy: above the {100 * margin:.2g}% margin; close words may need a "
                 "larger --budget or a quieter machine)")
    return line


#: a first call this long, and this many times a timed call, compiled (or loaded a cache)
COMPILED_S = 1.0
COMPILED_FACTOR = 100.0


def compiled_line(summary: pd.DataFrame) -> str | None:
    """The variants whose first call compiled in this run (torch.compile, numba: a first
    call over `COMPILED_S` and `COMPILED_FACTOR` times a timed one), or None. Such a first
    call does not tell cold caches from warm ones: a torch.compile that finds its code in
    the cache still traces the function."""
    if summary.empty or not {"first_output_s", "median_s"} <= set(summary.columns):
        return None
    slow = summary[(summary.first_output_s >= COMPILED_S)
                   & (summary.first_output_s >= COMPILED_FACTOR * summary.median_s)]
    if slow.empty:
        return None
    names = ", ".join(dict.fromkeys(f"{r.finding} {r.variant}" for r in slow.itertuples()))
    return (f"compiled in this run: {len(slow)} first call{'s' * (len(slow) > 1)} took "
            f"{slow.first_output_s.sum():.0f} s ({names}): compiling, or loading what an "
            "earlier run compiled (a torch.compile whose code is cached still traces the "
            "function, seconds)")


def load_line(summary: pd.DataFrame) -> str | None:
    """The cells timed while other processes kept busy the cores the cell's threads ran on
    (`timed_beside_load`: another job that started after the run chose its threads), and
    the headline cells whose one-thread processes were (`one_thread_beside_load`: every
    core busy), or None where none was (or the run did not record it)."""
    if summary.empty or "timed_beside_load" not in summary.columns:
        return None
    watched = summary[summary.others_busy_cores.notna()]
    cells = watched.drop_duplicates(["finding", "case"])
    loaded = cells[cells.timed_beside_load.eq(True)]
    alone = (cells[cells.one_thread_beside_load.eq(True)]
             if "one_thread_beside_load" in cells.columns else cells.iloc[:0])
    if loaded.empty and alone.empty:
        return None
    parts = []
    if not loaded.empty:
        parts.append(f"other processes kept {loaded.others_busy_cores.median():.1f} cores "
                     f"busy (median) while {len(loaded)} of {len(cells)} timed cells ran "
                     f"({_cell_names(loaded)})")
    if not alone.empty:
        parts.append(f"{'and' if parts else 'other processes kept'} every core busy while "
                     f"the one-thread processes of {len(alone)} headline "
                     f"cell{'s' * (len(alone) > 1)} ran ({_cell_names(alone)})")
    return (f"load: {' '.join(parts)}, leaving fewer free cores than the cells' threads: "
            "their threads waited for a core, so their times and ratios are a loaded "
            "machine's (on a quiet machine, or with --threads 1 beside the load, every cell "
            "is timed alike)")


def _cell_names(cells: pd.DataFrame) -> str:
    """'A c1, B c2 and 2 more': the first three of `cells` by finding and case."""
    names = ", ".join(f"{r.finding} {r.case}" for r in cells.head(3).itertuples())
    return names + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")


def process_line(summary: pd.DataFrame, level: dict | None) -> str | None:
    """The process level the run measured, in one line: how many processes timed its
    rows, how far a fresh process moved a ratio per call-length band (with the degrees of
    freedom that carries), how many rows' processes disagreed against how many chance
    allows, and whether that widened every interval. None for runs that did not measure
    it (they assumed it: run.json's `process_noise`)."""
    if not level or summary.empty or "processes" not in summary.columns:
        return None
    counts = summary.processes.dropna()
    if counts.empty:
        return None
    bands, borrowed = [], []
    lower = 0.0
    for band in level["bands"]:
        upper = band["upper_s"]
        where = (f"calls under {format_seconds(upper)}" if lower == 0.0 else
                 f"calls over {format_seconds(lower)}" if upper is None else
                 f"calls of {format_seconds(lower)}-{format_seconds(upper)}")
        if not band.get("worded", 1):
            pass  # no row of the run is that long
        elif band.get("own", True):
            bands.append(f"{100 * band['sd']:.2g}% at {where} ({band['df']:.0f} df)")
        else:
            borrowed.append(band)
        lower = upper or lower
    if borrowed:  # too few rows of their own: the whole run's pool
        pool = borrowed[0]
        bands.append(f"{100 * pool['sd']:.2g}% " + ("at every call length" if not bands else
                                                    "at the other lengths")
                     + f" ({pool['df']:.0f} df, the run's {pool['rows']} rows together)")
    calibration = level["calibration"]
    line = (f"processes: each row timed in {int(counts.min())}"
            + (f" to {int(counts.max())}" if counts.max() > counts.min() else "")
            + f" fresh processes; a process moved a ratio by {', '.join(bands)}; "
            f"{calibration['disagreeing']} of {calibration['rows']} rows' processes "
            f"disagreed (chance allows {calibration['expected']})")
    if calibration["inflation"] > 1.0:
        line += (f": too many, every interval widened x{calibration['inflation'] ** 0.5:.3g} "
                 "(this machine's processes vary more than the model they are pooled by)")
    return line


#: a cell's stages (`CaseRun.seconds`) in the words of the time line, in that order
_STAGES = (("time", "sampling"), ("check", "first calls and checks"), ("profile", "profiling"),
           ("build", "building inputs"), ("extra", "other measures"))


def time_line(cells: list[dict]) -> str | None:
    """Where a run's seconds went, from its journaled cells' `seconds`: 'time: 95 s
    sampling, 20 s first calls and checks, 22 s profiling, 3 s building inputs, 30 s in
    the workers' (their sampling counted with the run's). The budget bounds sampling;
    first calls (compiling) and profiling are reported apart. None for runs that journaled
    no stage times."""
    totals: dict[str, float] = {}
    for cell in cells:
        for stage, seconds in (cell.get("seconds") or {}).items():
            totals[stage] = totals.get(stage, 0.0) + float(seconds)
    if not totals:
        return None
    totals["time"] = totals.get("time", 0.0) + totals.get("worker_time", 0.0)
    parts = [f"{totals[key]:.0f} s {words}" for key, words in _STAGES if totals.get(key, 0) >= 0.5]
    if totals.get("worker_other", 0.0) >= 0.5:
        parts.append(f"{totals['worker_other']:.0f} s of the workers' inputs and first calls")
    line = "time: " + (", ".join(parts) or "under a second")
    unprofiled = sum(any(str(row.get("profile_note", "")).startswith(BUDGET_UNPROFILED)
                         for row in cell.get("summary") or []) for cell in cells)
    if unprofiled:
        line += (f"; {unprofiled} cell{'s' if unprofiled > 1 else ''} not profiled to keep "
                 "the budget (a larger --budget profiles it)")
    left_out = sum(bool(cell.get("summary")) and all(
        str(row.get("reason", "")).startswith(BUDGET_LEFT_OUT) for row in cell["summary"])
        for cell in cells)
    if left_out:
        line += (f"; {left_out} cell{'s' if left_out > 1 else ''} left out to keep the "
                 "budget, every finding's headline measured (a larger --budget measures them)")
    return line
