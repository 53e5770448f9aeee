"""`loop`: the reviewed original, Python loops over envs and reversed steps.

The one method with a terminal reset to choose (`RESETS`, `Variants.reset`): the others
compute the trace cut as a coefficient and never allocate or branch at a terminal.
"""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, step_counts_tensor, valid_mask
from esper.gae.recurrence import masked_outputs

#: How `gae_loop` resets the trace at a true terminal; the first is the original's.
RESETS: tuple[str, ...] = ("clone", "mask")


def gae_loop(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    *,
    gamma: float,
    gae_lambda: float,
    reset: str = "mask",
) -> tuple[Tensor, Tensor]:
    """The original: Python loops over envs and reversed steps on 0-d tensor elements.

    Each `if` on a tensor element is a host sync (`aten::item`), about two per step, as in
    the reviewed code. `reset="clone"` resets the trace with `zero.clone()` at each true
    terminal (one allocation each, as the original); `reset="mask"` multiplies by a
    not-done factor precomputed per env, with no allocation for the reset.
    """
    if reset not in RESETS:
        raise ValueError(f"gae_loop: reset: expected one of {', '.join(RESETS)}; got {reset!r}")
    num_envs, max_steps = rewards.shape
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    # a 0-d tensor, so `trace * last_gae` wraps no Python scalar (an allocation per step)
    # and the two resets differ by exactly their reset
    trace = torch.full((), gamma * gae_lambda, dtype=rewards.dtype, device=rewards.device)
    if reset == "mask":
        not_done_trace = trace * (~(dones | truncated)).to(rewards.dtype)  # [num_envs, max_steps]
    rows = []
    for env in range(num_envs):
        steps = int(step_counts[env])  # host sync when step_counts is a device tensor
        env_adv = torch.zeros(max_steps, dtype=rewards.dtype, device=rewards.device)
        done, trunc = dones[env], truncated[env]
        last_gae = zero
        for t in reversed(range(steps)):
            terminal = bool(done[t]) and not bool(trunc[t])  # host sync x2
            if terminal:
                delta = rewards[env, t] - values[env, t]
            else:
                if bool(trunc[t]) or t == steps - 1:  # host sync
                    next_value = bootstrap_values[env, t]
                else:
                    next_value = values[env, t + 1]
                delta = rewards[env, t] + gamma * next_value - values[env, t]
            if reset == "clone":
                if terminal:
                    last_gae = zero.clone()
                elif bool(trunc[t]):  # cut the trace at an interior truncation
                    last_gae = zero
                last_gae = delta + trace * last_gae
            else:
                last_gae = delta + not_done_trace[env, t] * last_gae
            env_adv[t] = last_gae
        rows.append(env_adv)
    advantages = torch.stack(rows) if rows else torch.zeros_like(rewards)
    valid = valid_mask(step_counts_tensor(step_counts, rewards.device), max_steps)
    return masked_outputs(advantages, values, valid)

