"""Generalized Advantage Estimation over ragged, env-major rollouts.

Every method computes the same function (see `compute_gae`); they differ only in how.

Semantics, per env `e` with `T_e = step_counts[e]` and `t < T_e`::

    done_t   = dones_t or truncated_t
    term_t   = dones_t and not truncated_t          # true terminal: no bootstrap
    boot_t   = truncated_t or t == T_e - 1           # next value comes from bootstrap_values
    next_v_t = bootstrap_values_t if boot_t else values_{t+1}
    delta_t  = rewards_t + gamma * (1 - term_t) * next_v_t - values_t
    A_t      = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},   A_{T_e} = 0
    R_t      = A_t + values_t

`terminated` (term) zeroes the bootstrap; `done` (dones or truncated) cuts the
lambda-trace. Entries at or past `T_e` are 0 in both outputs, whatever the padding holds.

Difference from the reviewed original: at a truncation *inside* a row (an episode cut
by a time limit and followed by the next episode in the same row) the original
bootstrapped from the next episode's first value and carried the lambda-trace across
the boundary. Here the trace is cut and `bootstrap_values_t` is used. On inputs with no
truncation before a row's last step both agree.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from numbers import Integral, Real

import numpy as np
import torch

from esper.host_view import host_view

Tensor = torch.Tensor
StepCounts = Sequence[int] | Tensor
GaeFn = Callable[..., tuple[Tensor, Tensor]]


# ----------------------------------------------------------------------------- checks

#: Float dtypes `compute_gae` takes; the half-precision ones are computed in float32.
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: Computed in float32 by every method, the results cast back (`compute_gae`).
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: Integer dtypes a step-count tensor may have.
COUNT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
#: Methods that compute outside autograd: they refuse inputs that require grad while
#: grad mode is on (`auto` does not choose them then).
NON_DIFFERENTIABLE = frozenset({"numba", "triton"})
#: Below this many envs, CPU count tensors are range-checked in Python (no NumPy call).
_PYTHON_RANGE_MAX = 64
_BOOL, _INT64 = torch.bool, torch.int64


def _shape_error(field: str, expected: object, got: object) -> ValueError:
    return ValueError(f"compute_gae: {field}: expected {expected}; got {got}")


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_gae_inputs(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Size, torch.dtype]:
    """Validate every argument; raise `ValueError` naming it, what was expected and what
    was received. No host sync on any device. Returns the inputs' shape [num_envs,
    max_steps] and float dtype, which `compute_gae` goes on with.

    Well-formed CPU inputs (a contiguous int64 count tensor, as a rollout buffer keeps
    them) dispatch no aten op and take about 25 attribute reads, one to two microseconds
    (`python -m harness.gae_tools.floor` times it).

    What is checked where:

    - tensors: type, shape, dtype (`FLOAT_DTYPES` for the floats, all alike; bool flags)
      and device, from their metadata. Float *values* are not read: a NaN or inf at a
      valid step spreads through its row's earlier steps, even across an episode end
      (`RolloutBuffer.add` rejects them at the source); padding past a row's count may
      hold anything.
    - step counts given as a sequence (list, tuple, range): a Python int per env
      (`bool` and other types rejected) in [0, max_steps]. Any other non-tensor
      (a generator, a set, a NumPy array) is rejected.
    - step counts given as a tensor: 1-D [num_envs] of a `COUNT_DTYPES` dtype; every
      count in [0, max_steps]. A CPU tensor is read in place (`_counts_in_range`, or
      `esper.host_view` for other dtypes and layouts: no aten op, no sync). Any other
      device gets a device-side assert (`device_count_check`): no host sync, so a bad
      count is reported at a later synchronising call as a device-side assertion
      failure (on CUDA it also poisons the context), not as a `ValueError` here.
    - `gamma`, `gae_lambda`: Python (or NumPy) real numbers in [0, 1]; NaN, bools and
      tensors (reading one would sync) are rejected.
    """
    # Well-formed inputs take one expression of metadata reads and no aten op: each read
    # costs tens of nanoseconds, and this runs on every call. dtypes are singletons, so
    # `is` compares them; on the CPU `is_cpu` settles the device without building one.
    try:
        shape = rewards.shape
        dtype = rewards.dtype
        tensors_ok = (
            dtype in FLOAT_DTYPES and len(shape) == 2
            and values.dtype is dtype and bootstrap_values.dtype is dtype
            and dones.dtype is _BOOL and truncated.dtype is _BOOL
            and shape == values.shape == bootstrap_values.shape == dones.shape == truncated.shape
            and ((rewards.is_cpu and values.is_cpu and bootstrap_values.is_cpu
                  and dones.is_cpu and truncated.is_cpu)
                 or _same_device(rewards, values, dones, truncated, bootstrap_values))
        )
    except AttributeError:  # not a tensor
        tensors_ok = False
    if not tensors_ok:
        _raise_tensor_error(rewards, values, dones, truncated, bootstrap_values)
    num_envs, max_steps = shape
    if not (isinstance(step_counts, Tensor) and step_counts.dtype is _INT64
            and step_counts.is_cpu and num_envs > 0
            and step_counts.shape == (num_envs,) and step_counts.is_contiguous()
            and not step_counts.is_neg()
            and _counts_in_range(step_counts, num_envs, max_steps)):
        _check_step_counts(step_counts, num_envs, max_steps)  # any other form, or a bad count
    if not (type(gamma) is float and 0.0 <= gamma <= 1.0):  # the usual case, fast
        _check_discount("gamma", gamma)
    if not (type(gae_lambda) is float and 0.0 <= gae_lambda <= 1.0):
        _check_discount("gae_lambda", gae_lambda)
    return shape, dtype


def _same_device(rewards: Tensor, *others: Tensor) -> bool:
    device = rewards.device
    return all(tensor.device == device for tensor in others)


def _raise_tensor_error(rewards, values, dones, truncated, bootstrap_values) -> None:
    """Find and raise the error `check_gae_inputs`'s one-expression test saw."""
    for name, tensor in (("rewards", rewards), ("values", values), ("dones", dones),
                         ("truncated", truncated), ("bootstrap_values", bootstrap_values)):
        if not isinstance(tensor, Tensor):
            raise _shape_error(name, "a torch.Tensor", type(tensor).__name__)
    if rewards.dim() != 2:
        raise _shape_error("rewards", "a 2-D [num_envs, max_steps] tensor", tuple(rewards.shape))
    if rewards.dtype not in FLOAT_DTYPES:
        raise _shape_error("rewards.dtype", f"one of {_dtype_names(FLOAT_DTYPES)}", rewards.dtype)
    shape = tuple(rewards.shape)
    for name, tensor, want_dtype in (
        ("values", values, rewards.dtype),
        ("bootstrap_values", bootstrap_values, rewards.dtype),
        ("dones", dones, torch.bool),
        ("truncated", truncated, torch.bool),
    ):
        if tuple(tensor.shape) != shape:
            raise _shape_error(f"{name}.shape", shape, tuple(tensor.shape))
        if tensor.dtype != want_dtype:
            raise _shape_error(f"{name}.dtype", want_dtype, tensor.dtype)
        if tensor.device != rewards.device:
            raise _shape_error(f"{name}.device", rewards.device, tensor.device)
    raise AssertionError("check_gae_inputs: the fast test failed but no field is wrong")


