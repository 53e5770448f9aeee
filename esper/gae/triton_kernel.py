"""GAE as a single Triton kernel: each program owns a block of envs and walks time backwards.

Program `p` owns envs `p*BLOCK_ENVS ... +BLOCK_ENVS-1` and visits their rows in tiles of
`BLOCK_STEPS` steps, from the last tile to the first, with the advantage at the start
of the tile it just left (`carry`, one value per env) kept in registers. Per tile:

1. load the tile [BLOCK_ENVS, BLOCK_STEPS] (masked: nothing at or past a row's count,
   so stale padding is never read) and form `delta_t`, `coef_t` as in
   `esper.gae.gae_recurrence_terms`;
2. solve the tile's recurrence with `tl.associative_scan` over the affine maps
   `x -> delta_t + coef_t * x`, time laid out descending so the scan runs forwards
   (forward scans keep the operand order on every backend; the maps do not commute);
3. `A_t = D_t + P_t * carry` (D, P: the composed map from t to the tile's end),
   store advantages and returns, and carry the tile's first advantage on.

One launch, each input read once and each output written once; no host sync (step
counts are read on the device). Arithmetic runs in float64 for float64 inputs and in
float32 otherwise (bfloat16 and float16 are loaded, widened, and rounded once at the
store, as a 16-bit carry would lose the trace within a few dozen steps). The launch
happens under the inputs' device, so Triton, which launches on the current device and
its current stream, runs it where the tensors live. Untuned: BLOCK_ENVS=8,
BLOCK_STEPS=64, 4 warps are reasonable defaults for an H100-class GPU, not measured
ones (`tests/esper/gae/test_triton_aot.py` compiles them for sm_80 and sm_90: no spills).

Runs on CUDA tensors; with `TRITON_INTERPRET=1` set before import, Triton's
interpreter runs the same kernel on CPU tensors (slowly: for tests only).
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from esper.gae.inputs import StepCounts, Tensor, refuse_grad, refuse_meta, step_counts_tensor

#: Whether Triton's CPU interpreter runs the kernel (TRITON_INTERPRET=1 at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: Device type the kernel takes tensors on.
DEVICE_TYPE = "cpu" if INTERPRETED else "cuda"

BLOCK_ENVS = 8
BLOCK_STEPS = 64
NUM_WARPS = 4


def available() -> bool:
    """Whether this machine can run the kernel: the interpreter, or a CUDA device."""
    return INTERPRETED or torch.cuda.is_available()


@triton.jit
def _compose(later_delta, later_coef, delta, coef):
    """(map_t o later): x -> delta + coef * (later_delta + later_coef * x)."""
    return delta + coef * later_delta, coef * later_coef


@triton.jit
def _gae_kernel(
    rewards, values, dones, truncated, bootstrap, step_counts, scalars,
    advantages, returns, num_envs, max_steps,
    BLOCK_ENVS: tl.constexpr, BLOCK_STEPS: tl.constexpr,
):
    envs = tl.program_id(0) * BLOCK_ENVS + tl.arange(0, BLOCK_ENVS)  # [BE]
    env_ok = envs < num_envs
    steps = tl.load(step_counts + envs, mask=env_ok, other=0)  # [BE] int64
    row = envs.to(tl.int64) * max_steps  # [BE] offset of each row
    gamma = tl.load(scalars)  # the compute dtype: float64, or float32 for narrower inputs
    trace = tl.load(scalars + 1)  # gamma * lambda
    out_dtype = advantages.dtype.element_ty
    carry = tl.zeros([BLOCK_ENVS], dtype=gamma.dtype)  # A at the start of the tile after
    lane = tl.arange(0, BLOCK_STEPS)
    num_tiles = tl.cdiv(max_steps, BLOCK_STEPS)
    for k in range(num_tiles):
        # descending times: lane j holds t = tile end - j, so a forward scan walks back
        t = (num_tiles - k) * BLOCK_STEPS - 1 - lane  # [BS]
        at = row[:, None] + t[None, :]  # [BE, BS]
        in_row = env_ok[:, None] & (t[None, :] < max_steps)
        valid = in_row & (t[None, :] < steps[:, None])
        is_last = t[None, :] == steps[:, None] - 1
        r = tl.load(rewards + at, mask=valid, other=0.0).to(gamma.dtype)
        v = tl.load(values + at, mask=valid, other=0.0).to(gamma.dtype)
        b = tl.load(bootstrap + at, mask=valid, other=0.0).to(gamma.dtype)
        has_next = valid & ~is_last & (t[None, :] + 1 < max_steps)
        next_v = tl.load(values + at + 1, mask=has_next, other=0.0).to(gamma.dtype)
        done = tl.load(dones + at, mask=valid, other=0) != 0
        cut = tl.load(truncated + at, mask=valid, other=0) != 0
        next_v = tl.where(cut | is_last, b, next_v)  # bootstrap or V_{t+1}
        next_v = tl.where(done & ~cut, 0.0, gamma * next_v)  # true terminal: no bootstrap
        delta = tl.where(valid, r + next_v - v, 0.0)
        coef = tl.where(valid & ~(done | cut), trace, 0.0)  # an episode end cuts the trace
        composed, product = tl.associative_scan((delta, coef), 1, _compose)
        adv = composed + product * carry[:, None]
        tl.store(advantages + at, adv.to(out_dtype), mask=in_row)
        tl.store(returns + at, tl.where(valid, adv + v, 0.0).to(out_dtype), mask=in_row)
        # the tile's earliest step (lane BLOCK_STEPS - 1) is the next tile's carry
        carry = tl.sum(tl.where(lane[None, :] == BLOCK_STEPS - 1, adv, 0.0), axis=1)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel computes in for inputs of `dtype`: float64 stays, every
    narrower float (float32, bfloat16, float16) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def launch_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Make `device` current for a launch: Triton launches on the current CUDA device and
    that device's current stream, not on the tensors' device. Nothing for the interpreter."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def gae_triton(
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
    """GAE by the Triton kernel; arguments and results as `esper.gae.compute_gae`.

    rewards, values, bootstrap_values: [num_envs, max_steps] float64/float32/bfloat16/
    float16 on a CUDA device (on the CPU under TRITON_INTERPRET=1); dones, truncated:
    [num_envs, max_steps] bool; step_counts: list or 1-D integer tensor [num_envs] (a
    list is copied to the device on every call, see `compute_gae`). Returns
    (advantages, returns), new contiguous [num_envs, max_steps] tensors of the inputs'
    dtype and device. Called directly, tensor step counts are not range-checked
    (`compute_gae` checks them, on the device); counts past max_steps read no memory out
    of the row's bounds but give undefined results. The kernel computes outside
    autograd: an input that requires grad (in grad mode) raises `ValueError`. No host
    sync; gamma and lambda reach the device as fill kernels, not host copies.
    """
    refuse_meta("gae_triton", rewards, step_counts)
    if rewards.device.type != DEVICE_TYPE:
        raise ValueError(
            f"gae_triton: rewards.device: expected {DEVICE_TYPE} "
            f"({'TRITON_INTERPRET=1' if INTERPRETED else 'a CUDA kernel'}); got {rewards.device}"
        )
    refuse_grad("triton", rewards, values, bootstrap_values)
    num_envs, max_steps = rewards.shape
    advantages = torch.empty((num_envs, max_steps), dtype=rewards.dtype, device=rewards.device)
    returns = torch.empty_like(advantages)
    if num_envs == 0 or max_steps == 0:
        return advantages, returns
    counts = step_counts_tensor(step_counts, rewards.device)
    # (gamma, gamma * lambda) in the compute dtype (Triton would pass a Python float as
    # fp32), written on the device by two fills: no host-to-device copy per call
    scalars = torch.full((2,), gamma, dtype=compute_dtype(rewards.dtype), device=rewards.device)
    scalars[1:].fill_(gamma * gae_lambda)
    with launch_device(rewards.device):
        _gae_kernel[(triton.cdiv(num_envs, BLOCK_ENVS),)](
            rewards.contiguous(), values.contiguous(),
            dones.contiguous().view(torch.uint8), truncated.contiguous().view(torch.uint8),
            bootstrap_values.contiguous(), counts.contiguous(), scalars,
            advantages, returns, num_envs, max_steps,
            BLOCK_ENVS=BLOCK_ENVS, BLOCK_STEPS=BLOCK_STEPS, num_warps=NUM_WARPS,
        )
    return advantages, returns
