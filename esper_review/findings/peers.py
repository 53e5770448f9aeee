"""Other libraries' GAE, timed next to ours as comparators ("peers") in B4-CR-03.

Each peer takes the finding's env-major inputs ([num_envs, max_steps], full rows: every
env has `max_steps` valid steps) and rearranges them once, when the case is built, into
the layout its library keeps rollouts in (`prepare`, not timed). The timed call
(`compute`) runs only the library's own computation and returns the advantages as an
env-major [num_envs, max_steps] view, so the harness checks them against the float64
reference like any of our methods.

- `torchrl`, `torchrl_vec`: TorchRL's `generalized_advantage_estimate` (a loop over
  time) and `vec_generalized_advantage_estimate` (a convolution with gamma*lambda
  powers, cut below 1e-7) on [num_envs, max_steps, 1] tensors, time_dim=-2. TorchRL is
  optional: install it with the `peers` extra (`pip install -e ".[peers]"`).
- `sb3_numpy`: the algorithm of Stable-Baselines3's `RolloutBuffer` (our own code, not
  SB3's): time-major [max_steps, num_envs] float32 numpy arrays, the truncation
  bootstrap folded into the reward at collection time (r + gamma * V_boot at truncated
  steps), `episode_starts`, and one numpy loop over time. Host only.

Mapping of our flags (see `esper.gae`): TorchRL's `terminated` = dones & ~truncated
(zeroes the bootstrap), `done` = dones | truncated (cuts the trace); SB3's
`episode_starts[t + 1]` = dones_t | truncated_t.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import multiprocessing
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

Tensor = torch.Tensor

INSTALL_HINT = 'install the `peers` extra: pip install -e ".[peers]"'


def _next_values(values: Tensor, truncated: Tensor, bootstrap_values: Tensor) -> Tensor:
    """[E, T]: bootstrap_values where truncated or at a row's last step, else values[:, t+1]."""
    shifted = torch.cat([values[:, 1:], bootstrap_values[:, -1:]], dim=1)
    return torch.where(truncated, bootstrap_values, shifted)


# --------------------------------------------------------------------------- TorchRL

def torchrl_inputs(rewards: Tensor, values: Tensor, dones: Tensor, truncated: Tensor,
                   bootstrap_values: Tensor, gamma: float) -> dict[str, Tensor]:
    """TorchRL's layout: [E, T] -> [E, T, 1] each (time_dim=-2), on the inputs' device.

    Keys: state_value, next_state_value, reward (floats), done, terminated (bool).
    `gamma` is unused (a uniform signature with `sb3_inputs`).
    """
    return {
        "state_value": values.unsqueeze(-1),  # [E, T] -> [E, T, 1]
        "next_state_value": _next_values(values, truncated, bootstrap_values).unsqueeze(-1),
        "reward": rewards.unsqueeze(-1),
        "done": (dones | truncated).unsqueeze(-1),
        "terminated": (dones & ~truncated).unsqueeze(-1),
    }


