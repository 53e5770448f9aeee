"""GAE as a numba kernel on the CPU: one trip through memory, parallel over envs.

The inputs are env-major [num_envs, max_steps], so each env's row is contiguous in time.
The kernel takes the rows four at a time and, while those rows sit in L1/L2, sweeps them
three times:

1. terms: `delta_t` and the trace coefficient `coef_t` (0 at a cut, `gamma * lambda`
   elsewhere, 0 at and past the row's count), read straight from the inputs and written
   into the two output rows. No dependency between steps, so it runs SIMD along time.
2. recurrence: `A_t = delta_t + coef_t * A_{t+1}`, backwards over time. Each row is a
   chain of dependent multiply-adds; walking the four rows' chains together in one loop
   overlaps their latencies (about 4x the speed of one row at a time).
3. returns: `R_t = A_t + V_t` at valid steps, 0 past the count.

Each input is read once from memory and each output written once; the in-between
values never leave the cache. (A single fused backward step per element, with
branch-free selects, measured about 2x slower here: its ~40 scalar instructions per
element cannot use SIMD.) Selects, never products with a 0/1 flag, keep stale padding
(even NaN) out of every valid entry. Arithmetic runs in the inputs' dtype, as the torch
methods do.

CPU tensors only: the kernel reads them through zero-copy `.numpy()` views, so CUDA
tensors are refused with a `ValueError` naming the device (use `scan` or `triton`
there). The kernel computes outside autograd, so an input that requires grad (in grad
mode) is refused too, rather than its gradient dropped; `esper.gae.compute_gae` runs
float16 and bfloat16 inputs in float32, and this kernel takes float32 and float64.

Compile time is one-off: kernels compile lazily per input dtype on first use and are
cached on disk (`cache=True`), so later processes load them. `warm_up()` compiles or
loads them all and returns the seconds it took, to report apart from steady state.
"""

from __future__ import annotations

import time

import numba
import numpy as np
import torch
from numba import uint64

from esper.gae.api import StepCounts, Tensor, refuse_grad

#: Below this many elements (num_envs * max_steps) the serial kernel runs even with several
#: torch threads: waking numba's OpenMP pool costs more than the serial kernel spends on a
#: small batch. Measured with `python -m harness.gae_tools.crossovers` (one thread against two at
#: each shape) on the idle 2-core CPU of esper.gae.auto's table, twice: one thread wins up
#: to 4,096 elements (by ~10%), two from 6,400 up (1.1x at 6,400, 1.8x at 1024 x 1024).
PARALLEL_MIN_ELEMENTS = 6_400

#: Rows whose recurrences are walked together (see the module docstring).
_LANES = 4

# unsigned indices: numba adds a negative-index wrap-around check to every signed one
_ONE = np.uint64(1)


