"""Device time of named code ranges on CUDA, from a pair of CUDA events per range.

Host wall time around a range of CUDA work measures its launches, not its kernels: a
sync-free method returns before its kernels run, and their time lands in whichever
later range first waits for the device. `DeviceSpans` records an event on the device's
current stream when a range starts and another when it ends; the pair's elapsed time is
the range's span on the device timeline, from when the stream reached the range's first
launch to when it finished its last one (including gaps where the device waited for the
host, as in a loop that syncs every step). Events are read only when asked, after the
fact, so timing a range adds no host sync to it.

On the CPU the host's clock is the device's: nothing is recorded and `seconds()` is {}.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch


class DeviceSpans:
    """Seconds on the device timeline of named ranges, summed per name.

    `cuda` is the CUDA API used (`torch.cuda`: `current_stream`, `Event`); tests pass a
    stand-in. Spans of one name add up; a span nested inside another counts in both
    (callers subtract, as the trainer does for GAE inside the update).
    """

    def __init__(self, device: torch.device | str, *, cuda=torch.cuda) -> None:
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda"
        self._cuda = cuda
        self._events: dict[str, list[tuple[object, object]]] = defaultdict(list)

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Time the body on the device's current stream (nothing on the CPU)."""
        if not self.enabled:
            yield
            return
        stream = self._cuda.current_stream(self.device)
        start = self._cuda.Event(enable_timing=True)
        start.record(stream)
        try:
            yield
        finally:
            end = self._cuda.Event(enable_timing=True)
            end.record(stream)  # the stream the range started on, where its work lands
            self._events[name].append((start, end))

    def seconds(self) -> dict[str, float]:
        """Name -> summed device seconds of its spans so far ({} on the CPU).

        Waits for each span's end event: call it after the work's own host sync (then it
        returns at once), not inside a range whose launches should stay asynchronous.
        """
        totals = {}
        for name, pairs in self._events.items():
            total_ms = 0.0
            for start, end in pairs:
                end.synchronize()  # host sync: elapsed_time needs the end event completed
                total_ms += start.elapsed_time(end)
            totals[name] = total_ms * 1e-3  # milliseconds -> seconds
        return totals

    def clear(self) -> None:
        """Forget every span (at the start of an iteration)."""
        self._events.clear()
