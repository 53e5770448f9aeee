"""The built-in findings' cells whose ratios move between fresh processes, as measured.

`esper_review/between_runs.json` is written by `benchmarks/verdict_stability.py noise`
from repeated default runs of one commit on the development machine (docs/statistics.md):
per cell, each row's spread between runs, and how many processes the run measures the
cell in. Each finding passes its part as `Finding.between_runs`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

#: the measured rows (benchmarks/verdict_stability.py noise writes it)
BETWEEN_RUNS = Path(__file__).resolve().parents[1] / "between_runs.json"


@functools.cache
def _measured() -> dict[str, dict]:
    """The file's findings, read once for every finding that asks."""
    return json.loads(BETWEEN_RUNS.read_text())["findings"]


def between_runs(finding_id: str) -> dict[str, dict]:
    """case label -> {"sd": {variant: sd, log units}, "processes": n} measured for
    `finding_id`; {} where nothing was measured to move."""
    return _measured().get(finding_id, {})
