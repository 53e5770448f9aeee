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

CPU tensors only: the kernel gets each tensor's address and reads its memory in place
(`numba.carray`), so CUDA tensors are refused with a `ValueError` naming the device (use
`scan` or `triton` there). Handing over addresses, not `.numpy()` views, is what keeps
the call near its floor at small shapes: a `.numpy()` view dispatches four aten ops and
costs about as much as the whole kernel at 4 x 25 (eight of them were a third of the
call); an address is one attribute read (`python -m esper_review.gae_tools.floor`). The
kernel computes outside autograd, so an input that requires grad (in grad mode) is
refused too, rather than its gradient dropped; `esper.gae.compute_gae` runs float16 and
bfloat16 inputs in float32, and this kernel takes float32 and float64.

Compile time is one-off: kernels compile lazily per input dtype on first use and are
cached on disk (`cache=True`), so later processes load them. `warm_up()` compiles or
loads them all and returns the seconds it took, to report apart from steady state.
"""

from __future__ import annotations

import time

import numba
import numpy as np
import torch
from numba import types, uint64
from numba.core import cgutils
from numba.extending import intrinsic

from esper.gae.inputs import StepCounts, Tensor, meta_error, refuse_grad, refuse_meta

#: Below this many elements (num_envs * max_steps) the serial kernel runs even with several
#: torch threads: waking numba's OpenMP pool costs more than the serial kernel spends on a
#: small batch. Measured with `python -m esper_review.gae_tools.crossovers` (one thread against two at
#: each shape) on the idle 2-core CPU of esper.gae.crossovers' table, twice: one thread wins up
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


@intrinsic
def _address(typingctx, address):
    """An integer address as a `void *`, for `numba.carray` (nopython mode has no cast)."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _arrays(rewards, values, dones, truncated, bootstrap, step_counts, advantages, returns,
            num_envs, max_steps, dtype):
    """The eight arrays at these addresses: floats of `dtype` and uint8 flags (a bool
    tensor's bytes are 0 or 1) [num_envs, max_steps], int64 counts [num_envs]."""
    shape = (num_envs, max_steps)
    return (numba.carray(_address(rewards), shape, dtype),
            numba.carray(_address(values), shape, dtype),
            numba.carray(_address(dones), shape, np.uint8),
            numba.carray(_address(truncated), shape, np.uint8),
            numba.carray(_address(bootstrap), shape, dtype),
            numba.carray(_address(step_counts), (num_envs,), np.int64),
            numba.carray(_address(advantages), shape, dtype),
            numba.carray(_address(returns), shape, dtype))


@numba.njit(cache=True, nogil=True)
def _serial_at(rewards, values, dones, truncated, bootstrap, step_counts, advantages,
               returns, num_envs, max_steps, gamma, trace, double):
    """`_gae_serial` on the tensors at these addresses (C-contiguous, float64 when
    `double`, else float32); `gamma` and `trace` are rounded to that dtype here."""
    if double:
        r, v, d, t, b, c, a, ret = _arrays(rewards, values, dones, truncated, bootstrap,
                                           step_counts, advantages, returns, num_envs,
                                           max_steps, np.float64)
        return _gae_serial(r, v, d, t, b, c, np.float64(gamma), np.float64(trace), a, ret)
    r, v, d, t, b, c, a, ret = _arrays(rewards, values, dones, truncated, bootstrap,
                                       step_counts, advantages, returns, num_envs,
                                       max_steps, np.float32)
    return _gae_serial(r, v, d, t, b, c, np.float32(gamma), np.float32(trace), a, ret)


@numba.njit(cache=True, nogil=True)
def _parallel_at(rewards, values, dones, truncated, bootstrap, step_counts, advantages,
                 returns, num_envs, max_steps, gamma, trace, double, chunks):
    """`_gae_parallel` on the tensors at these addresses, as `_serial_at`."""
    if double:
        r, v, d, t, b, c, a, ret = _arrays(rewards, values, dones, truncated, bootstrap,
                                           step_counts, advantages, returns, num_envs,
                                           max_steps, np.float64)
        return _gae_parallel(r, v, d, t, b, c, np.float64(gamma), np.float64(trace), a, ret,
                             chunks)
    r, v, d, t, b, c, a, ret = _arrays(rewards, values, dones, truncated, bootstrap,
                                       step_counts, advantages, returns, num_envs,
                                       max_steps, np.float32)
    return _gae_parallel(r, v, d, t, b, c, np.float32(gamma), np.float32(trace), a, ret, chunks)


def _run_parallel(*args) -> int:
    """`_parallel_at(*args)`, keeping torch's thread count: the first parallel call
    launches numba's OpenMP pool, which sets the calling thread's OpenMP thread count
    (the count torch reads and uses) to numba's own, e.g. from 1 back to all cores."""
    torch_threads = torch.get_num_threads()
    bad = _parallel_at(*args)
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
    return bad


