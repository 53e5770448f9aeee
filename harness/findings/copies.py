"""Host-to-device copies of one call, for the findings about transfers (H4, H5, audit 1.3).

On CUDA the profiler's device activity names each copy (`Memcpy HtoD (Pageable ->
Device)`, `... (Pinned -> Device)`): those are counted. On the CPU there is no device to
copy to, unless a finding moves to the `meta` device as a stand-in, whose copies move no
bytes but are real dispatcher calls: those are counted by a dispatch mode.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.measure.counters import kineto_events, profiling

COPY_OPS = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)


class _HostToOtherDevice(TorchDispatchMode):
    """Counts copies whose source is on the host and whose result is not."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in COPY_OPS:
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            if source.device.type == "cpu" and out.device.type != "cpu":
                self.copies += 1
        return out


def host_to_device_copies(call: Callable[[], object], device: torch.device) -> int:
    """Copies from the host to `device` during one `call()` (0 when `device` is the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        with profiling(device) as prof:
            call()
            torch.cuda.synchronize(device)
        return sum(1 for e in kineto_events(prof) if e.on_device and e.name.startswith("Memcpy HtoD"))
    with _HostToOtherDevice() as mode:
        call()
    return mode.copies


def copies_metric(make_call: Callable[[str, Any], Callable[[], object]], device_key: str = "device"
                  ) -> Callable[[str, Any], dict[str, float]]:
    """A finding's `extra_metrics`: `host_to_device_copies` of one call of the variant, to
    the device its inputs hold under `device_key`."""
    def metric(variant: str, inputs: dict) -> dict[str, float]:
        call = make_call(variant, inputs)
        return {"host_to_device_copies": float(host_to_device_copies(call, inputs[device_key]))}

    return metric
