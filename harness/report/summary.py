"""The end-of-run table: finding, variant, case, median, ratio with CI, counters, verdict."""

from __future__ import annotations

import math

import pandas as pd


def format_seconds(seconds: float | None) -> str:
    """1.5e-05 -> '15.0 us'; None/NaN -> '-'."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


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
    verdict = row.get("verdict") or row.get("status")
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
            "ratio [95% CI]": format_ratio(row),
            "allocs": _count(row, "allocations"),
            "syncs": _count(row, "host_syncs"),
            "verdict": verdict_word(row),
        })
    return pd.DataFrame(lines).to_string(index=False)
