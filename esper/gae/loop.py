"""`loop`: the reviewed original, Python loops over envs and reversed steps.

The one method with a terminal reset to choose (`RESETS`, `Variants.reset`): the others
compute the trace cut as a coefficient and never allocate or branch at a terminal.
"""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, refuse_meta, step_counts_tensor, valid_mask
from esper.gae.recurrence import masked_outputs

#: How `gae_loop` resets the trace at a true terminal; the first is the original's.
RESETS: tuple[str, ...] = ("clone", "mask", "assign")


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

    Each `bool()` / `float()` of a tensor element is a host read (`aten::item`, a host
    sync on CUDA). `reset` picks how the trace is reset at a true terminal:

    - `clone`, the reviewed code (esper-lite 599f3895,
      src/esper/simic/agent/rollout_buffer.py:367-416), its branches and expressions as
      written there, so it makes exactly its host reads on every input: 3 per step of an
      episode (`float(dones[t] and not truncated[t])` reads `dones[t]` twice when it is
      False, and the reset's `if dones[t] and not truncated[t]` once more), 4 at a true
      terminal; and its allocations: a `zero.clone()` per env and one per true terminal.
      Where the original was wrong, at a truncation inside a row (it bootstrapped from the
      next episode's first value and carried the trace across), the correction is made
      on the device, with no read: the bootstrap value and a trace cut precomputed per
      call for every step. `tests/esper/gae/test_loop_reads.py` holds the counts to the
      original's, re-typed there.
    - `mask` (the review's option 3): the trace multiplied by a not-done factor
      precomputed per call; 2 host reads per step and no allocation for the reset.
    - `assign` (this project's, to isolate B4-DRL-03's allocation): `clone` with
      `last_gae = zero` where it clones, the branches and host reads left as they are.
      No op writes into `last_gae` in place, so sharing `zero` is safe.
    """
    if reset not in RESETS:
        raise ValueError(f"gae_loop: reset: expected one of {', '.join(RESETS)}; got {reset!r}")
    refuse_meta("gae_loop", rewards, step_counts)
    num_envs, max_steps = rewards.shape
    dtype, device = rewards.dtype, rewards.device
    zero = torch.zeros((), dtype=dtype, device=device)
    # 0-d tensors, as the original's gamma_t and gamma_lambda_t: `trace * last_gae` wraps
    # no Python scalar (an allocation per step)
    trace = torch.full((), gamma * gae_lambda, dtype=dtype, device=device)
    clone_like = reset != "mask"  # the original's branches: `clone` and `assign`
    allocate = reset == "clone"
    if clone_like:
        discount = torch.full((), gamma, dtype=dtype, device=device)
        # [E, T - 1]: the next value of an interior step, its own bootstrap value where it
        # is truncated; [E, T]: the trace factor, 0 where a truncation cuts it
        next_values = torch.where(truncated[:, :-1], bootstrap_values[:, :-1], values[:, 1:])
        cut_trace = trace * (~truncated).to(dtype)
    else:
        not_done_trace = trace * (~(dones | truncated)).to(dtype)  # [num_envs, max_steps]
    rows = []
    for env in range(num_envs):
        steps = int(step_counts[env])  # host sync when step_counts is a device tensor
        env_adv = torch.zeros(max_steps, dtype=dtype, device=device)
        done, trunc = dones[env], truncated[env]
        if clone_like:
            # one view per row, each step an element of it, as the original's row slices
            row_rewards, row_values, row_boot = rewards[env], values[env], bootstrap_values[env]
            row_next, row_trace = next_values[env], cut_trace[env]
            last_gae = zero.clone() if allocate else zero  # as rollout_buffer.py:388, per env
            for t in reversed(range(steps)):
                if t == steps - 1:
                    if trunc[t]:  # host sync
                        next_non_terminal = 1.0
                    else:
                        next_non_terminal = 1.0 - float(done[t])  # host sync
                    next_value = row_boot[t]  # 0 there unless truncated, as stored
                else:
                    next_value = row_next[t]
                    # host sync: 2 when done[t] is False (`and` hands float() the tensor)
                    next_non_terminal = 1.0 - float(done[t] and not trunc[t])
                if done[t] and not trunc[t]:  # host sync (x2 at a terminal)
                    last_gae = zero.clone() if allocate else zero
                delta = row_rewards[t] + discount * next_value * next_non_terminal - row_values[t]
                last_gae = delta + row_trace[t] * next_non_terminal * last_gae
                env_adv[t] = last_gae
        else:
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
                last_gae = delta + not_done_trace[env, t] * last_gae
                env_adv[t] = last_gae
        rows.append(env_adv)
    advantages = torch.stack(rows) if rows else torch.zeros_like(rewards)
    valid = valid_mask(step_counts_tensor(step_counts, device), max_steps)
    return masked_outputs(advantages, values, valid)
