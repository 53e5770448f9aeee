"""`scan`: the recurrence solved by a parallel (Hillis-Steele) scan over time."""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, refuse_meta
from esper.gae.recurrence import gae_recurrence_terms, masked_outputs


def affine_suffix_scan(delta: Tensor, coef: Tensor) -> Tensor:
    """Solve `A_t = delta_t + coef_t * A_{t+1}` (A_T = 0) along dim 1 by a parallel scan.

    Hillis-Steele over the affine maps `x -> delta + coef * x`: after the step with
    offset `k`, position `t` holds the composition of the maps `t .. t+2k-1`. log2(T)
    sequential steps, each one vectorized over [num_envs, T]. Only products of
    coefficients in [0, 1] and sums appear, no division by cumulative products, so float32
    stays accurate for long rows (products underflow harmlessly to 0).

    delta, coef: [num_envs, T] -> A: [num_envs, T].
    """
    acc, mul = delta, coef
    max_steps = delta.shape[1]
    offset = 1
    while offset < max_steps:
        # compose map t with the map that starts `offset` later: x -> d_t + c_t (d_s + c_s x)
        tail_acc = torch.addcmul(acc[:, :-offset], mul[:, :-offset], acc[:, offset:])
        tail_mul = mul[:, :-offset] * mul[:, offset:]
        acc = torch.cat([tail_acc, acc[:, -offset:]], dim=1)
        mul = torch.cat([tail_mul, mul[:, -offset:]], dim=1)
        offset *= 2
    return acc


def gae_scan(
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
    """A parallel (associative) scan over time: O(log T) sequential steps. No host sync."""
    refuse_meta("gae_scan", rewards, step_counts)
    delta, coef, valid = gae_recurrence_terms(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    return masked_outputs(affine_suffix_scan(delta, coef), values, valid)