class _CountView:
    """The memory of a contiguous CPU int64 tensor [num_envs] (num_envs > 0), read in
    place (no aten op, no copy), and the last counts found there in range."""

    __slots__ = ("raw", "unsigned", "passed", "passed_max")

    def __init__(self, address: int, num_envs: int) -> None:
        raw = memoryview((ctypes.c_uint64 * num_envs).from_address(address)).cast("B")
        self.raw = raw
        # read as unsigned, a negative count is above 2**63: one `max` checks both ends
        self.unsigned = raw.cast("Q")
        self.passed = b""
        self.passed_max = 0


#: (address, num_envs) -> its `_CountView`
_COUNT_VIEWS: dict[tuple[int, int], _CountView] = {}
#: entries kept before `_COUNT_VIEWS` starts over (a rollout buffer keeps one address)
_COUNT_VIEWS_MAX = 64


def _counts_in_range(step_counts: Tensor, num_envs: int, max_steps: int) -> bool:
    """Whether every count of a contiguous CPU int64 tensor [num_envs] (num_envs > 0) is
    in [0, max_steps], read in place: no aten op, no copy.

    The view reads memory at an address, not a tensor: it is cached per (address,
    num_envs) and read only while a live tensor of that many elements sits at that
    address (the caller's), so it never reads freed memory, and a ctypes view (about as
    slow as the whole check) is built once per buffer. Counts byte-equal to the last
    that passed there (a rollout buffer's, call after call) need no scan: one memcmp.
    """
    key = (step_counts.data_ptr(), num_envs)
    view = _COUNT_VIEWS.get(key)
    if view is None:
        if len(_COUNT_VIEWS) >= _COUNT_VIEWS_MAX:
            _COUNT_VIEWS.clear()
        view = _COUNT_VIEWS[key] = _CountView(*key)
    if view.passed_max <= max_steps and view.raw.tobytes() == view.passed:
        return True
    if num_envs > _PYTHON_RANGE_MAX:  # one NumPy pass beats Python's max
        largest = int(np.frombuffer(view.unsigned, dtype=np.uint64).max())
    else:
        largest = max(view.unsigned)
    if largest > max_steps:
        return False
    view.passed, view.passed_max = view.raw.tobytes(), largest
    return True