@numba.njit(cache=True, nogil=True, inline="always")
def _delta_coef(rt, vt, vn, bt, dd, cut, t, steps, gamma, trace, zero):
    """(delta_t, coef_t) for one step; every operand is loaded before the selects, so
    they compile to branch-free vector selects."""
    valid = t < steps
    next_value = bt if (cut != 0) | (t + _ONE == steps) else vn  # bootstrap or V_{t+1}
    next_value = zero if dd > cut else gamma * next_value  # true terminal: no bootstrap
    delta = (rt + next_value - vt) if valid else zero
    coef = trace if ((dd | cut) == 0) & valid else zero  # an episode end cuts the trace
    return delta, coef


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _row_terms(rewards, values, dones, truncated, bootstrap, env, steps,
               gamma, trace, zero, delta, coef):
    """Sweep 1 for row `env` (not the array's final row): fills delta[env], coef[env].

    At t = max_steps - 1, `values[env, t + 1]` is the next row's first value (C order);
    the select discards it, as that step is at or past the row's last.
    """
    for t in range(uint64(rewards.shape[1])):
        delta[env, t], coef[env, t] = _delta_coef(
            rewards[env, t], values[env, t], values[env, t + _ONE], bootstrap[env, t],
            dones[env, t], truncated[env, t], t, steps, gamma, trace, zero)


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _final_row_terms(rewards, values, dones, truncated, bootstrap, env, steps,
                     gamma, trace, zero, delta, coef):
    """Sweep 1 for the array's final row, which has no next row to read into."""
    last = uint64(rewards.shape[1]) - _ONE
    for t in range(last):
        delta[env, t], coef[env, t] = _delta_coef(
            rewards[env, t], values[env, t], values[env, t + _ONE], bootstrap[env, t],
            dones[env, t], truncated[env, t], t, steps, gamma, trace, zero)
    delta[env, last], coef[env, last] = _delta_coef(
        rewards[env, last], values[env, last], zero, bootstrap[env, last],
        dones[env, last], truncated[env, last], last, steps, gamma, trace, zero)


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _solve_four(adv, coef, env, zero):
    """Sweep 2 for rows env..env+3 together: adv[row] <- A, in place of delta."""
    e0, e1, e2, e3 = env, env + _ONE, env + uint64(2), env + uint64(3)
    a0 = a1 = a2 = a3 = zero
    max_steps = uint64(adv.shape[1])
    for k in range(max_steps):
        t = max_steps - _ONE - k
        a0 = adv[e0, t] + coef[e0, t] * a0
        adv[e0, t] = a0
        a1 = adv[e1, t] + coef[e1, t] * a1
        adv[e1, t] = a1
        a2 = adv[e2, t] + coef[e2, t] * a2
        adv[e2, t] = a2
        a3 = adv[e3, t] + coef[e3, t] * a3
        adv[e3, t] = a3


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _solve_one(adv, coef, env, zero):
    """Sweep 2 for one row (the last rows of a chunk not filling a group of four)."""
    a = zero
    max_steps = uint64(adv.shape[1])
    for k in range(max_steps):
        t = max_steps - _ONE - k
        a = adv[env, t] + coef[env, t] * a
        adv[env, t] = a


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _row_returns(adv, values, env, steps, zero, returns):
    """Sweep 3 for row `env`: returns[env] <- A + V at valid steps, else 0."""
    for t in range(uint64(adv.shape[1])):
        returns[env, t] = (adv[env, t] + values[env, t]) if t < steps else zero


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _gae_rows(rewards, values, dones, truncated, bootstrap, step_counts,
              gamma, trace, advantages, returns, env_start, env_stop):
    """Advantages and returns for rows env_start..env_stop-1, four rows at a time.

    `returns` holds coef between sweeps 1 and 3.
    """
    num_envs = uint64(rewards.shape[0])
    zero = gamma - gamma  # 0 in the inputs' dtype
    env = uint64(env_start)
    stop = uint64(env_stop)
    while env < stop:
        group = min(uint64(_LANES), stop - env)
        for j in range(group):
            row = env + j
            steps = uint64(step_counts[row])
            if row + _ONE < num_envs:
                _row_terms(rewards, values, dones, truncated, bootstrap, row, steps,
                           gamma, trace, zero, advantages, returns)
            else:
                _final_row_terms(rewards, values, dones, truncated, bootstrap, row, steps,
                                 gamma, trace, zero, advantages, returns)
        if group == _LANES:
            _solve_four(advantages, returns, env, zero)
        else:
            for j in range(group):
                _solve_one(advantages, returns, env + j, zero)
        for j in range(group):
            row = env + j
            _row_returns(advantages, values, row, uint64(step_counts[row]), zero, returns)
        env += group


@numba.njit(cache=True, nogil=True)
def _first_bad_count(step_counts, max_steps):
    """Index of the first count outside [0, max_steps], or -1."""
    for env in range(step_counts.shape[0]):
        if step_counts[env] < 0 or step_counts[env] > max_steps:
            return env
    return -1


@numba.njit(cache=True, nogil=True)
def _gae_serial(rewards, values, dones, truncated, bootstrap, step_counts,
                gamma, trace, advantages, returns):
    """Every row on the calling thread. Returns the first bad count's index, or -1
    (then nothing is written)."""
    bad = _first_bad_count(step_counts, rewards.shape[1])
    if bad < 0 and rewards.shape[1] > 0:
        _gae_rows(rewards, values, dones, truncated, bootstrap, step_counts,
                  gamma, trace, advantages, returns, 0, rewards.shape[0])
    return bad


