"""Generalized Advantage Estimation: every method behind one `compute_gae`, and the reference.

- `api`: `compute_gae`, the input checks, the shared affine-recurrence terms, and the
  methods that need nothing but torch (`loop`, `batched`, `scan`);
- `compiled`, `numba_kernel`, `triton_kernel`, `auto`: optional methods, imported on
  their first call and listed in `METHODS` only where this machine runs them;
- `reference`: a float64 pure-Python oracle for tests.

The semantics every method computes are in `esper.gae.inputs`'s docstring.
"""

from esper.gae.inputs import (
    COUNT_DTYPES,
    DEVICE_TYPES,
    FLOAT_DTYPES,
    HALF_DTYPES,
    METHODS,
    NON_DIFFERENTIABLE,
    GaeFn,
    StepCounts,
    Tensor,
    affine_suffix_scan,
    check_gae_inputs,
    compute_gae,
    gae_batched,
    gae_loop,
    gae_recurrence_terms,
    gae_scan,
    step_counts_tensor,
    valid_mask,
)

__all__ = [
    "COUNT_DTYPES", "DEVICE_TYPES", "FLOAT_DTYPES", "HALF_DTYPES", "METHODS",
    "NON_DIFFERENTIABLE", "GaeFn", "StepCounts", "Tensor", "affine_suffix_scan",
    "check_gae_inputs", "compute_gae", "gae_batched", "gae_loop", "gae_recurrence_terms",
    "gae_scan", "step_counts_tensor", "valid_mask",
]
