"""Progress of a long command on stderr: a bar on a terminal, plain lines elsewhere.

A carriage-return bar is unreadable in a CI log or a file (one long line of redraws), so
where stderr is not a terminal each step prints one line of its own instead:

    [ 3/36] MY-rowsums rows=256,cols=64: 1.3 s
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Counts `total` steps of a command; `step(label)` after each one.

    Args:
        total: steps expected.
        unit: what a step is, for the bar (`cell`, `iter`).
        stream: where to write (default stderr).
        interactive: a bar (True) or lines (False); default: whether `stream` is a terminal.
    """

    def __init__(self, total: int, unit: str, stream: TextIO | None = None,
                 interactive: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done = total, 0
        if interactive is None:
            interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = tqdm(total=total, unit=unit, file=self.stream) if interactive else None
        self._started = time.perf_counter()

    def describe(self, label: str) -> None:
        """What is being worked on now (shown on the bar; lines say it when a step ends)."""
        if self._bar is not None:
            self._bar.set_description(label)

    def note(self, text: str, *, done: bool = False) -> None:
        """Say what a long piece of work outside the steps is doing (one line); `done`:
        that work has ended, and its seconds are not the next step's."""
        if self._bar is not None:
            self._bar.set_description(text)
        else:
            print(text, file=self.stream, flush=True)
        if done:
            self._started = time.perf_counter()

    def step(self, label: str, detail: str = "") -> None:
        """One step done: advance the bar, or print `[ k/total] label: seconds (detail)`."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            return
        seconds = time.perf_counter() - self._started
        width = len(str(self.total))
        extra = f", {detail}" if detail else ""
        print(f"[{self.done:{width}d}/{self.total}] {label}: {seconds:.1f} s{extra}",
              file=self.stream, flush=True)
        self._started = time.perf_counter()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
