"""`batched`: B4-CR-03's Recommended Fix, one Python loop over time vectorized over envs."""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, refuse_meta, step_counts_tensor, valid_mask
from esper.gae.recurrence import masked_outputs


def gae_batched(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    *,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """The ticket's `compute_advantages_vectorized` (B4-CR-03-gae-vectorization.md,
    "Recommended Fix"), its loop over time as written:

        gae = delta[:, t] + gamma * gae_lambda * (1 - dones[:, t]) * gae
        advantages[:, t] = gae

    on [num_envs] tensors, after `delta` for every env and step at once and
    `advantages = torch.zeros_like(rewards)`, `gae = torch.zeros(num_envs)`; then
    `returns = advantages + values`.

    What the ticket's sketch leaves out is filled in before the loop, so that it computes
    the semantics of `esper.gae`: its `1 - dones` of a bool tensor raises, so the flags
    are floats of the inputs' dtype; `1 - dones` in the loop cuts the trace where a step
    is done, truncated or past the row's count (`ends`), and in `delta` only at a true
    terminal; the next value, `cat([values[:, 1:], values[:, -1:]])` there, is
    `bootstrap_values` at a truncation and at each row's last step; `delta` and the
    returns are 0 past each row's count (the sketch assumed every row full).
    No host sync.
    """
    refuse_meta("gae_batched", rewards, step_counts)
    num_envs, max_steps = rewards.shape
    dtype, device = rewards.dtype, rewards.device
    counts = step_counts_tensor(step_counts, device)
    valid = valid_mask(counts, max_steps)  # [num_envs, max_steps]
    is_last = torch.arange(max_steps, device=device)[None, :] == (counts - 1)[:, None]
    ends = (dones | truncated | ~valid).to(dtype)  # the loop's `dones`: where the trace stops
    terminal = (dones & ~truncated).to(dtype)  # delta's `dones`: no bootstrap
    next_values = torch.cat([values[:, 1:], values[:, -1:]], dim=1)
    next_values = torch.where(truncated | is_last, bootstrap_values, next_values)
    delta = torch.where(valid, rewards + gamma * next_values * (1 - terminal) - values,
                        torch.zeros((), dtype=dtype, device=device))

    advantages = torch.zeros_like(rewards)
    gae = torch.zeros(num_envs, device=device, dtype=dtype)
    for t in reversed(range(max_steps)):
        gae = delta[:, t] + gamma * gae_lambda * (1 - ends[:, t]) * gae
        advantages[:, t] = gae
    return masked_outputs(advantages, values, valid)
