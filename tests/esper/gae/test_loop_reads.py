"""The `loop` method with `reset="clone"` reads the host as the reviewed original does.

B4-CR-03 and B4-DRL-03 measure the original's loop: its cost is its host reads (each
`bool()` / `float()` of a tensor element is an `aten::_local_scalar_dense`, a host sync
on CUDA) and its allocations. `original_gae` below is that loop, re-typed from esper-lite
at 599f3895, src/esper/simic/agent/rollout_buffer.py:367-416 (`self.x` made arguments,
nothing else changed), so the counts of ours can be held to it on the same inputs.
"""

from __future__ import annotations

import pytest
import torch

from esper.gae import compute_gae
from harness.measure.counters import profile_call
from tests.gae_inputs import GaeCase, make_case

DEFAULT_GAMMA = 0.995


def original_gae(values, rewards, dones, truncated, bootstrap_values, step_counts, device,
                 gamma=DEFAULT_GAMMA, gae_lambda=0.95):
    """esper-lite 599f3895 rollout_buffer.py:367-416, `compute_advantages_and_returns`,
    verbatim but for `self.`: returns (advantages, returns) [num_envs, max_steps]."""
    num_envs = values.shape[0]
    out_advantages = torch.zeros_like(values)
    out_returns = torch.zeros_like(values)
    # ---- 367-416, verbatim
    # PERF: Pre-allocate zero tensor once (avoid O(steps * envs) allocations)
    zero_tensor = torch.tensor(0.0, device=device)

    # PERF: Pre-compute constants as tensors to avoid Python/tensor type mixing
    # in hot loop. This prevents type promotion overhead and ensures consistent dtype.
    gamma_t = torch.tensor(gamma, device=device, dtype=values.dtype)
    gamma_lambda_t = torch.tensor(gamma * gae_lambda, device=device, dtype=values.dtype)

    for env_id in range(num_envs):
        num_steps = step_counts[env_id]
        if num_steps == 0:
            continue

        # Work with valid slice only
        env_values = values[env_id, :num_steps]
        env_rewards = rewards[env_id, :num_steps]
        env_dones = dones[env_id, :num_steps]
        env_truncated = truncated[env_id, :num_steps]
        env_bootstrap_values = bootstrap_values[env_id, :num_steps]

        advantages = torch.zeros(num_steps, device=device)
        last_gae = zero_tensor.clone()  # Clone to avoid in-place modification

        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                # Last step: use bootstrap value if truncated
                if env_truncated[t]:
                    next_value = env_bootstrap_values[t]
                    next_non_terminal = 1.0
                else:
                    next_value = zero_tensor
                    next_non_terminal = 1.0 - float(env_dones[t])
            else:
                next_value = env_values[t + 1]
                # For non-terminal steps, only reset on TRUE terminal (not truncation)
                next_non_terminal = 1.0 - float(env_dones[t] and not env_truncated[t])

            # Reset GAE at true terminal (not truncation)
            if env_dones[t] and not env_truncated[t]:
                last_gae = zero_tensor.clone()

            delta = env_rewards[t] + gamma_t * next_value * next_non_terminal - env_values[t]
            last_gae = delta + gamma_lambda_t * next_non_terminal * last_gae
            advantages[t] = last_gae

        out_advantages[env_id, :num_steps] = advantages
        out_returns[env_id, :num_steps] = advantages + env_values
    # ---- end of 367-416
    return out_advantages, out_returns


def episodes(num_envs: int, max_steps: int, seed: int) -> GaeCase:
    """What the trainer stores: one episode a row, done and truncated at its last step
    with a bootstrap value there, 0 elsewhere."""
    case = make_case(num_envs, max_steps, seed, p_done=0.0, p_trunc=0.0, dtype=torch.float32,
                     step_counts=[max_steps] * num_envs, stale_padding=False)
    case.dones[:, -1] = case.truncated[:, -1] = True
    case.bootstrap_values[:, :-1] = 0.0
    return case


def terminals(num_envs: int, max_steps: int, seed: int) -> GaeCase:
    """True terminals anywhere, no truncation, bootstrap 0 (as the original stores it)."""
    case = make_case(num_envs, max_steps, seed, p_done=0.2, p_trunc=0.0, dtype=torch.float32,
                     stale_padding=False)
    case.bootstrap_values.zero_()
    return case


def anything(num_envs: int, max_steps: int, seed: int) -> GaeCase:
    """Terminals and truncations anywhere, interior truncations included."""
    return make_case(num_envs, max_steps, seed, p_done=0.2, p_trunc=0.2, dtype=torch.float32,
                     stale_padding=False)


def ours(case: GaeCase, gamma=DEFAULT_GAMMA, gae_lambda=0.95):
    return compute_gae(*case.args(), gamma=gamma, gae_lambda=gae_lambda, method="loop",
                       reset="clone")


def original(case: GaeCase, gamma=DEFAULT_GAMMA, gae_lambda=0.95):
    return original_gae(case.values, case.rewards, case.dones, case.truncated,
                        case.bootstrap_values, case.step_counts, case.rewards.device,
                        gamma, gae_lambda)


@pytest.mark.parametrize("make", [episodes, terminals, anything])
@pytest.mark.parametrize("num_envs, max_steps, seed", [(4, 25, 0), (3, 7, 1), (5, 12, 2)])
def test_the_clone_loop_reads_the_host_exactly_as_the_original(make, num_envs, max_steps, seed):
    """The same `aten::_local_scalar_dense` count per call on every input, interior
    truncations too: ours handles those on the device (the original read nothing more
    there either: it just got them wrong)."""
    case = make(num_envs, max_steps, seed)
    got = profile_call(lambda: ours(case))
    want = profile_call(lambda: original(case))
    assert got.host_syncs == want.host_syncs > 0


def test_the_original_reads_three_times_per_step_of_an_episode():
    """notes 29, section 6: 300 reads per 4 x 25 call, 75 per env, 3 per step."""
    assert profile_call(lambda: original(episodes(4, 25, 0))).host_syncs == 300
    assert profile_call(lambda: ours(episodes(4, 25, 0))).host_syncs == 300


@pytest.mark.parametrize("make", [episodes, terminals])
def test_the_clone_loop_computes_what_the_original_computes_without_interior_truncation(make):
    case = make(4, 25, 3)
    for got, want in zip(ours(case), original(case)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_the_clone_loop_allocates_as_the_original():
    """One `zero.clone()` per env and one per true terminal, a zeros row per env."""
    case = terminals(4, 25, 4)
    got = profile_call(lambda: ours(case)).ops.get("aten::clone", 0)
    want = profile_call(lambda: original(case)).ops.get("aten::clone", 0)
    assert got == want > 4


@pytest.mark.parametrize("make", [episodes, terminals, anything])
def test_the_clone_loop_allocates_and_dispatches_about_as_the_original(make):
    """Per step the same arithmetic on 0-d tensors; per call a few more tensors (the
    interior next values and trace cut, the valid mask) and about 5% more ops."""
    case = make(4, 25, 5)
    got = profile_call(lambda: ours(case))
    want = profile_call(lambda: original(case))
    assert abs(got.allocations - want.allocations) <= 8, (got.allocations, want.allocations)
    assert want.op_calls <= got.op_calls <= 1.1 * want.op_calls, (got.op_calls, want.op_calls)