@numba.njit(cache=True, nogil=True, parallel=True)
def _gae_parallel(rewards, values, dones, truncated, bootstrap, step_counts,
                  gamma, trace, advantages, returns, chunks):
    """Rows split into `chunks` contiguous blocks (boundaries on groups of four), one
    per prange iteration, so each thread streams through whole rows. Returns as
    `_gae_serial`."""
    bad = _first_bad_count(step_counts, rewards.shape[1])
    if bad < 0 and rewards.shape[1] > 0:
        groups = (rewards.shape[0] + _LANES - 1) // _LANES
        for chunk in numba.prange(chunks):
            start = min(chunk * groups // chunks * _LANES, rewards.shape[0])
            stop = min((chunk + 1) * groups // chunks * _LANES, rewards.shape[0])
            _gae_rows(rewards, values, dones, truncated, bootstrap, step_counts,
                      gamma, trace, advantages, returns, start, stop)
    return bad


def _run_parallel(*args) -> int:
    """`_gae_parallel(*args)`, keeping torch's thread count: the first parallel call
    launches numba's OpenMP pool, which sets the calling thread's OpenMP thread count
    (the count torch reads and uses) to numba's own, e.g. from 1 back to all cores."""
    torch_threads = torch.get_num_threads()
    bad = _gae_parallel(*args)
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
    return bad


def _counts_array(step_counts: StepCounts) -> np.ndarray:
    """`step_counts` as an int64 array [num_envs]; a CPU int64 tensor is viewed, not copied."""
    if isinstance(step_counts, Tensor):
        if step_counts.device.type != "cpu":
            raise ValueError(
                f"gae_numba: step_counts.device: expected cpu; got {step_counts.device}"
            )
        return step_counts.numpy().astype(np.int64, copy=False)
    return np.array(step_counts, dtype=np.int64).reshape(-1)  # reshape: [] stays 1-D


def _flags(tensor: Tensor) -> np.ndarray:
    """A bool tensor as a uint8 array view (0/1): numba vectorizes uint8 flags, not bools."""
    return tensor.contiguous().view(torch.uint8).numpy()


def gae_numba(
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
    threads: int | None = None,
) -> tuple[Tensor, Tensor]:
    """GAE by the numba kernel; arguments and results as `esper.gae.compute_gae`.

    rewards, values, bootstrap_values: [num_envs, max_steps] float32/float64 CPU tensors
    (not requiring grad, in grad mode: `ValueError`; see `compute_gae` on autograd);
    dones, truncated: [num_envs, max_steps] bool; step_counts: list or 1-D integer CPU
    tensor [num_envs] (range-checked here, tensor or not: reading a CPU tensor is no
    host sync). Returns (advantages, returns), new contiguous [num_envs, max_steps]
    tensors of the inputs' dtype. Runs on `min(torch.get_num_threads(), num_envs)`
    threads when the batch has at least `PARALLEL_MIN_ELEMENTS` elements, else on the
    calling thread; `threads` (1: the serial kernel) overrides that choice, to measure
    it. `reset` is accepted for a uniform signature and has no effect.
    """
    if rewards.device.type != "cpu":
        raise ValueError(
            f"gae_numba: rewards.device: expected cpu (numba runs on the host; use "
            f"'scan' or 'triton' on {rewards.device.type}); got {rewards.device}"
        )
    if rewards.dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"gae_numba: rewards.dtype: expected float32 or float64 (compute_gae computes "
            f"float16 and bfloat16 in float32); got {rewards.dtype}"
        )
    refuse_grad("numba", rewards, values, bootstrap_values)
    counts = _counts_array(step_counts)
    advantages = torch.empty(rewards.shape, dtype=rewards.dtype)
    returns = torch.empty(rewards.shape, dtype=rewards.dtype)
    # detach: .numpy() refuses tensors that require grad; contiguous: a no-op on the
    # usual inputs, and one compiled layout (C order) for the kernel
    floats = [t.detach().contiguous().numpy() for t in (rewards, values, bootstrap_values)]
    scalar = floats[0].dtype.type  # gamma and the trace in the inputs' dtype
    args = (floats[0], floats[1], _flags(dones), _flags(truncated), floats[2], counts,
            scalar(gamma), scalar(gamma * gae_lambda), advantages.numpy(), returns.numpy())
    if threads is None:
        threads = min(torch.get_num_threads(), rewards.shape[0])
        threads = threads if rewards.numel() >= PARALLEL_MIN_ELEMENTS else 1
    if threads > 1:
        bad = _run_parallel(*args, threads)
    else:
        bad = _gae_serial(*args)
    if bad >= 0:
        raise ValueError(
            f"gae_numba: step_counts[{bad}]: expected an int in [0, {rewards.shape[1]}]; "
            f"got {int(counts[bad])}"
        )
    return advantages, returns


def warm_up() -> float:
    """Compile (or load from the disk cache) the serial and parallel kernels for float32
    and float64 inputs.

    Returns the seconds it took: the one-off JIT cost, to report apart from steady state.
    """
    start = time.perf_counter()
    counts = np.ones(2, dtype=np.int64)
    for dtype in (np.float32, np.float64):
        floats = np.zeros((2, 1), dtype=dtype)
        flags = np.zeros((2, 1), dtype=np.uint8)
        inputs = (floats, floats, flags, flags, floats, counts, dtype(0.99), dtype(0.95))
        _gae_serial(*inputs, np.empty_like(floats), np.empty_like(floats))
        _run_parallel(*inputs, np.empty_like(floats), np.empty_like(floats), 2)
    return time.perf_counter() - start
