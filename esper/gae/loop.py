"""`loop`: the reviewed original, Python loops over envs and reversed steps.

The one method with a terminal reset to choose (`RESETS`, `Variants.reset`): the others
compute the trace cut as a coefficient and never allocate or branch at a terminal.
"""

from __future__ import annotations

import torch

from esper.gae.inputs import StepCounts, Tensor, refuse_meta, step_counts_tensor, valid_mask
from esper.gae.recurrence import masked_outputs

#: How `gae_loop` resets the trace at a true terminal; the first is the original's.
RESETS: tuple[str, ...] = ("clone", "mask", "assign", "restructured")
#: the resets that run the reviewed function's lines (the others rewrite them)
_REVIEWED_LINES = ("clone", "mask", "assign")


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
    reset: str = "restructured",
) -> tuple[Tensor, Tensor]:
    """The original: Python loops over envs and reversed steps on 0-d tensor elements.

    Each `bool()` / `float()` of a tensor element is a host read (`aten::item`, a host
    sync on CUDA). `reset` picks how the trace is reset at a true terminal:

    - `clone`, the reviewed code (esper-lite 599f3895,
      src/esper/simic/agent/rollout_buffer.py:367-416), line by line: the same torch ops,
      host reads and allocations in the same order, on every input whose truncations all
      come at a row's last step (`tests/esper/gae/test_loop_reads.py` holds it to the
      original, re-typed there). It reads 3 times per step of an episode and 4 at a true
      terminal, and allocates a `zero_tensor.clone()` per env (388) and per true
      terminal (409). Its outputs stand for the buffer's `advantages` and `returns`,
      which the original allocated once: two `zeros_like` per call here.
    - `mask`, the ticket's option 3 applied to those lines and no others: a
      `done_mask = (dones & ~truncated).float()` per env before its time loop, the
      reset at 407-409 removed and the trace at 412 multiplied by `1 - done_mask[t]`;
      2 host reads per step, no clone at a terminal (the one per env at 388 stays).
    - `assign` (this project's, to isolate B4-DRL-03's allocation): `clone` with
      `last_gae = zero_tensor` where it clones, the branches and host reads as they are.
      No op writes into `last_gae` in place, so sharing `zero_tensor` is safe.
    - `restructured` (this project's): a loop of its own shape, the trace multiplied by a
      not-done factor precomputed per call, 2 host reads per step; it computes the
      semantics of `esper.gae` on every input.

    Where the reviewed code was wrong, these three correct it with no op of their own on
    inputs where it was right: at a truncation before a row's last step (done set too,
    as the reviewed trainer stores it) the reads it makes anyway tell, and the step then
    bootstraps from `bootstrap_values[t]` (one more index) and cuts the trace; at a row's
    last step that is neither done nor truncated (a row cut mid-episode) it bootstraps
    from `bootstrap_values[t]` (one more index) where the original took 0. A truncation
    before a row's last step whose done is False is read as the reviewed code reads it
    (it never reads `truncated` there): the trace is carried across it. Store a time
    limit with done set, as the reviewed trainer does, or use `restructured` or another
    method.
    """
    if reset not in RESETS:
        raise ValueError(f"gae_loop: reset: expected one of {', '.join(RESETS)}; got {reset!r}")
    refuse_meta("gae_loop", rewards, step_counts)
    if reset in _REVIEWED_LINES:
        return _reviewed_lines(rewards, values, dones, truncated, bootstrap_values,
                               step_counts, gamma, gae_lambda, reset)
    return _restructured(rewards, values, dones, truncated, bootstrap_values, step_counts,
                         gamma, gae_lambda)


