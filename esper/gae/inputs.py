"""The inputs every GAE method takes: their types, their one shared check, and the step
counts as a tensor and a valid mask.

`check_gae_inputs` runs once per `compute_gae` call, before any method; the methods
themselves assume checked inputs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import numpy as np
import torch

from esper.checks import check_number, is_integral
from esper.host_view import host_view

Tensor = torch.Tensor
StepCounts = Sequence[int] | Tensor
GaeFn = Callable[..., tuple[Tensor, Tensor]]
"""A GAE method: `(rewards, values, dones, truncated, bootstrap_values, step_counts, *,
gamma, gae_lambda) -> (advantages, returns)` (the `loop` method also takes `reset`)."""


#: Float dtypes `compute_gae` takes; the half-precision ones are computed in float32.
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: Computed in float32 by every method, the results cast back (`compute_gae`).
HALF_DTYPES = (torch.float16, torch.bfloat16)
#: Integer dtypes a step-count tensor may have.
COUNT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
#: Below this many envs, CPU count tensors are range-checked in Python (no NumPy call).
_PYTHON_RANGE_MAX = 64
_BOOL, _INT64 = torch.bool, torch.int64


def _shape_error(field: str, expected: object, got: object) -> ValueError:
    return ValueError(f"compute_gae: {field}: expected {expected}; got {got}")


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def meta_error(where: str, field: str) -> ValueError:
    """The one error for a meta tensor given to `compute_gae` or to any method."""
    return ValueError(f"{where}: {field}.device: expected a device that holds values (cpu or "
                      "cuda); got meta (a meta tensor has a shape but no values to compute)")


def refuse_meta(where: str, rewards: Tensor, step_counts: StepCounts) -> None:
    """`meta_error` when `rewards` or a tensor `step_counts` is a meta tensor: what each
    method checks on entry (two attribute reads), `where` naming it (`gae_scan`). The
    methods take inputs on one device (`compute_gae` checks that and names any meta
    input), so rewards stand for the other tensors."""
    if rewards.is_meta:
        raise meta_error(where, "rewards")
    if isinstance(step_counts, Tensor) and step_counts.is_meta:
        raise meta_error(where, "step_counts")


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
    (`python -m esper_review.gae_tools.floor` times it).

    What is checked where:

    - tensors: type, shape, dtype (`FLOAT_DTYPES` for the floats, all alike; bool flags)
      and device (one device for all five, not `meta`: a meta tensor holds no values),
      from their metadata. Float *values* are not read: a NaN or inf at a
      valid step spreads through its row's earlier steps, even across an episode end
      (`RolloutBuffer.add` rejects them at the source); padding past a row's count may
      hold anything.
    - step counts given as a sequence (list, tuple, range): a Python int per env
      (`bool` and other types rejected) in [0, max_steps]. Any other non-tensor
      (a generator, a set, a NumPy array) is rejected.
    - step counts given as a tensor: 1-D [num_envs] of a `COUNT_DTYPES` dtype, not on
      `meta`; every count in [0, max_steps]. A CPU tensor is read in place (`_counts_in_range`, or
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
                 or (_same_device(rewards, values, dones, truncated, bootstrap_values)
                     and not rewards.is_meta))
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
    named = (("rewards", rewards), ("values", values), ("dones", dones),
             ("truncated", truncated), ("bootstrap_values", bootstrap_values))
    for name, tensor in named:
        if not isinstance(tensor, Tensor):
            raise _shape_error(name, "a torch.Tensor", type(tensor).__name__)
    for name, tensor in named:
        if tensor.is_meta:
            raise meta_error("compute_gae", name)
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
            if step_counts.is_meta:
                raise meta_error("compute_gae", "step_counts")
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
        if type(count) is not int and not is_integral(count):
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
    check_number(f"compute_gae: {name}", value, minimum=0.0, maximum=1.0)


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
