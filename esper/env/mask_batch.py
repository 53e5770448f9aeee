"""One step's action masks of every env as `{head: [N, K] bool}` on the device (review H5).

The reviewed system stacks the envs' masks per head on every step (epoch):
`{key: torch.stack([m[key] for m in all_masks]).to(device) for key in ...}`, new tensors
each time. `Variants.masks` picks that (`stack`) or tensors allocated once and written in
place (`preallocated`). Either way the step's masks reach the device in one transfer.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.rollout.buffer import masks_to_device
from esper.rollout.staging import StagedCopy

Tensor = torch.Tensor
MODES = ("stack", "preallocated")


class MaskBatcher:
    """Batches the per-env masks `{head: [K] bool}` of `num_envs` envs for `device`.

    `stack`: one `torch.stack` per head (8 new host tensors per step), then the packed
    transfer of `esper.rollout.buffer.masks_to_device`. `preallocated`: every env's masks written
    by one `torch.cat(..., out=)` into a host buffer `[N, sum K]` allocated once (pinned on
    CUDA), moved in one copy into a device buffer allocated once, and split into `[N, K]`
    views. Those views are overwritten by the next call: consumers use them within the
    step (the policy's forward, the buffer's `add`), in stream order.
    """

    def __init__(self, num_envs: int, device: torch.device | str, mode: str = "stack") -> None:
        if mode not in MODES:
            raise ValueError(f"MaskBatcher: mode: expected one of {', '.join(MODES)}; got {mode!r}")
        self.num_envs, self.device, self.mode = num_envs, torch.device(device), mode
        self._staged: StagedCopy | None = None
        if mode == "preallocated":
            self._staged = StagedCopy((num_envs, sum(HEAD_SIZES.values())), torch.bool, self.device)
            self._host_flat = self._staged.host.view(-1)  # [N, sum K] -> [N * sum K], env-major
            self._views = _split_heads(self._staged.to_device())

    def __call__(self, per_env: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
        """`per_env[i]` = env i's `{head: [K] bool}` on the host -> `{head: [N, K] bool}`."""
        if len(per_env) != self.num_envs:
            raise ValueError(f"MaskBatcher: expected the masks of {self.num_envs} envs; "
                             f"got {len(per_env)}")
        if self._staged is None:
            stacked = {head: torch.stack([m[head] for m in per_env]) for head in HEAD_NAMES}
            return masks_to_device(stacked, self.device)
        self._staged.writable_host()
        # env-major, heads side by side: exactly the row-major layout of [N, sum K]
        torch.cat([m[head] for m in per_env for head in HEAD_NAMES], out=self._host_flat)
        self._staged.to_device()
        return dict(self._views)


def _split_heads(packed: Tensor) -> dict[str, Tensor]:
    """`[N, sum K]` -> `{head: [N, K]}` views, heads in `HEAD_NAMES` order."""
    return dict(zip(HEAD_NAMES, packed.split([HEAD_SIZES[h] for h in HEAD_NAMES], dim=1)))
