"""Progress lines: what a step's seconds count."""

from __future__ import annotations

import io
import time

from harness.progress import Progress


def test_a_step_counts_from_the_end_of_work_a_note_says_is_done():
    """A warm step before the first cell is its own work: its seconds are not the cell's;
    a note about work still under way leaves the step's clock running."""
    stream = io.StringIO()
    with Progress(2, "cell", stream) as progress:
        time.sleep(0.3)
        progress.note("compile caches: warmed", done=True)
        progress.step("first")
        time.sleep(0.3)
        progress.note("still measuring")
        progress.step("second")
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("[")]
    first, second = (float(line.split(": ")[1].split(" s")[0]) for line in lines)
    assert first < 0.2 <= second