def _in_place(tensor: Tensor) -> Tensor:
    """`tensor` itself when the kernel can read its memory as it is (C-contiguous, no lazy
    negation), else such a copy."""
    if tensor.is_contiguous() and not tensor.is_neg():
        return tensor
    return tensor.resolve_neg().contiguous()


def _counts_tensor(step_counts: StepCounts) -> Tensor:
    """`step_counts` as a C-contiguous int64 CPU tensor [num_envs]; a tensor already so is
    used as it is."""
    if isinstance(step_counts, Tensor):
        if not step_counts.is_cpu:
            if step_counts.is_meta:
                raise meta_error("gae_numba", "step_counts")
            raise ValueError(
                f"gae_numba: step_counts.device: expected cpu; got {step_counts.device}"
            )
        if step_counts.dtype is not torch.int64:
            step_counts = step_counts.to(torch.int64)
        return _in_place(step_counts)
    return torch.tensor(list(step_counts), dtype=torch.int64)


_FLOAT32, _FLOAT64 = torch.float32, torch.float64


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
    it.

    The kernel reads the tensors' memory in place (a non-contiguous input is copied
    first); the only aten ops on the usual path are the two outputs' allocations.
    """
    if not rewards.is_cpu:
        refuse_meta("gae_numba", rewards, step_counts)
        raise ValueError(
            f"gae_numba: rewards.device: expected cpu (numba runs on the host; use "
            f"'scan' or 'triton' on {rewards.device.type}); got {rewards.device}"
        )
    dtype = rewards.dtype
    if dtype is not _FLOAT32 and dtype is not _FLOAT64:
        raise ValueError(
            f"gae_numba: rewards.dtype: expected float32 or float64 (compute_gae computes "
            f"float16 and bfloat16 in float32); got {dtype}"
        )
    if torch.is_grad_enabled() and (rewards.requires_grad or values.requires_grad
                                    or bootstrap_values.requires_grad):
        refuse_grad("numba", rewards, values, bootstrap_values)
    counts = step_counts
    if not (isinstance(counts, Tensor) and counts.dtype is torch.int64 and counts.is_cpu
            and counts.is_contiguous() and not counts.is_neg()):
        counts = _counts_tensor(step_counts)
    if not (rewards.is_contiguous() and values.is_contiguous() and dones.is_contiguous()
            and truncated.is_contiguous() and bootstrap_values.is_contiguous()
            and not (rewards.is_neg() or values.is_neg() or dones.is_neg()
                     or truncated.is_neg() or bootstrap_values.is_neg())):
        rewards, values, dones, truncated, bootstrap_values = (
            _in_place(t) for t in (rewards, values, dones, truncated, bootstrap_values))
    advantages = torch.empty_like(rewards)  # contiguous, as rewards now is
    returns = torch.empty_like(rewards)
    num_envs, max_steps = rewards.shape
    if type(gamma) is not float or type(gae_lambda) is not float:  # one compiled signature
        gamma, gae_lambda = float(gamma), float(gae_lambda)
    args = (rewards.data_ptr(), values.data_ptr(), dones.data_ptr(), truncated.data_ptr(),
            bootstrap_values.data_ptr(), counts.data_ptr(), advantages.data_ptr(),
            returns.data_ptr(), num_envs, max_steps, gamma, gamma * gae_lambda,
            dtype is _FLOAT64)
    if threads is None:
        threads = 1
        if num_envs * max_steps >= PARALLEL_MIN_ELEMENTS:
            threads = min(torch.get_num_threads(), num_envs)
    if threads > 1:
        bad = _run_parallel(*args, threads)
    else:
        bad = _serial_at(*args)
    if bad >= 0:
        raise ValueError(
            f"gae_numba: step_counts[{bad}]: expected an int in [0, {max_steps}]; "
            f"got {int(counts[bad])}"
        )
    return advantages, returns


def warm_up() -> float:
    """Compile (or load from the disk cache) the serial and parallel kernels (each takes
    float32 and float64 inputs).

    Returns the seconds it took: the one-off JIT cost, to report apart from steady state.
    """
    start = time.perf_counter()
    for dtype in (torch.float32, torch.float64):
        floats = torch.zeros((2, 1), dtype=dtype)
        flags = torch.zeros((2, 1), dtype=torch.bool)
        counts = torch.ones(2, dtype=torch.int64)
        for threads in (1, 2):
            gae_numba(floats, floats, flags, flags, floats, counts, gamma=0.99,
                      gae_lambda=0.95, threads=threads)
    return time.perf_counter() - start
