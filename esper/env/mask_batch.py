"""One step's action masks of every env as `{head: [N, K] bool}` on the device (review H5).

esper-lite builds each env's masks on the device (`compute_action_masks(device=...)`,
2df957ed src/esper/tamiyo/policy/action_masks.py:122-172: `torch.zeros`/`torch.ones`
per head and one element write per allowed entry) and stacks them per head every step
(epoch), in a dict comprehension (src/esper/simic/training/vectorized.py:1568-1571):
`{key: torch.stack([m[key] for m in all_masks]).to(device) for key in ...}`, where the
`.to(device)` moves nothing (the masks are already there). `Variants.masks` picks:

- `stack`: that (per-env masks on the device, one new stacked tensor per head);
- `preallocated`: the review's fix, the same per-env device masks copied row by row into
  `[N, K]` device tensors allocated once, `batch_masks[key][i] = mask[key]` (one
  device-to-device copy per env and head);
- `packed`: this project's design, per-env masks built on the host, written by one
  `torch.cat(..., out=)` into a host buffer allocated once (pinned on CUDA) and moved in
  one copy into a device buffer allocated once, split into `[N, K]` views.

`MaskBatcher.source` says where the per-env masks must be built for the mode
(`MorphoEnv.action_masks(device)`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.checks import check_choice, check_device
from esper.rollout.staging import StagedCopy
from esper.variants import AXES

Tensor = torch.Tensor
#: `Variants.masks`' values, the original's first
MODES = AXES["masks"]


class MaskBatcher:
    """Batches the per-env masks `{head: [K] bool}` of `num_envs` envs for `device`.

    `preallocated` and `packed` return tensors (or views) that the next call overwrites:
    consumers use them within the step (the policy's forward, the buffer's `add`), in
    stream order.
    """

    def __init__(self, num_envs: int, device: torch.device | str, mode: str = "stack") -> None:
        check_choice("MaskBatcher: mode", mode, MODES)
        self.num_envs, self.mode = num_envs, mode
        self.device = check_device("MaskBatcher: device", device)
        self.source: torch.device | None = None if mode == "packed" else self.device
        """Where each env's masks are built for this mode: the device (the original, and
        the review's fix), or None for the host (`packed`)."""
        self._batch: dict[str, Tensor] | None = None
        self._staged: StagedCopy | None = None
        if mode == "preallocated":
            self._batch = {head: torch.zeros(num_envs, size, dtype=torch.bool, device=self.device)
                           for head, size in HEAD_SIZES.items()}
        elif mode == "packed":
            self._staged = StagedCopy((num_envs, sum(HEAD_SIZES.values())), torch.bool, self.device)
            self._host_flat = self._staged.host.view(-1)  # [N, sum K] -> [N * sum K], env-major
            self._views = _split_heads(self._staged.to_device())

    def __call__(self, per_env: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
        """`per_env[i]` = env i's `{head: [K] bool}` (on `source`) -> `{head: [N, K] bool}`."""
        if len(per_env) != self.num_envs:
            raise ValueError(f"MaskBatcher: expected the masks of {self.num_envs} envs; "
                             f"got {len(per_env)}")
        if self.mode == "stack":
            # the reviewed lines; .to(device) is a no-op, the masks being on the device
            return {key: torch.stack([m[key] for m in per_env]).to(self.device)
                    for key in per_env[0].keys()}
        if self._batch is not None:
            # the review's fix, as it writes it: one row copy per env and head
            for i, mask in enumerate(per_env):
                for key in mask:
                    self._batch[key][i] = mask[key]
            return dict(self._batch)
        self._staged.writable_host()
        # env-major, heads side by side: exactly the row-major layout of [N, sum K]
        torch.cat([m[head] for m in per_env for head in HEAD_NAMES], out=self._host_flat)
        self._staged.to_device()
        return dict(self._views)


def masks_to_device(masks: Mapping[str, Tensor], device: torch.device | str) -> dict[str, Tensor]:
    """One step's action masks `{head: [N, K] bool}` on `device`, in a single transfer.

    Copying each head (or, in `add`, each env's row of each head) from the host would be
    8 (or 8 x N) copies per step, each blocking on CUDA. The heads are packed side by side
    into one [N, sum K] tensor, copied once without blocking (no host sync), and split
    back into [N, K] views. Masks already on `device` are returned as they are.
    """
    device = torch.device(device)
    if all(mask.device == device for mask in masks.values()):
        return dict(masks)
    heads = list(masks)
    packed = torch.cat([masks[head] for head in heads], dim=1)  # {head: [N, K]} -> [N, sum K]
    moved = packed.to(device, non_blocking=True)  # a pageable source is staged before return
    return dict(zip(heads, moved.split([masks[head].shape[1] for head in heads], dim=1)))


def _split_heads(packed: Tensor) -> dict[str, Tensor]:
    """`[N, sum K]` -> `{head: [N, K]}` views, heads in `HEAD_NAMES` order."""
    return dict(zip(HEAD_NAMES, packed.split([HEAD_SIZES[h] for h in HEAD_NAMES], dim=1)))
