"""The states of the bootstrap forward at an episode's end, on the device (review H4).

At a truncated episode end the value of the state after the last action bootstraps the
return. The reviewed system builds that state per env from its feature list:
`torch.tensor([post_action_features], dtype=torch.float32, device=device)`, a new tensor
and a host-to-device copy per env per episode. `Variants.bootstrap` picks that (`tensor`)
or a buffer allocated once, its rows written from the lists on the host and moved in one
copy (`copy`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from esper.checks import check_choice
from esper.rollout.staging import StagedCopy
from esper.variants import AXES

Tensor = torch.Tensor
#: `Variants.bootstrap`'s values, the original's first
MODES = AXES["bootstrap"]


class BootstrapStates:
    """`features` (one list of `dim` floats per env) -> raw states `[N, dim]` f32 on `device`.

    `copy` returns a buffer that the next call overwrites: the caller normalises it (a
    new tensor) before the next episode ends.
    """

    def __init__(self, num_envs: int, dim: int, device: torch.device | str,
                 mode: str = "tensor") -> None:
        check_choice("BootstrapStates: mode", mode, MODES)
        self.num_envs, self.dim, self.device, self.mode = num_envs, dim, torch.device(device), mode
        self._staged = (StagedCopy((num_envs, dim), torch.float32, self.device)
                        if mode == "copy" else None)

    def __call__(self, features: Sequence[Sequence[float]]) -> Tensor:
        if len(features) != self.num_envs:
            raise ValueError(f"BootstrapStates: expected the features of {self.num_envs} envs; "
                             f"got {len(features)}")
        if self._staged is None:
            # the reviewed code: per env a [1, dim] tensor made on the device from a list
            rows = [torch.tensor([f], dtype=torch.float32, device=self.device) for f in features]
            return torch.cat(rows)  # N x [1, dim] -> [N, dim]
        host = self._staged.writable_host().numpy()  # a view: rows are written from the lists
        for i, row in enumerate(features):
            host[i] = row
        return self._staged.to_device()
