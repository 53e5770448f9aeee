"""`auto`: the fastest GAE method for the device and shape, from a measured crossover table.

CPU rows: measured with `python -m harness.gae_crossovers` (its default: 1 torch thread)
on a 2-core CPU (AMD EPYC, 2 vCPUs, 32 MiB L3), torch 2.13, numba 0.68, under load:
another benchmark kept both cores busy during the run, so absolute times are inflated
and noisy; the rankings were wide apart except where noted. Median microseconds per
call, float32, random terminals, gamma 0.995, lambda 0.98 (numba's JIT and
torch.compile's first call paid before timing):

    | envs | steps | batched (us) | scan (us) | compiled (us) | numba (us) | fastest |
    |---:|---:|---:|---:|---:|---:|---|
    | 1 | 25 | 263.7 | 173.1 | 133.8 | 24.5 | numba |
    | 1 | 128 | 1092.6 | 222.4 | 163.9 | 25.8 | numba |
    | 1 | 256 | 1972.6 | 243.1 | 174.9 | 24.9 | numba |
    | 1 | 1024 | 6793.1 | 324.1 | 212.3 | 26.3 | numba |
    | 4 | 25 | 300.7 | 198.8 | 104.1 | 25.8 | numba |
    | 4 | 128 | 1046.1 | 269.1 | 107.4 | 25.4 | numba |
    | 4 | 256 | 1983.8 | 298.5 | 116.3 | 25.6 | numba |
    | 4 | 1024 | 6887.3 | 393.4 | 210.4 | 27.9 | numba |
    | 16 | 25 | 299.4 | 203.5 | 101.7 | 25.2 | numba |
    | 16 | 128 | 1066.8 | 275.7 | 125.4 | 26.8 | numba |
    | 16 | 256 | 2009.4 | 329.2 | 183.7 | 28.1 | numba |
    | 16 | 1024 | 7110.1 | 587.8 | 508.7 | 43.6 | numba |
    | 64 | 25 | 333.0 | 216.9 | 132.4 | 28.8 | numba |
    | 64 | 128 | 1177.9 | 339.5 | 226.6 | 35.0 | numba |
    | 64 | 256 | 2149.7 | 471.4 | 441.8 | 42.8 | numba |
    | 64 | 1024 | 8247.9 | 1488.3 | 1584.6 | 101.3 | numba |
    | 256 | 25 | 367.1 | 271.0 | 234.9 | 44.7 | numba |
    | 256 | 128 | 1421.3 | 664.4 | 747.7 | 69.6 | numba |
    | 256 | 256 | 2760.1 | 1210.5 | 1483.4 | 102.4 | numba |
    | 256 | 1024 | 13119.7 | 5172.8 | 8597.5 | 420.4 | numba |
    | 1024 | 25 | 619.2 | 489.0 | 621.0 | 105.6 | numba |
    | 1024 | 128 | 2570.0 | 1902.5 | 2231.9 | 196.8 | numba |
    | 1024 | 256 | 6369.9 | 6217.7 | 8575.6 | 412.2 | numba |
    | 1024 | 1024 | 33759.7 | 29018.3 | 32254.6 | 1969.4 | numba |

numba is fastest at every shape (4-15x the next method). The rows below also keep the
runner-up right, for machines without numba: `compiled` at small shapes (per-call
overhead dominates, and its one fused graph has the least), `scan` from about 64 x 1024
or 256 x 128 up (compiled's fixed-depth scan does more work per element). At 64 x 256
compiled and scan were within 7% of each other. `batched` is last except at 1024 x 256
(ahead of compiled) and 1024 x 25 (tied with it). Re-measure on the target machine, idle,
before relying on the runner-up order.

CUDA row: not measured (no GPU here); a reasoned default.
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


#: A bound that no input reaches: the row applies to every size.
UNBOUNDED = 1 << 62

#: Rows in order; the first row whose bounds hold is used. See the module docstring.
CROSSOVERS: tuple[Crossover, ...] = (
    # proposed by `python -m harness.gae_crossovers` from the table above
    Crossover("cpu", 16, 1024, ("numba", "compiled", "scan", "batched"), True),
    Crossover("cpu", 64, 256, ("numba", "compiled", "scan", "batched"), True),
    Crossover("cpu", 256, 25, ("numba", "compiled", "scan", "batched"), True),
    Crossover("cpu", UNBOUNDED, UNBOUNDED, ("numba", "scan", "compiled", "batched"), True),
    # not yet measured on a GPU: one kernel launch beats log2(T) launches of the scan
    Crossover("cuda", UNBOUNDED, UNBOUNDED, ("triton", "scan"), False),
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
