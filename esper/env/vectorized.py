"""`VectorizedMorphoEnv`: N independent environments on one device."""

from __future__ import annotations

from typing import Sequence

import torch

from esper.agent.heads import HEAD_NAMES
from esper.checks import check_device
from esper.env.config import EnvConfig
from esper.env.environment import OBS_DIM, MorphoEnv
from esper.variants import Variants


class VectorizedMorphoEnv:
    """`config.num_envs` independent `MorphoEnv`s on one device, env i seeded by index i.

    `step` is the plain serial reference (one host read per step); a trainer that wants
    per-env CUDA streams drives `envs[i].apply_action / launch_epoch / observe` itself.
    """

    def __init__(self, config: EnvConfig, device: torch.device | str = "cpu",
                 variants: Variants | None = None,
                 tasks: Sequence[tuple[torch.Tensor, ...]] | None = None) -> None:
        self.config = config
        self.device = check_device("VectorizedMorphoEnv: device", device)
        tasks = tasks if tasks is not None else [None] * config.num_envs
        self.envs = [MorphoEnv(config, i, self.device, variants, task)
                     for i, task in zip(range(config.num_envs), tasks)]
        self.obs_dim = OBS_DIM

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self, host_states: list[dict[str, torch.Tensor]] | None = None) -> torch.Tensor:
        """Reset every env (with `host_states`, each env's host weights restored from its
        entry: `MorphoEnv.reset`); observations `[N, obs_dim]` f32 CPU."""
        if host_states is None:
            return torch.stack([env.reset() for env in self.envs])
        return torch.stack([env.reset(state) for env, state in zip(self.envs, host_states)])

    def observations(self) -> torch.Tensor:
        """Every env's current observation `[N, obs_dim]` f32 CPU."""
        return torch.stack([env.observation() for env in self.envs])

    @property
    def tasks(self) -> list[tuple[torch.Tensor, ...]]:
        """Each env's data on the device (to share with envs recreated for a new batch)."""
        return [env.task for env in self.envs]

    def action_masks(self) -> dict[str, torch.Tensor]:
        """`{head: bool [N, K]}` on CPU."""
        per_env = [env.action_masks() for env in self.envs]
        return {head: torch.stack([m[head] for m in per_env]) for head in HEAD_NAMES}

    def _split_actions(self, actions: dict[str, torch.Tensor]) -> list[dict[str, int]]:
        for head in HEAD_NAMES:
            value = actions.get(head)
            if not isinstance(value, torch.Tensor) or value.shape != (self.num_envs,):
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else value
                raise ValueError(
                    f"actions[{head!r}]: expected an int64 tensor of shape ({self.num_envs},); got {got!r}"
                )
        # host read of the actions (a sync if they live on an accelerator)
        columns = {head: actions[head].tolist() for head in HEAD_NAMES}
        return [{head: columns[head][i] for head in HEAD_NAMES} for i in range(self.num_envs)]

    def step(self, actions: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Apply `{head: int64 [N]}`, run one epoch per env, observe.

        Returns `obs [N, obs_dim] f32`, `rewards [N] f32` and `metrics [N, 3] f32`
        (train_loss, val_loss, val_acc), all on CPU.
        """
        for env, action in zip(self.envs, self._split_actions(actions)):
            env.apply_action(action)
        metrics = torch.stack([env.launch_epoch() for env in self.envs])  # [N, 3] on device
        metrics = metrics.cpu()  # host sync: the one read of this step
        results = [env.observe(row) for env, row in zip(self.envs, metrics)]
        obs = torch.stack([o for o, _ in results])
        rewards = torch.tensor([r for _, r in results], dtype=torch.float32)
        return obs, rewards, metrics
