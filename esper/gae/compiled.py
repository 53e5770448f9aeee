"""GAE through `torch.compile` (inductor): a fixed-depth parallel scan, one graph per dtype.

Formulation, chosen by measurement on the 2-core CPU, one thread (compile time is the
first call; steady state is the best of 5 x 10 calls):

- batched loop: the time loop unrolls into the graph, so each new `max_steps`
  recompiles and the compile grows with T (14 s at T=25, 66 s at T=128, 93 s at
  T=256); steady state 4.5 ms at 1024 x 256. Rejected.
- `affine_suffix_scan` as in `gae_scan`: its depth is log2(T), so every new power of
  two (and the sizes 1 and 2, which torch.compile specializes) compiles again, about
  10 s each; 3.0-4.0 ms at 1024 x 256, 0.77 ms at 64 x 1024.
- this module: the same Hillis-Steele scan with a fixed depth of `SCAN_LEVELS`, each
  level shifting by padding and slicing (no slice depends on T), so all shapes with
  T <= 2**SCAN_LEVELS share one graph per dtype. 4.5 ms at 1024 x 256, 1.2 ms at
  64 x 1024, 40 us at 4 x 25 (eager `scan`: 4.2-6.7 ms, 2.5 ms, 200 us). Up to
  1.5x slower than the per-length scan at large shapes, in exchange for compiling
  once per dtype instead of once per power of two.

Recompiles: one graph per dtype for every shape with max_steps <= 2**SCAN_LEVELS
(4096). `gamma` and `gae_lambda` enter as a tensor, so new values never recompile.
torch.compile specializes sizes 1 (and 2, for max_steps, through `values[:, 1:]`);
such tiny inputs are zero-padded to 2 envs x 3 steps before the call and cut back
after. Longer rows use a depth of ceil(log2(max_steps)) and compile once per depth.

Compile time is reported apart: `compile_seconds(...)` times the first call for a
dtype and returns its seconds; the harness's `first_call_seconds` records the same for
any method.
"""

from __future__ import annotations

import time

import torch
from torch.nn import functional as F

from esper.gae.inputs import StepCounts, Tensor, refuse_meta, step_counts_tensor
from esper.gae.recurrence import gae_recurrence_terms

#: Scan depth of the shared graph: rows up to 2**SCAN_LEVELS steps use it.
SCAN_LEVELS = 12

#: Smallest (num_envs, max_steps) passed to the graph; smaller inputs are padded up
#: (torch.compile specializes a size of 1, and max_steps - 1 == 1).
_MIN_SHAPE = (2, 3)


def _shifted(x: Tensor, offset: int, fill: float) -> Tensor:
    """x[:, t + offset], and `fill` past the end: [E, T] -> [E, T] (T-independent slice)."""
    return F.pad(x, (0, offset), value=fill)[:, offset:]


def fixed_depth_scan(delta: Tensor, coef: Tensor, levels: int) -> Tensor:
    """Solve `A_t = delta_t + coef_t * A_{t+1}` (A_T = 0) along dim 1, exact for T <= 2**levels.

    The Hillis-Steele scan of `esper.gae.scan.affine_suffix_scan`, always `levels` steps:
    past the end the shift brings the identity map (delta 0, coef 1), so extra
    levels change nothing. delta, coef: [E, T] -> A: [E, T].
    """
    acc, mul = delta, coef
    for level in range(levels):
        offset = 1 << level
        # compose map t with map t + offset: x -> d_t + c_t (d_s + c_s x)
        acc = torch.addcmul(acc, mul, _shifted(acc, offset, 0.0))
        mul = mul * _shifted(mul, offset, 1.0)
    return acc


