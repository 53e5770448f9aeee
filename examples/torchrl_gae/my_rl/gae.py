"""Our GAE: the CleanRL-style loop backwards over time, vectorized over environments.

Shapes follow TorchRL's convention, time second to last: every tensor is
`[num_envs, num_steps, 1]`. `done` ends an episode (it cuts the lambda-trace);
`terminated` marks a true terminal (its bootstrap value is not used).
"""

from __future__ import annotations

import torch


def gae(gamma: float, lmbda: float, state_value: torch.Tensor, next_state_value: torch.Tensor,
        reward: torch.Tensor, done: torch.Tensor, terminated: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantage, value_target), each `[num_envs, num_steps, 1]` like the inputs."""
    not_done = (~done).to(reward.dtype)
    not_terminated = (~terminated).to(reward.dtype)
    delta = reward + gamma * next_state_value * not_terminated - state_value
    advantage = torch.empty_like(reward)
    last = torch.zeros_like(reward[:, 0])
    for t in reversed(range(reward.shape[-2])):
        last = delta[:, t] + gamma * lmbda * not_done[:, t] * last
        advantage[:, t] = last
    return advantage, advantage + state_value
