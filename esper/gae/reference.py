"""A float64 pure-Python GAE, written straight from the semantics in `esper.gae`.

Slow and obvious on purpose: it is the oracle that every method of `esper.gae` and the
harness's correctness gate are checked against.
"""

from __future__ import annotations

from typing import Sequence

import torch


def reference_gae_rows(
    rewards: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    dones: Sequence[Sequence[bool]],
    truncated: Sequence[Sequence[bool]],
    bootstrap_values: Sequence[Sequence[float]],
    step_counts: Sequence[int],
    gamma: float,
    gae_lambda: float,
) -> tuple[list[list[float]], list[list[float]]]:
    """Nested lists [num_envs][max_steps] in, (advantages, returns) as nested lists out."""
    advantages, returns = [], []
    for env, steps in enumerate(step_counts):
        width = len(rewards[env])
        adv = [0.0] * width
        ret = [0.0] * width
        next_adv = 0.0
        for t in reversed(range(steps)):
            done = dones[env][t] or truncated[env][t]
            terminal = dones[env][t] and not truncated[env][t]
            boot = truncated[env][t] or t == steps - 1
            next_value = bootstrap_values[env][t] if boot else values[env][t + 1]
            delta = rewards[env][t] + gamma * (0.0 if terminal else next_value) - values[env][t]
            next_adv = delta + gamma * gae_lambda * (0.0 if done else next_adv)
            adv[t] = next_adv
            ret[t] = next_adv + values[env][t]
        advantages.append(adv)
        returns.append(ret)
    return advantages, returns


def reference_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    truncated: torch.Tensor,
    bootstrap_values: torch.Tensor,
    step_counts: Sequence[int] | torch.Tensor,
    *,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference_gae_rows` on tensors [num_envs, max_steps]; outputs float64 on the CPU."""
    as_rows = [t.detach().cpu().double().tolist() for t in (rewards, values, bootstrap_values)]
    flags = [t.detach().cpu().tolist() for t in (dones, truncated)]
    counts = step_counts.tolist() if isinstance(step_counts, torch.Tensor) else list(step_counts)
    adv, ret = reference_gae_rows(
        as_rows[0], as_rows[1], flags[0], flags[1], as_rows[2], counts, gamma, gae_lambda
    )
    shape = tuple(rewards.shape)
    return (
        torch.tensor(adv, dtype=torch.float64).reshape(shape),
        torch.tensor(ret, dtype=torch.float64).reshape(shape),
    )
