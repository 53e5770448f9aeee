"""Moving a rollout's tensors to another device: one copy each, or one flat copy (audit 1.3).

`RolloutBuffer.get_batched_sequences` moves 20+ tensors. The reviewed buffer calls
`.to(device, non_blocking=True)` on each (`move_per_tensor`): on CUDA 20+ allocations
and copies from pageable memory. `FlatTransfer` packs them byte-wise into one host buffer
allocated once (pinned when the target is CUDA), moves it in one copy and splits the
device copy into views of the original dtypes and shapes. Only a move from the host pays
off this way; tensors already on the target device are returned as they are either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esper.checks import check_device
from esper.rollout.staging import StagedCopy

Tensor = torch.Tensor
#: every packed tensor starts at a multiple of this many bytes, so that its byte view can
#: be viewed back as any dtype (`Tensor.view(dtype)` needs an aligned storage offset)
ALIGN = 16


def move_per_tensor(tensors: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """`{name: t.to(device)}`, non-blocking on CUDA: one copy per tensor (the original)."""
    non_blocking = device.type == "cuda"
    return {name: t.to(device, non_blocking=non_blocking) for name, t in tensors.items()}


@dataclass(frozen=True)
class _Slot:
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class FlatTransfer:
    """Moves a fixed set of named host tensors to `device` in one copy.

    The layout (names, dtypes, shapes) is fixed by the first call; a later call with
    another layout builds a new staging buffer. Each call returns new device tensors
    (views of one fresh device allocation), so earlier results stay valid.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = check_device("FlatTransfer: device", device)
        self._layout: dict[str, _Slot] = {}
        self._staged: StagedCopy | None = None

    def __call__(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """`{name: host tensor}` -> `{name: tensor on device}`, equal values, contiguous."""
        if not self._matches(tensors):
            self._plan(tensors)
        host = self._staged.writable_host()
        for name, tensor in tensors.items():  # pack: one host copy per tensor, no allocation
            slot = self._layout[name]
            host[slot.offset: slot.offset + slot.nbytes].copy_(
                tensor.reshape(-1).view(torch.uint8))  # [*shape] -> [numel * itemsize] bytes
        flat = self._staged.to_device(fresh=True)
        return {name: flat[s.offset: s.offset + s.nbytes].view(s.dtype).view(s.shape)
                for name, s in self._layout.items()}

    def _matches(self, tensors: dict[str, Tensor]) -> bool:
        return (list(tensors) == list(self._layout) and all(
            t.dtype == self._layout[n].dtype and tuple(t.shape) == self._layout[n].shape
            for n, t in tensors.items()))

    def _plan(self, tensors: dict[str, Tensor]) -> None:
        offset, layout = 0, {}
        for name, tensor in tensors.items():
            if tensor.device.type != "cpu":
                raise ValueError(f"FlatTransfer: {name}: expected a host tensor; "
                                 f"got one on {tensor.device}")
            nbytes = tensor.numel() * tensor.element_size()
            layout[name] = _Slot(offset, nbytes, tensor.dtype, tuple(tensor.shape))
            offset += -(-nbytes // ALIGN) * ALIGN  # round up to the alignment
        self._layout = layout
        self._staged = StagedCopy((max(offset, ALIGN),), torch.uint8, self.device)
