"""`addcmul` (this project's): one Python loop over time, each step one `addcmul` over the
envs on a trace coefficient precomputed per call."""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, refuse_meta
from esper.gae.recurrence import gae_recurrence_terms, masked_outputs


def gae_addcmul(
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
    """One Python loop over time, vectorized across envs, each step
    `addcmul(delta[:, t], coef[:, t], last_gae)` on the terms `gae_recurrence_terms`
    precomputes (the trace cut folded into `coef`); ragged rows handled by masks.
    No host sync."""
    refuse_meta("gae_addcmul", rewards, step_counts)
    delta, coef, valid = gae_recurrence_terms(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    advantages = torch.empty_like(delta)
    last_gae = delta.new_zeros(delta.shape[0])  # [num_envs]; delta[:, 0] fails at 0 steps
    for t in reversed(range(delta.shape[1])):
        last_gae = torch.addcmul(delta[:, t], coef[:, t], last_gae)
        advantages[:, t] = last_gae
    return masked_outputs(advantages, values, valid)

