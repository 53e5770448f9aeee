"""`host_to_device_copies` (`harness.measure.counters`) of one call of each variant, as a
finding's `extra_metrics`: for the findings about transfers (H4, H5, audit 1.3)."""

from __future__ import annotations

from typing import Any, Callable

from harness.measure.counters import host_to_device_copies


def copies_metric(make_call: Callable[[str, Any], Callable[[], object]], device_key: str = "device"
                  ) -> Callable[[str, Any], dict[str, float]]:
    """A finding's `extra_metrics`: `host_to_device_copies` of one call of the variant, to
    the device its inputs hold under `device_key`."""
    def metric(variant: str, inputs: dict) -> dict[str, float]:
        call = make_call(variant, inputs)
        return {"host_to_device_copies": float(host_to_device_copies(call, inputs[device_key]))}

    return metric
