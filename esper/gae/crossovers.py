"""Which GAE method is fastest where: the measured crossover table that `auto` reads.

CPU rows: measured with `python -m esper_review.gae_tools.crossovers` (its default: 1 torch thread)
on a 2-core CPU (AMD EPYC, 2 vCPUs, 32 MiB L3), torch 2.13, numba 0.68, idle (an
earlier run under load gave the same rankings with times up to 2x higher). Median
microseconds per call, float32, random terminals, gamma 0.995, lambda 0.98 (numba's JIT
and torch.compile's first call, 0.3 s and 3.2 s with warm disk caches, paid before timing):

    | envs | steps | addcmul (us) | scan (us) | compiled (us) | numba (us) | fastest |
    |---:|---:|---:|---:|---:|---:|---|
    | 1 | 25 | 268.6 | 168.0 | 111.2 | 23.9 | numba |
    | 1 | 128 | 957.2 | 207.0 | 117.7 | 24.2 | numba |
    | 1 | 256 | 1836.2 | 227.6 | 125.1 | 24.6 | numba |
    | 1 | 1024 | 6679.8 | 294.8 | 171.0 | 26.0 | numba |
    | 4 | 25 | 296.4 | 196.1 | 97.1 | 26.1 | numba |
    | 4 | 128 | 1046.1 | 251.8 | 105.1 | 25.0 | numba |
    | 4 | 256 | 1946.3 | 288.2 | 111.5 | 25.5 | numba |
    | 4 | 1024 | 6876.6 | 384.2 | 195.8 | 28.1 | numba |
    | 16 | 25 | 286.9 | 200.4 | 94.2 | 25.0 | numba |
    | 16 | 128 | 1043.9 | 266.7 | 120.5 | 25.9 | numba |
    | 16 | 256 | 1930.4 | 314.5 | 167.2 | 27.8 | numba |
    | 16 | 1024 | 7027.4 | 527.3 | 420.3 | 41.1 | numba |
    | 64 | 25 | 320.8 | 215.3 | 121.0 | 28.6 | numba |
    | 64 | 128 | 1183.6 | 320.0 | 216.3 | 33.3 | numba |
    | 64 | 256 | 2059.6 | 426.4 | 383.9 | 41.1 | numba |
    | 64 | 1024 | 8040.3 | 1322.5 | 1672.1 | 97.0 | numba |
    | 256 | 25 | 351.7 | 259.4 | 212.6 | 43.9 | numba |
    | 256 | 128 | 1436.8 | 642.4 | 713.5 | 65.4 | numba |
    | 256 | 256 | 2527.2 | 1013.0 | 1328.4 | 92.9 | numba |
    | 256 | 1024 | 13237.5 | 6908.7 | 8190.9 | 387.7 | numba |
    | 1024 | 25 | 524.7 | 466.6 | 649.3 | 101.3 | numba |
    | 1024 | 128 | 2456.7 | 1766.8 | 2121.6 | 192.0 | numba |
    | 1024 | 256 | 5699.7 | 5007.5 | 7597.6 | 382.6 | numba |
    | 1024 | 1024 | 42287.7 | 29061.1 | 37423.4 | 2063.1 | numba |

numba is fastest at every shape (3.7-14x the next method). The rows below also keep the
runner-up right, for machines without numba: `compiled` at small shapes (per-call
overhead dominates, and its one fused graph has the least), `scan` from about 64 x 1024
or 256 x 128 up (compiled's fixed-depth scan does more work per element). At 64 x 256
compiled and scan were within 10% of each other. `addcmul` is last except at 1024 x 256
and 1024 x 25 (ahead of compiled). Re-measure on the target machine, idle, before
relying on the runner-up order.

CUDA row: not measured (no GPU here); a reasoned default.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    # proposed by `python -m esper_review.gae_tools.crossovers` from the table above
    Crossover("cpu", 16, 1024, ("numba", "compiled", "scan", "addcmul"), True),
    Crossover("cpu", 64, 256, ("numba", "compiled", "scan", "addcmul"), True),
    Crossover("cpu", 256, 25, ("numba", "compiled", "scan", "addcmul"), True),
    Crossover("cpu", UNBOUNDED, UNBOUNDED, ("numba", "scan", "compiled", "addcmul"), True),
    # not yet measured on a GPU: one kernel launch beats log2(T) launches of the scan
    Crossover("cuda", UNBOUNDED, UNBOUNDED, ("triton", "scan"), False),
)