def _check_step_counts(step_counts: StepCounts, num_envs: int, max_steps: int) -> None:
    in_range = f"ints in [0, {max_steps}]"
    if isinstance(step_counts, Tensor):
        if step_counts.dim() != 1 or step_counts.shape[0] != num_envs:
            raise _shape_error("step_counts.shape", (num_envs,), tuple(step_counts.shape))
        if step_counts.dtype not in COUNT_DTYPES:
            raise _shape_error("step_counts.dtype", f"an integer dtype ({_dtype_names(COUNT_DTYPES)})",
                               step_counts.dtype)
        if not step_counts.is_cpu:
            device_count_check(step_counts, max_steps)
            return
        counts = host_view(step_counts)
        if num_envs > _PYTHON_RANGE_MAX:  # one NumPy pass beats Python's min and max
            array = np.ctypeslib.as_array(counts)
            low, high = int(array.min()), int(array.max())
        else:
            counts = counts[:]  # a list: faster to scan than the ctypes array
            low, high = (min(counts), max(counts)) if num_envs else (0, 0)
        if low < 0 or high > max_steps:
            bad = [c for c in counts if not 0 <= c <= max_steps]
            raise _shape_error("step_counts", in_range, f"{bad[:5]} in a {step_counts.dtype} tensor")
        return
    if not isinstance(step_counts, Sequence) or isinstance(step_counts, (str, bytes)):
        hint = " (a NumPy array: pass torch.from_numpy(counts))" if isinstance(step_counts, np.ndarray) else ""
        raise _shape_error("step_counts", "a list or tuple of ints, or a 1-D integer tensor"
                           + hint, type(step_counts).__name__)
    if len(step_counts) != num_envs:
        raise _shape_error("len(step_counts)", num_envs, len(step_counts))
    for count in step_counts:
        if type(count) is not int and (isinstance(count, bool) or not isinstance(count, Integral)):
            raise _shape_error("step_counts", in_range, f"{count!r} ({type(count).__name__})")
    if num_envs and (min(step_counts) < 0 or max(step_counts) > max_steps):
        bad = [c for c in step_counts if not 0 <= c <= max_steps]
        raise _shape_error("step_counts", in_range, bad[:5])


def device_count_check(step_counts: Tensor, max_steps: int) -> None:
    """Assert on `step_counts`' own device that every count is in [0, max_steps]:
    `torch._assert_async`, no host sync (a few small kernels). On CUDA a failure surfaces
    at a later synchronising call as a device-side assertion; on the CPU it raises
    `RuntimeError` at once (so the condition can be tested without a GPU)."""
    in_range = ((step_counts >= 0) & (step_counts <= max_steps)).all()
    torch._assert_async(in_range, f"compute_gae: step_counts: expected ints in [0, {max_steps}]")


def _check_discount(name: str, value: object) -> None:
    if (isinstance(value, bool) or not isinstance(value, Real)
            or not 0.0 <= float(value) <= 1.0):  # NaN fails both comparisons
        got = f"{value!r} ({type(value).__name__})" if not isinstance(value, Real) else repr(value)
        raise _shape_error(name, "a number in [0, 1]", got)


def first_requiring_grad(rewards: Tensor, values: Tensor, bootstrap_values: Tensor) -> str | None:
    """The name of the first float input autograd would track (grad mode on and
    `requires_grad`), or None: where a non-differentiable method must not run."""
    if not torch.is_grad_enabled():
        return None
    for name, tensor in (("rewards", rewards), ("values", values),
                         ("bootstrap_values", bootstrap_values)):
        if tensor.requires_grad:
            return name
    return None