def _gae_graph(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: Tensor,
    discounts: Tensor,
    levels: int,
) -> tuple[Tensor, Tensor]:
    """The traced function: terms, the fixed-depth scan, returns. `step_counts` int64
    [E]; `discounts` [2] = (gamma, gae_lambda) in the inputs' dtype. (One 1-D tensor,
    not two 0-d ones: inductor reads a 0-d CPU input with `.item()`, a host sync.)"""
    gamma, gae_lambda = discounts[0], discounts[1]
    delta, coef, valid = gae_recurrence_terms(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    advantages = fixed_depth_scan(delta, coef, levels)
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return advantages, returns


# Precompiled headers off: before its first kernel inductor precompiles its C++ prefix
# header (about 150 MB, in a folder of the temp dir keyed by the include paths: once per
# virtual environment), which this graph's one kernel does not repay. On a machine with
# nothing compiled yet the first call took 10.6-10.8 s without it, 13.5-15.3 s with it
# (2 runs each); with the header already built, about 1 s more without it.
_compiled = torch.compile(_gae_graph, dynamic=True,
                          options={"cpp_cache_precompile_headers": False})


def _pad_to(tensor: Tensor, shape: tuple[int, int]) -> Tensor:
    """Zero-pad (False for bool) [E, T] at the end of both dims up to `shape`."""
    return F.pad(tensor, (0, shape[1] - tensor.shape[1], 0, shape[0] - tensor.shape[0]))


def gae_compiled(
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
    """GAE by the compiled fixed-depth scan; arguments and results as `esper.gae.compute_gae`.

    rewards, values, bootstrap_values: [num_envs, max_steps] float32/float64;
    dones, truncated: [num_envs, max_steps] bool; step_counts: list or 1-D integer tensor.
    Returns (advantages, returns) [num_envs, max_steps], the inputs' dtype and device.
    The first call per dtype compiles (seconds). No host sync.
    """
    refuse_meta("gae_compiled", rewards, step_counts)
    num_envs, max_steps = rewards.shape
    if num_envs == 0 or max_steps == 0:
        return torch.zeros_like(rewards), torch.zeros_like(rewards)
    counts = step_counts_tensor(step_counts, rewards.device)
    inputs = [rewards, values, dones, truncated, bootstrap_values]
    shape = (max(num_envs, _MIN_SHAPE[0]), max(max_steps, _MIN_SHAPE[1]))
    if shape != (num_envs, max_steps):
        # padded envs get 0 steps and padded steps lie past every count: both come out 0
        inputs = [_pad_to(t, shape) for t in inputs]
        counts = F.pad(counts, (0, shape[0] - num_envs))
    levels = max(SCAN_LEVELS, (max_steps - 1).bit_length())
    discounts = _discounts(gamma, gae_lambda, rewards)
    advantages, returns = _compiled(*inputs, counts, discounts, levels)
    if shape != (num_envs, max_steps):
        return advantages[:num_envs, :max_steps], returns[:num_envs, :max_steps]
    return advantages, returns


#: (gamma, gae_lambda, dtype) -> `_discounts` on the CPU
_CPU_DISCOUNTS: dict[tuple[float, float, torch.dtype], Tensor] = {}
#: entries kept before `_CPU_DISCOUNTS` starts over
_CPU_DISCOUNTS_MAX = 64


def _discounts(gamma: float, gae_lambda: float, like: Tensor) -> Tensor:
    """[2] = (gamma, gae_lambda) in `like`'s dtype, on its device: a graph input, so new
    values never recompile. On CUDA a new tensor per call, filled by kernels (no host
    copy, so no sync, and no other stream can read it half-filled); on the CPU one per
    value, cached (the graph only reads it): two aten ops fewer on every call."""
    if not like.is_cpu:
        discounts = torch.full((2,), gamma, dtype=like.dtype, device=like.device)
        discounts[1:].fill_(gae_lambda)
        return discounts
    key = (gamma, gae_lambda, like.dtype)
    discounts = _CPU_DISCOUNTS.get(key)
    if discounts is None:
        if len(_CPU_DISCOUNTS) >= _CPU_DISCOUNTS_MAX:
            _CPU_DISCOUNTS.clear()
        discounts = _CPU_DISCOUNTS[key] = torch.tensor([gamma, gae_lambda], dtype=like.dtype)
    return discounts


def compile_seconds(dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> float:
    """Seconds of a first call on small zero inputs of `dtype`: the one-off compile
    cost of the shared graph (near 0 when it already compiled in this process)."""
    floats = torch.zeros(_MIN_SHAPE, dtype=dtype, device=device)
    flags = torch.zeros(_MIN_SHAPE, dtype=torch.bool, device=device)
    start = time.perf_counter()
    gae_compiled(floats, floats, flags, flags, floats, [_MIN_SHAPE[1]] * _MIN_SHAPE[0],
                 gamma=0.99, gae_lambda=0.95)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # host sync: the compile ends when the kernels ran
    return time.perf_counter() - start
