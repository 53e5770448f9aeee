"""`compute_gae`: the one entry point, checks its inputs and runs the chosen method."""

from __future__ import annotations

from esper.gae.inputs import HALF_DTYPES, StepCounts, Tensor, check_gae_inputs
from esper.gae.loop import RESETS
from esper.gae.methods import METHODS


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
    reset: str = "restructured",
) -> tuple[Tensor, Tensor]:
    """Advantages and returns for a ragged batch of rollouts (semantics: `esper.gae`).

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
        reset: one of `RESETS` (`clone`, `mask`, `assign`, `restructured`): how the `loop`
            method resets the trace at a true terminal (`gae_loop` says what each does,
            and on which inputs the first three, the reviewed lines, compute these
            semantics). It is passed to `loop` only, the one method with a reset
            to choose; every other method computes the same cut without allocating or
            branching, so with them `reset` changes nothing (and is not an error: the
            `Variants` axes `reset` and `gae` are independent). It is checked either way.

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
    if reset not in RESETS:
        raise ValueError(f"compute_gae: reset: expected one of {', '.join(RESETS)}; got {reset!r}")
    _, dtype = check_gae_inputs(
        rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda
    )
    if dtype in HALF_DTYPES:  # one rounding at the end instead of one per step
        rewards, values, bootstrap_values = (
            t.float() for t in (rewards, values, bootstrap_values)
        )
    if method == "loop":
        advantages, returns = gae_method(
            rewards, values, dones, truncated, bootstrap_values, step_counts,
            gamma=gamma, gae_lambda=gae_lambda, reset=reset,
        )
    else:
        advantages, returns = gae_method(
            rewards, values, dones, truncated, bootstrap_values, step_counts,
            gamma=gamma, gae_lambda=gae_lambda,
        )
    if dtype in HALF_DTYPES:
        return advantages.to(dtype), returns.to(dtype)
    return advantages, returns
