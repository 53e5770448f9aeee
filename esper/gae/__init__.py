"""Generalized Advantage Estimation over ragged, env-major rollouts: every method behind
one `compute_gae`, and the reference.

- `compute`: `compute_gae`, the entry point: checks the inputs, runs the chosen method;
- `methods`: the one table of methods (`METHODS`, `DEVICE_TYPES`, `NON_DIFFERENTIABLE`)
  and `auto`, which picks from it by the measured `crossovers` table;
- `inputs`: the input checks, the step counts as a tensor and the valid mask;
- `recurrence`: GAE as the affine recurrence the vectorized methods solve;
- one module per method: `loop` (the reviewed original), `batched` (B4-CR-03's fix as
  the ticket writes it), `addcmul`, `scan`, and the
  optional `compiled`, `numba_kernel`, `triton_kernel`, imported on their first call and
  listed in `METHODS` only where this machine runs them;
- `caches`: whether this machine's disk caches hold `compiled`'s and `numba_kernel`'s
  code yet (`caches_cold`);
- `reference`: a float64 pure-Python oracle for tests.

Every method computes the same function; they differ only in how.

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

from esper.gae.addcmul import gae_addcmul
from esper.gae.batched import gae_batched
from esper.gae.compute import compute_gae
from esper.gae.inputs import (
    COUNT_DTYPES,
    FLOAT_DTYPES,
    HALF_DTYPES,
    GaeFn,
    StepCounts,
    Tensor,
    check_gae_inputs,
    step_counts_tensor,
    valid_mask,
)
from esper.gae.loop import RESETS, gae_loop
from esper.gae.methods import (
    DEVICE_TYPES,
    METHODS,
    NON_DIFFERENTIABLE,
    TABLE,
    Method,
)
from esper.gae.recurrence import gae_recurrence_terms
from esper.gae.scan import affine_suffix_scan, gae_scan

__all__ = [
    "COUNT_DTYPES", "DEVICE_TYPES", "FLOAT_DTYPES", "HALF_DTYPES", "METHODS",
    "NON_DIFFERENTIABLE", "RESETS", "TABLE", "GaeFn", "Method", "StepCounts", "Tensor",
    "affine_suffix_scan", "check_gae_inputs", "compute_gae", "gae_addcmul", "gae_batched",
    "gae_loop", "gae_recurrence_terms", "gae_scan", "step_counts_tensor", "valid_mask",
]
