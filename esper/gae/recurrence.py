"""GAE as an affine recurrence, `A_t = delta_t + coef_t * A_{t+1}`: the terms every
vectorized method solves, and the outputs every method returns."""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, step_counts_tensor, valid_mask


def gae_recurrence_terms(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    gamma: float | Tensor,
    gae_lambda: float | Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rewrite GAE as the affine recurrence `A_t = delta_t + coef_t * A_{t+1}`.

    Returns `(delta, coef, valid)`, each [num_envs, max_steps]; `delta` and `coef` are 0
    at and past `step_counts[e]`, so the recurrence gives 0 there and the trace is cut at
    each row's last valid step. `torch.where` (not multiplication) keeps stale padding,
    even NaN, out of every valid entry. `gamma` and `gae_lambda` are floats or 0-d
    tensors of the inputs' dtype (tensors keep them graph inputs under torch.compile).
    No host sync.
    """
    num_envs, max_steps = rewards.shape
    counts = step_counts_tensor(step_counts, rewards.device)
    valid = valid_mask(counts, max_steps)
    steps = torch.arange(max_steps, device=rewards.device)
    is_last = steps[None, :] == (counts - 1)[:, None]
    terminal = dones & ~truncated
    boot = truncated | is_last
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    next_values = torch.where(boot, bootstrap_values, next_values)
    bootstrapped = torch.where(terminal, torch.zeros_like(next_values), gamma * next_values)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    delta = torch.where(valid, rewards + bootstrapped - values, zero)
    # gamma * gae_lambda may be a float or a 0-d tensor (as the compiled method passes)
    coef = torch.where(valid & ~(dones | truncated), gamma * gae_lambda, zero)
    return delta, coef, valid



def masked_outputs(advantages: Tensor, values: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """`(advantages, returns)` with `returns = advantages + values` where `valid`, else 0.

    `advantages` must already be 0 past each row's count (every method's are); the
    returns are masked here, since `values` holds stale padding there.
    """
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return advantages, returns
