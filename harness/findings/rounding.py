"""Tolerances derived from how a value was computed, not fitted to one machine.

Two correct programs that compute the same quantity in floating point differ by their
rounding errors, which depend on the dtype, on the math the device uses for it (TF32 on
CUDA for float32 matrix products and convolutions, when allowed), on the magnitude of the
terms and on how many roundings stand between the inputs and the output (the depth: the
length of the longest chain of accumulations). Another CPU (AVX-512 rather than AVX2
kernels), another thread count or a GPU changes which roundings happen, never their size.

The bound used is the probabilistic one of Higham and Mary ("A new approach to
probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4):
a computation of depth n in unit roundoff u has relative error at most

    gamma(n, lam) = exp(lam * sqrt(n) * u + n * u**2 / (1 - u)) - 1

with probability at least 1 - 2 n exp(-lam**2 (1 - u)**2 / 2); with lam = `LAMBDA` (7)
that is 1 - 5e-11 n. Two programs each within it of the exact value are within twice it
of each other. The worst-case bound, n u, holds always but is too loose to catch anything
at the depths of a training iteration.
"""

from __future__ import annotations

import math

import torch

#: Higham and Mary's lambda: the bound fails with probability below 5e-11 per rounding
LAMBDA = 7.0
#: unit roundoff (half the machine epsilon) of each floating dtype
UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24,
                 torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
#: TF32: float32 storage, a 10-bit mantissa in CUDA's matrix products and convolutions
TF32_UNIT_ROUNDOFF = 2.0 ** -11


def unit_roundoff(dtype: torch.dtype, device: torch.device | str = "cpu",
                  matmul: bool = False) -> float:
    """The unit roundoff of arithmetic in `dtype` on `device`; with `matmul` (the
    computation has matrix products, LSTMs or convolutions), TF32's for float32 on CUDA
    where torch lets cuBLAS or cuDNN use it."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"unit_roundoff: dtype: expected one of "
                         f"{', '.join(map(str, UNIT_ROUNDOFF))}; got {dtype}")
    if matmul and dtype == torch.float32 and torch.device(device).type == "cuda" and (
            torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32
            or torch.get_float32_matmul_precision() != "highest"):
        return TF32_UNIT_ROUNDOFF
    return UNIT_ROUNDOFF[dtype]


def rounding_tolerance(depth: int, dtype: torch.dtype = torch.float32,
                       device: torch.device | str = "cpu", matmul: bool = False) -> float:
    """The relative difference two correct computations of depth `depth` (roundings in the
    longest chain of accumulations) in `dtype` on `device` stay within (`matmul`: they
    multiply matrices, in TF32 on CUDA where allowed: `unit_roundoff`): twice Higham and
    Mary's probabilistic bound (module docstring). Pair it with `max_relative_error`,
    which scales the difference by the reference's magnitude."""
    if not (isinstance(depth, int) and not isinstance(depth, bool) and depth >= 1):
        raise ValueError(f"rounding_tolerance: depth: expected an integer >= 1 (roundings in "
                         f"the longest chain); got {depth!r}")
    u = unit_roundoff(dtype, device, matmul)
    return 2.0 * math.expm1(LAMBDA * math.sqrt(depth) * u + depth * u * u / (1.0 - u))


def max_relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    """max |output - reference| over max(1, max |reference|), in float64: a difference on
    the scale of the values (at least 1, so that values near 0 are not divided by ~0)."""
    ref = reference.double().cpu()
    error = (output.double().cpu() - ref).abs().max().item()
    return error / max(1.0, ref.abs().max().item())
