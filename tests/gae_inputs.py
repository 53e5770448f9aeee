"""Random GAE inputs with stale padding, shared by the GAE and buffer tests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from esper.gae import DEVICE_TYPES, METHODS

#: The GAE method whose first call per dtype (and the first that needs a backward)
#: compiles with torch.compile: 10-18 s each on the 2-core CPU with a cold inductor cache,
#: 1-3 s with a warm one. Its graph is one per process and dtype, so a session pays it
#: once whatever runs it; the tests where it runs are marked `slow`, so that
#: `pytest -m "not slow"` never compiles.
COMPILED = "compiled"

#: the methods that take CPU tensors on this machine (`triton` only under Triton's
#: interpreter); on a CUDA machine the others are tested on CUDA tensors
CPU_METHODS = [m for m in METHODS if "cpu" in DEVICE_TYPES[m]]
#: the methods that take CUDA tensors where torch has a GPU (`triton` only there)
CUDA_METHODS = [m for m in METHODS if "cuda" in DEVICE_TYPES[m]]


def method_params(methods) -> list:
    """`methods` as pytest parameters, the compiled one marked `slow`."""
    return [pytest.param(m, marks=pytest.mark.slow) if m == COMPILED else m for m in methods]


@dataclass
class GaeCase:
    rewards: torch.Tensor
    values: torch.Tensor
    dones: torch.Tensor
    truncated: torch.Tensor
    bootstrap_values: torch.Tensor
    step_counts: list[int]

    def args(self, counts_as_tensor: bool = False) -> tuple:
        counts = (torch.tensor(self.step_counts, dtype=torch.int64) if counts_as_tensor
                  else self.step_counts)
        return (self.rewards, self.values, self.dones, self.truncated, self.bootstrap_values, counts)


def make_case(
    num_envs: int,
    max_steps: int,
    seed: int,
    *,
    p_done: float = 0.1,
    p_trunc: float = 0.05,
    dtype: torch.dtype = torch.float64,
    step_counts: list[int] | None = None,
    stale_padding: bool = True,
) -> GaeCase:
    """Inputs [num_envs, max_steps]; padding past step_counts holds NaN and random flags."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_envs, max_steps)
    if step_counts is None:
        step_counts = torch.randint(0, max_steps + 1, (num_envs,), generator=g).tolist()
    case = GaeCase(
        rewards=torch.randn(shape, generator=g, dtype=torch.float64).to(dtype),
        values=torch.randn(shape, generator=g, dtype=torch.float64).to(dtype),
        dones=torch.rand(shape, generator=g) < p_done,
        truncated=torch.rand(shape, generator=g) < p_trunc,
        bootstrap_values=torch.randn(shape, generator=g, dtype=torch.float64).to(dtype),
        step_counts=list(step_counts),
    )
    if stale_padding:
        steps = torch.arange(max_steps)
        pad = steps[None, :] >= torch.tensor(step_counts)[:, None]
        for t in (case.rewards, case.values, case.bootstrap_values):
            t[pad] = float("nan")
    return case
