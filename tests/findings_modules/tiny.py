"""TINY-sums: many short cells, for the interruption and resume tests.

Each of `CASES` cells times two variants of a small reduction for a few milliseconds,
so a run spends its time in many cells and a signal can land before, inside or between
them.
"""

from __future__ import annotations

import torch

from harness.findings import Case, Finding, max_abs_difference, register

CASES = 10


def _make_call(variant: str, x: torch.Tensor):
    if variant == "sum":
        return lambda: x.sum()
    return lambda: x.cumsum(0)[-1]


register(Finding(
    id="TINY-sums",
    title="sum() vs the last entry of cumsum()",
    claim="cumsum()[-1] is as fast as sum()",
    variants=("sum", "cumsum"),
    baseline="sum",
    cases=lambda quick: [Case.of(n=256 * (k + 1)) for k in range(CASES)],
    build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64, device=device),
    make_call=_make_call,
    check=max_abs_difference,
    tolerance=lambda case: 1e-6,
))
