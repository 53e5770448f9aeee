"""A pre-allocated host-to-device copy: a host buffer written in place, moved in one copy.

Used where the reviewed system built new tensors every step or episode (H4, H5) or moved
many tensors one by one (rollout-buffer audit 1.3). The host buffer is pinned when the
device is CUDA, so the copy can run without blocking the host; before the host buffer is
written again, the previous copy out of it must have finished (one event per copy).
"""

from __future__ import annotations

import torch

from esper.checks import check_device

Tensor = torch.Tensor


class StagedCopy:
    """A host buffer `[*shape]` of `dtype` and its copy on `device`.

    `writable_host()` hands out the host buffer once the last copy out of it is done;
    `to_device()` moves it in one non-blocking copy and returns the device tensor. On a
    CPU device the host buffer is the result and nothing is copied.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.device = check_device("StagedCopy: device", device)
        on_cuda = self.device.type == "cuda"
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=on_cuda)
        self._device_buffer = (self.host if self.device.type == "cpu"
                               else torch.empty(shape, dtype=dtype, device=self.device))
        self._copied: torch.cuda.Event | None = None
        """Recorded on the current stream after the last copy out of a pinned `host`."""

    def writable_host(self) -> Tensor:
        """The host buffer, safe to overwrite: the previous copy out of it has finished."""
        if self._copied is not None:
            # host sync: a pinned buffer's pending copy would read what we are about to write;
            # the copy was queued a step (or an episode) ago, so this wait is nearly free
            self._copied.synchronize()
            self._copied = None
        return self.host

    def to_device(self, fresh: bool = False) -> Tensor:
        """The host buffer on the device, in one copy (none on the CPU).

        `fresh=False` copies into a buffer allocated once, which the next call overwrites:
        for consumers done with it before then (in stream order). `fresh=True` allocates
        the destination on each call, for results that callers may keep.
        """
        if self.device.type == "cpu":
            return self.host.clone() if fresh else self.host
        target = (torch.empty_like(self._device_buffer) if fresh else self._device_buffer)
        target.copy_(self.host, non_blocking=True)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device))
        return target
