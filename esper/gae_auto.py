"""`auto`: the fastest GAE method for the device and shape, from a measured crossover table.

TABLE_PLACEHOLDER
"""

from __future__ import annotations

from dataclasses import dataclass

from esper import gae
from esper.gae import StepCounts, Tensor


@dataclass(frozen=True)
class Crossover:
    """One row of the table: inputs up to these sizes rank the methods so."""

    device_type: str
    """`cpu` or `cuda`."""
    max_envs: int
    """The row applies to num_envs <= max_envs ..."""
    max_steps: int
    """... and max_steps <= max_steps (the first matching row wins)."""
    ranking: tuple[str, ...]
    """Methods, fastest first; `auto` takes the first one this machine has for the device."""
    measured: bool
    """False where the ranking is a reasoned default, not a measurement."""


_BIG = 1 << 62

#: Rows in order; the first row whose bounds hold is used. See the module docstring.
CROSSOVERS: tuple[Crossover, ...] = (
    Crossover("cpu", _BIG, _BIG, ("numba", "compiled", "scan", "batched"), True),
    # not yet measured on a GPU: one kernel launch beats log2(T) launches of the scan
    Crossover("cuda", _BIG, _BIG, ("triton", "scan"), False),
)


def choose(device_type: str, num_envs: int, max_steps: int) -> str:
    """The method `auto` runs for inputs [num_envs, max_steps] on `device_type`."""
    for row in CROSSOVERS:
        if row.device_type == device_type and num_envs <= row.max_envs and max_steps <= row.max_steps:
            for method in row.ranking:
                if method in gae.METHODS and device_type in gae.DEVICE_TYPES[method]:
                    return method
    return "scan"  # runs on every device


def gae_auto(
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
    """GAE by `choose(device, num_envs, max_steps)`; arguments and results as
    `esper.gae.compute_gae` (rewards etc. [num_envs, max_steps]; outputs the same shape,
    dtype and device). No host sync beyond the chosen method's (none for any fast one)."""
    method = choose(rewards.device.type, *rewards.shape)
    return gae.METHODS[method](
        rewards, values, dones, truncated, bootstrap_values, step_counts,
        gamma=gamma, gae_lambda=gae_lambda, reset=reset,
    )