def refuse_grad(method: str, rewards: Tensor, values: Tensor, bootstrap_values: Tensor) -> None:
    """`ValueError` when a method of `NON_DIFFERENTIABLE` gets an input that requires grad."""
    name = first_requiring_grad(rewards, values, bootstrap_values)
    if name is not None:
        raise ValueError(
            f"gae_{method}: {name}.requires_grad: expected False ({method} computes outside "
            f"autograd: use method 'scan' or 'auto', which keep the graph, or call it under "
            f"torch.no_grad()); got True"
        )


def step_counts_tensor(step_counts: StepCounts, device: torch.device) -> Tensor:
    """`step_counts` as an int64 tensor [num_envs] on `device`; a tensor stays a tensor
    (itself when it already is one: no op)."""
    if isinstance(step_counts, Tensor):
        if step_counts.dtype is _INT64 and step_counts.device == device:
            return step_counts
        return step_counts.to(device=device, dtype=torch.int64, non_blocking=True)
    return torch.as_tensor(list(step_counts), dtype=torch.int64, device=device)


def valid_mask(step_counts: Tensor, max_steps: int) -> Tensor:
    """[num_envs, max_steps] bool: True where `t < step_counts[e]`."""
    steps = torch.arange(max_steps, device=step_counts.device)
    return steps[None, :] < step_counts[:, None]


# ------------------------------------------------------------ the affine recurrence