@functools.cache
def _torchrl_function(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """`torchrl.objectives.value.functional.<name>`, imported once (seconds, on first use).

    TorchRL's import sets the process's multiprocessing start method to spawn; the one
    the process had is put back, so that a peer's import changes nothing else in the
    process timing it (under spawn, a lock torch.compile's progress bar makes later is a
    named semaphore, reported as leaked when the run's process ends)."""
    method = multiprocessing.get_start_method(allow_none=True)
    module = importlib.import_module("torchrl.objectives.value.functional")
    if multiprocessing.get_start_method(allow_none=True) != method:
        multiprocessing.set_start_method(method, force=True)
    return getattr(module, name)


def _torchrl_gae(name: str, inputs: dict[str, Tensor], gamma: float,
                 gae_lambda: float) -> Tensor:
    advantage, _ = _torchrl_function(name)(gamma, gae_lambda, time_dim=-2, **inputs)
    return advantage.squeeze(-1)  # [E, T, 1] -> [E, T]


def torchrl_gae(inputs: dict[str, Tensor], gamma: float, gae_lambda: float) -> Tensor:
    """TorchRL's loop GAE on `torchrl_inputs`: advantages [E, T]."""
    return _torchrl_gae("generalized_advantage_estimate", inputs, gamma, gae_lambda)


def torchrl_vec_gae(inputs: dict[str, Tensor], gamma: float, gae_lambda: float) -> Tensor:
    """TorchRL's vectorized GAE on `torchrl_inputs`: advantages [E, T]."""
    return _torchrl_gae("vec_generalized_advantage_estimate", inputs, gamma, gae_lambda)


# ------------------------------------------------------------------- SB3-style numpy

@dataclass(frozen=True)
class Sb3Rollout:
    """A rollout as SB3's `RolloutBuffer` holds it: time-major float32 numpy arrays."""

    rewards: np.ndarray
    """[T, E]; at truncated steps r + gamma * V_boot (folded in at collection time)."""
    values: np.ndarray
    """[T, E]."""
    episode_starts: np.ndarray
    """[T, E] 1.0 where a step begins an episode: the step after any end (dones | truncated)."""
    last_values: np.ndarray
    """[E] V of the observation after the last step (our bootstrap_values[:, -1])."""
    last_dones: np.ndarray
    """[E] 1.0 where the last step ended an episode (terminal or truncated)."""


def sb3_inputs(rewards: Tensor, values: Tensor, dones: Tensor, truncated: Tensor,
               bootstrap_values: Tensor, gamma: float) -> Sb3Rollout:
    """SB3's layout from env-major [E, T] tensors (copied to the host, transposed)."""
    ended = (dones | truncated).cpu().numpy().T  # [E, T] -> [T, E]
    boot = bootstrap_values.detach().cpu().numpy().T.astype(np.float32)
    folded = rewards.detach().cpu().numpy().T.astype(np.float32)
    folded = np.where(truncated.cpu().numpy().T, folded + np.float32(gamma) * boot, folded)
    starts = np.zeros_like(folded)
    starts[1:] = ended[:-1]
    return Sb3Rollout(
        rewards=np.ascontiguousarray(folded, dtype=np.float32),
        values=np.ascontiguousarray(values.detach().cpu().numpy().T, dtype=np.float32),
        episode_starts=starts,
        last_values=np.ascontiguousarray(boot[-1]),
        last_dones=ended[-1].astype(np.float32),
    )


def sb3_numpy_gae(rollout: Sb3Rollout, gamma: float, gae_lambda: float) -> Tensor:
    """SB3's GAE recurrence, one numpy step per time step: advantages as an [E, T] view
    of the [T, E] float32 array it fills."""
    steps = rollout.rewards.shape[0]
    advantages = np.zeros_like(rollout.rewards)  # [T, E]
    last_gae = np.zeros_like(rollout.last_values)  # [E]
    for t in reversed(range(steps)):
        if t == steps - 1:
            next_non_terminal = 1.0 - rollout.last_dones
            next_values = rollout.last_values
        else:
            next_non_terminal = 1.0 - rollout.episode_starts[t + 1]
            next_values = rollout.values[t + 1]
        delta = rollout.rewards[t] + gamma * next_values * next_non_terminal - rollout.values[t]
        last_gae = delta + gamma * gae_lambda * next_non_terminal * last_gae
        advantages[t] = last_gae
    return torch.from_numpy(advantages).T  # [T, E] -> [E, T] view


# -------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Peer:
    """A comparator: how its inputs are laid out, how it is called, where it runs."""

    prepare: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float], Any]
    """(rewards, values, dones, truncated, bootstrap_values [E, T], gamma) -> native inputs."""
    compute: Callable[[Any, float, float], Tensor]
    """(native inputs, gamma, gae_lambda) -> advantages [E, T] (a view)."""
    device_types: tuple[str, ...]
    """Where it runs: `cpu`, `cuda`."""
    module: str | None = None
    """The optional package it needs (None: numpy and torch only)."""


PEERS: dict[str, Peer] = {
    "torchrl": Peer(torchrl_inputs, torchrl_gae, ("cpu", "cuda"), "torchrl"),
    "torchrl_vec": Peer(torchrl_inputs, torchrl_vec_gae, ("cpu", "cuda"), "torchrl"),
    "sb3_numpy": Peer(sb3_inputs, sb3_numpy_gae, ("cpu",)),
}


def installed(peer: str) -> bool:
    """Whether the package `peer` needs is importable here."""
    module = PEERS[peer].module
    return module is None or importlib.util.find_spec(module) is not None
