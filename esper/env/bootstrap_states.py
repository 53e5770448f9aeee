"""The bootstrap values at an episode's end, from each env's features (review H4).

At a truncated episode end the value of the state after the last action bootstraps the
return. esper-lite computes it env by env inside its per-env loop (2df957ed
src/esper/simic/training/vectorized.py:1954-1973): the state as a new tensor made on the
device from the env's feature list, `torch.tensor([post_action_features],
dtype=torch.float32, device=device)`, normalised, a batch-1 `get_action(...,
deterministic=True)` of the whole policy (LSTM and every head) with the env's carried
LSTM state and masks, and `bootstrap_tensor[0].item()`: per env a host-to-device copy, a
forward and a host read. `Variants.bootstrap` picks:

- `tensor`: that path;
- `copy`: the review's fix, the same path with each env's state copied into a `[1, D]`
  device buffer allocated once, `buffer[0].copy_(torch.as_tensor(features))`;
- `packed`: this project's design, every env's row written into one staged host buffer
  allocated once (pinned on CUDA), moved in one copy, one batched value-only forward
  (`FactoredRecurrentActorCritic.value`) and one read.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from esper.agent.policy import FactoredRecurrentActorCritic, Hidden
from esper.checks import check_choice, check_device
from esper.rollout.staging import StagedCopy
from esper.variants import AXES

Tensor = torch.Tensor
#: `Variants.bootstrap`'s values, the original's first
MODES = AXES["bootstrap"]


class BootstrapStates:
    """Bootstrap values `[N]` float32 on the host of `num_envs` envs on `device`.

    Called with each env's features (one list of `dim` floats per env), the observation
    normaliser's `normalize`, the policy, the carried LSTM state `(h, c)` (each `[L, N, H]`)
    and the step's masks `{head: [N, K] bool}` on the device. Every mode computes the same
    values up to float rounding (a batch-1 and a batch-N forward may round differently).
    """

    def __init__(self, num_envs: int, dim: int, device: torch.device | str,
                 mode: str = "tensor") -> None:
        check_choice("BootstrapStates: mode", mode, MODES)
        self.num_envs, self.dim, self.mode = num_envs, dim, mode
        self.device = check_device("BootstrapStates: device", device)
        # the review's fix: one [1, dim] device buffer per env, allocated once
        self._buffers = ([torch.zeros(1, dim, device=self.device) for _ in range(num_envs)]
                         if mode == "copy" else None)
        self._staged = (StagedCopy((num_envs, dim), torch.float32, self.device)
                        if mode == "packed" else None)

    def __call__(self, features: Sequence[Sequence[float]],
                 normalize: Callable[[Tensor], Tensor], policy: FactoredRecurrentActorCritic,
                 hidden: Hidden, masks: Mapping[str, Tensor]) -> Tensor:
        if len(features) != self.num_envs:
            raise ValueError(f"BootstrapStates: expected the features of {self.num_envs} envs; "
                             f"got {len(features)}")
        if self._staged is not None:
            host = self._staged.writable_host().numpy()  # a view: rows are written from the lists
            for i, row in enumerate(features):
                host[i] = row
            raw = self._staged.to_device()  # [N, dim]
            # host sync: the one read of every env's value
            return policy.value(normalize(raw), hidden).cpu()
        values = []
        for i, row in enumerate(features):  # as vectorized.py:1954-1973 @2df957ed, per env
            # env i's carried state [L, 1, H] (its `env_state.lstm_hidden`, 1627-1631)
            lstm_hidden = tuple(t[:, i:i + 1, :].contiguous() for t in hidden)
            state = self._state(i, row)  # [1, dim] on the device
            env_masks = {head: m[i] for head, m in masks.items()}
            out = policy.act(normalize(state),
                             {head: mask.unsqueeze(0) for head, mask in env_masks.items()},
                             lstm_hidden, deterministic=True)
            values.append(out.value[0].item())  # host sync: once per env, as the original
        return torch.tensor(values)  # [N] float32

    def _state(self, i: int, row: Sequence[float]) -> Tensor:
        """Env i's raw state `[1, dim]` on the device."""
        if self._buffers is None:
            # the reviewed line: a new tensor made on the device from the list
            return torch.tensor([row], dtype=torch.float32, device=self.device)
        buffer = self._buffers[i]
        buffer[0].copy_(torch.as_tensor(row, dtype=torch.float32))
        return buffer