def gae_recurrence_terms(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    gamma: float | Tensor,
    gae_lambda: float | Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Rewrite GAE as the affine recurrence `A_t = delta_t + coef_t * A_{t+1}`.

    Returns `(delta, coef, valid)`, each [num_envs, max_steps]; `delta` and `coef` are 0
    at and past `step_counts[e]`, so the recurrence gives 0 there and the trace is cut at
    each row's last valid step. `torch.where` (not multiplication) keeps stale padding,
    even NaN, out of every valid entry. `gamma` and `gae_lambda` are floats or 0-d
    tensors of the inputs' dtype (tensors keep them graph inputs under torch.compile).
    No host sync.
    """
    num_envs, max_steps = rewards.shape
    counts = step_counts_tensor(step_counts, rewards.device)
    valid = valid_mask(counts, max_steps)
    steps = torch.arange(max_steps, device=rewards.device)
    is_last = steps[None, :] == (counts - 1)[:, None]
    terminal = dones & ~truncated
    boot = truncated | is_last
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    next_values = torch.where(boot, bootstrap_values, next_values)
    bootstrapped = torch.where(terminal, torch.zeros_like(next_values), gamma * next_values)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    delta = torch.where(valid, rewards + bootstrapped - values, zero)
    # gamma * gae_lambda may be a float or a 0-d tensor (as the compiled method passes)
    coef = torch.where(valid & ~(dones | truncated), gamma * gae_lambda, zero)
    return delta, coef, valid


def _outputs(advantages: Tensor, values: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return advantages, returns


# -------------------------------------------------------------------------- methods

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
    reset: str = "mask",
) -> tuple[Tensor, Tensor]:
    """The original: Python loops over envs and reversed steps on 0-d tensor elements.

    Each `if` on a tensor element is a host sync (`aten::item`), about two per step, as in
    the reviewed code. `reset="clone"` resets the trace with `zero.clone()` at each true
    terminal (one allocation each, as the original); `reset="mask"` multiplies by a
    not-done factor precomputed per env, with no allocation for the reset.
    """
    if reset not in ("clone", "mask"):
        raise ValueError(f"gae_loop: reset: expected 'clone' or 'mask'; got {reset!r}")
    num_envs, max_steps = rewards.shape
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    # a 0-d tensor, so `trace * last_gae` wraps no Python scalar (an allocation per step)
    # and the two resets differ by exactly their reset
    trace = torch.full((), gamma * gae_lambda, dtype=rewards.dtype, device=rewards.device)
    if reset == "mask":
        not_done_trace = trace * (~(dones | truncated)).to(rewards.dtype)  # [num_envs, max_steps]
    rows = []
    for env in range(num_envs):
        steps = int(step_counts[env])  # host sync when step_counts is a device tensor
        env_adv = torch.zeros(max_steps, dtype=rewards.dtype, device=rewards.device)
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
            if reset == "clone":
                if terminal:
                    last_gae = zero.clone()
                elif bool(trunc[t]):  # cut the trace at an interior truncation
                    last_gae = zero
                last_gae = delta + trace * last_gae
            else:
                last_gae = delta + not_done_trace[env, t] * last_gae
            env_adv[t] = last_gae
        rows.append(env_adv)
    advantages = torch.stack(rows) if rows else torch.zeros_like(rewards)
    valid = valid_mask(step_counts_tensor(step_counts, rewards.device), max_steps)
    return _outputs(advantages, values, valid)


def gae_batched(
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
    """One Python loop over time, vectorized across envs; ragged rows handled by masks.

    `reset` is accepted for a uniform signature and has no effect. No host sync.
    """
    delta, coef, valid = gae_recurrence_terms(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    advantages = torch.empty_like(delta)
    last_gae = delta.new_zeros(delta.shape[0])  # [num_envs]; delta[:, 0] fails at 0 steps
    for t in reversed(range(delta.shape[1])):
        last_gae = torch.addcmul(delta[:, t], coef[:, t], last_gae)
        advantages[:, t] = last_gae
    return _outputs(advantages, values, valid)


def affine_suffix_scan(delta: Tensor, coef: Tensor) -> Tensor:
    """Solve `A_t = delta_t + coef_t * A_{t+1}` (A_T = 0) along dim 1 by a parallel scan.

    Hillis-Steele over the affine maps `x -> delta + coef * x`: after the step with
    offset `k`, position `t` holds the composition of the maps `t .. t+2k-1`. log2(T)
    sequential steps, each one vectorized over [num_envs, T]. Only products of
    coefficients in [0, 1] and sums appear, no division by cumulative products, so float32
    stays accurate for long rows (products underflow harmlessly to 0).

    delta, coef: [num_envs, T] -> A: [num_envs, T].
    """
    acc, mul = delta, coef
    max_steps = delta.shape[1]
    offset = 1
    while offset < max_steps:
        # compose map t with the map that starts `offset` later: x -> d_t + c_t (d_s + c_s x)
        tail_acc = torch.addcmul(acc[:, :-offset], mul[:, :-offset], acc[:, offset:])
        tail_mul = mul[:, :-offset] * mul[:, offset:]
        acc = torch.cat([tail_acc, acc[:, -offset:]], dim=1)
        mul = torch.cat([tail_mul, mul[:, -offset:]], dim=1)
        offset *= 2
    return acc


def gae_scan(
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
    """A parallel (associative) scan over time: O(log T) sequential steps. No host sync.

    `reset` is accepted for a uniform signature and has no effect.
    """
    delta, coef, valid = gae_recurrence_terms(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    return _outputs(affine_suffix_scan(delta, coef), values, valid)


#: method name -> implementation; every entry runs on this machine.
METHODS: dict[str, GaeFn] = {
    "loop": gae_loop,
    "batched": gae_batched,
    "scan": gae_scan,
}
#: method name -> the device types (`cpu`, `cuda`) whose tensors it takes.
DEVICE_TYPES: dict[str, tuple[str, ...]] = {name: ("cpu", "cuda") for name in METHODS}


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    truncated: Tensor,
    bootstrap_values: Tensor,
    step_counts: StepCounts,
    *,
    gamma: float,
    gae_lambda: float,
    method: str = "scan",
    reset: str = "mask",
) -> tuple[Tensor, Tensor]:
    """Advantages and returns for a ragged batch of rollouts (semantics: module docstring).

    Args:
        rewards, values, bootstrap_values: [num_envs, max_steps], one dtype of
            `FLOAT_DTYPES` (float32, float64, float16, bfloat16).
        dones, truncated: [num_envs, max_steps] bool. `dones` marks the end of an
            episode; `truncated` marks a time-limit end (bootstrap, do not zero).
        step_counts: valid steps per env, a list or tuple of ints or a 1-D integer
            tensor [num_envs] (on any device), each in [0, max_steps]. On CUDA the form
            has a cost on every call: a list becomes a device tensor by a blocking
            host-to-device copy (the host waits for the stream: a host sync); a CPU
            tensor by a non-blocking copy; a tensor already on the device costs nothing.
            Keep step counts on the device to keep GAE free of host syncs.
        gamma: discount; gae_lambda: trace decay; both numbers in [0, 1].
        method: a key of `METHODS`.
        reset: `clone` or `mask`; how the `loop` method resets at terminals.

    Returns:
        (advantages, returns), each [num_envs, max_steps] with the inputs' dtype and
        device, 0 at and past `step_counts[e]`.

    Every argument is checked first (`check_gae_inputs` says what is checked where, and
    on which device); bad input raises `ValueError` naming the argument. float16 and
    bfloat16 inputs are computed in float32 by every method and the results cast back:
    one rounding, instead of one per step.

    Autograd: `loop`, `batched`, `scan` and `compiled` keep the graph (outputs have a
    `grad_fn` when an input requires grad). `numba` and `triton` compute outside
    autograd: given an input that requires grad while grad mode is on, they raise
    `ValueError` (under `torch.no_grad()` they run). `auto` then chooses the fastest
    differentiable method instead.
    """
    gae_method = METHODS.get(method)
    if gae_method is None:
        raise ValueError(
            f"compute_gae: method: expected one of {', '.join(METHODS)}; got {method!r}"
        )
    if reset not in ("clone", "mask"):
        raise ValueError(f"compute_gae: reset: expected 'clone' or 'mask'; got {reset!r}")
    shape, dtype = check_gae_inputs(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    if method == "auto":  # chosen here, not in gae_auto: a call layer less per call
        differentiable = torch.is_grad_enabled() and (
            rewards.requires_grad or values.requires_grad or bootstrap_values.requires_grad)
        device_type = "cpu" if rewards.is_cpu else rewards.device.type  # no device built on the CPU
        gae_method = METHODS[_auto_choice(shape, dtype, device_type, differentiable)]
    if dtype in HALF_DTYPES:  # one rounding at the end instead of one per step
        rewards, values, bootstrap_values = (
            t.float() for t in (rewards, values, bootstrap_values)
        )
    advantages, returns = gae_method(
        rewards, values, dones, truncated, bootstrap_values, step_counts,
        gamma=gamma, gae_lambda=gae_lambda, reset=reset,
    )
    if dtype in HALF_DTYPES:
        return advantages.to(dtype), returns.to(dtype)
    return advantages, returns


# ------------------------------------------------------ methods in their own modules
# Listed only where they run, and imported on first call: `import esper.gae` stays light
# (numba, triton and inductor take seconds to import) and their modules, which reuse the
# helpers above, can be imported first without a cycle.

def _auto_choice(shape: torch.Size, dtype: torch.dtype, device_type: str,
                 differentiable: bool) -> str:
    """`esper.gae.auto.cached_choice`, which takes this function's place on its first
    call (that module imports this one, so it is imported late)."""
    global _auto_choice
    from esper.gae.auto import cached_choice

    _auto_choice = cached_choice
    return cached_choice(shape, dtype, device_type, differentiable)


@functools.cache
def _load(module: str, name: str) -> GaeFn:
    return getattr(importlib.import_module(module), name)


def _lazy(key: str, module: str, name: str) -> GaeFn:
    """A method that imports `module` on its first call, puts `module.name` in its own
    place, `METHODS[key]` (so later calls skip this wrapper, a fraction of a microsecond
    each), and calls it."""

    def method(*args, **kwargs):
        loaded = _load(module, name)
        if METHODS.get(key) is method:
            METHODS[key] = loaded
        return loaded(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"`{module}.{name}`, imported on first call."
    return method


def _compiled_device_types() -> tuple[str, ...]:
    """Where inductor can build kernels: a C++ compiler for the CPU (found as inductor
    looks for it on Linux: $CXX, else g++), Triton for CUDA."""
    has_cxx = shutil.which(os.environ.get("CXX", "g++")) is not None
    has_triton = importlib.util.find_spec("triton") is not None
    return ("cpu",) * has_cxx + ("cuda",) * (has_triton and torch.cuda.is_available())


def _triton_device_types() -> tuple[str, ...]:
    """CUDA, or the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""
    if importlib.util.find_spec("triton") is None:
        return ()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return ("cpu",)
    return ("cuda",) if torch.cuda.is_available() else ()


#: optional method -> its module in this package
_MODULES = {"compiled": "compiled", "numba": "numba_kernel", "triton": "triton_kernel", "auto": "auto"}


def _register_extra_methods() -> None:
    optional = {
        "compiled": _compiled_device_types(),
        "numba": ("cpu",) if importlib.util.find_spec("numba") is not None else (),
        "triton": _triton_device_types(),
        "auto": ("cpu", "cuda"),
    }
    for name, device_types in optional.items():
        if device_types:
            METHODS[name] = _lazy(name, f"esper.gae.{_MODULES[name]}", f"gae_{name}")
            DEVICE_TYPES[name] = device_types


_register_extra_methods()