def _reviewed_lines(rewards: Tensor, all_values: Tensor, all_dones: Tensor,
                    all_truncated: Tensor, all_bootstrap: Tensor, step_counts: StepCounts,
                    gamma: float, gae_lambda: float, reset: str) -> tuple[Tensor, Tensor]:
    """rollout_buffer.py:367-416 @599f3895 as `gae_loop` describes for `clone`, `mask`
    and `assign`; `self.x` are the arguments, `self.advantages` / `self.returns` the
    outputs (0 past each row's count, as every method returns)."""
    dtype, device = rewards.dtype, rewards.device
    out_advantages = torch.zeros_like(rewards)
    out_returns = torch.zeros_like(rewards)
    clone = reset == "clone"
    option3 = reset == "mask"
    zero_tensor = torch.tensor(0.0, device=device, dtype=dtype)  # 368
    gamma_t = torch.tensor(gamma, device=device, dtype=dtype)  # 372
    gamma_lambda_t = torch.tensor(gamma * gae_lambda, device=device, dtype=dtype)  # 373

    for env_id in range(rewards.shape[0]):
        num_steps = int(step_counts[env_id])  # a host read when the counts are a tensor
        if num_steps == 0:
            continue
        values = all_values[env_id, :num_steps]  # 381-385
        env_rewards = rewards[env_id, :num_steps]
        dones = all_dones[env_id, :num_steps]
        truncated = all_truncated[env_id, :num_steps]
        bootstrap_values = all_bootstrap[env_id, :num_steps]
        if option3:
            # option 3, "pre-computed outside loop" (`.float()` there: the inputs' dtype
            # here, the same op, so that float64 inputs keep their precision)
            done_mask = (dones & ~truncated).to(dtype)

        advantages = torch.zeros(num_steps, device=device, dtype=dtype)  # 387
        last_gae = zero_tensor.clone() if clone or option3 else zero_tensor  # 388

        for t in reversed(range(num_steps)):
            if t == num_steps - 1:  # 391-401
                if truncated[t]:
                    next_value = bootstrap_values[t]
                    next_non_terminal = 1.0
                else:
                    next_value = zero_tensor
                    next_non_terminal = 1.0 - float(dones[t])
                    if next_non_terminal == 1.0:  # cut mid-episode: its bootstrap, not 0
                        next_value = bootstrap_values[t]
            else:  # 402-405, `float(dones[t] and not truncated[t])` read as Python does
                next_value = values[t + 1]
                done = dones[t]
                if done:
                    true_terminal = not truncated[t]
                    next_non_terminal = 1.0 - float(true_terminal)
                    if not true_terminal:  # a time limit inside the row: bootstrap, cut
                        next_value = bootstrap_values[t]
                        last_gae = zero_tensor
                else:
                    next_non_terminal = 1.0 - float(done)

            if not option3 and dones[t] and not truncated[t]:  # 407-409
                last_gae = zero_tensor.clone() if clone else zero_tensor

            delta = env_rewards[t] + gamma_t * next_value * next_non_terminal - values[t]  # 411
            if option3:  # 412 as option 3 writes it
                last_gae = delta + gamma * gae_lambda * (1 - done_mask[t]) * last_gae
            else:
                last_gae = delta + gamma_lambda_t * next_non_terminal * last_gae  # 412
            advantages[t] = last_gae  # 413

        out_advantages[env_id, :num_steps] = advantages  # 415-416
        out_returns[env_id, :num_steps] = advantages + values
    return out_advantages, out_returns


def _restructured(rewards: Tensor, values: Tensor, dones: Tensor, truncated: Tensor,
                  bootstrap_values: Tensor, step_counts: StepCounts, gamma: float,
                  gae_lambda: float) -> tuple[Tensor, Tensor]:
    """`gae_loop`'s `restructured` reset: per step 2 host reads, no branch or allocation
    at a terminal, the trace multiplied by a not-done factor precomputed per call."""
    num_envs, max_steps = rewards.shape
    dtype, device = rewards.dtype, rewards.device
    zero = torch.zeros((), dtype=dtype, device=device)
    trace = torch.full((), gamma * gae_lambda, dtype=dtype, device=device)
    not_done_trace = trace * (~(dones | truncated)).to(dtype)  # [num_envs, max_steps]
    rows = []
    for env in range(num_envs):
        steps = int(step_counts[env])  # host sync when step_counts is a device tensor
        env_adv = torch.zeros(max_steps, dtype=dtype, device=device)
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
            last_gae = delta + not_done_trace[env, t] * last_gae
            env_adv[t] = last_gae
        rows.append(env_adv)
    advantages = torch.stack(rows) if rows else torch.zeros_like(rewards)
    valid = valid_mask(step_counts_tensor(step_counts, device), max_steps)
    return masked_outputs(advantages, values, valid)
