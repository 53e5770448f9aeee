"""RANK-failure: a finding that breaks rank 1 of a torchrun launch outside any cell's
measurement (its `skip` raises there), to test that the other ranks' cells are kept."""

from __future__ import annotations

import os

import torch

from harness.findings import Case, Finding, max_abs_difference, register


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    if os.environ.get("RANK") == "1":
        raise RuntimeError("planted failure on rank 1")
    return None


register(Finding(
    id="RANK-failure",
    title="a finding whose rank 1 fails",
    claim="rank failures are recorded",
    variants=("sum", "double"),
    baseline="sum",
    cases=lambda quick: [Case.of(n=64 * (k + 1)) for k in range(4)],
    build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64, device=device),
    make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum" else (lambda: (x + x).sum() / 2),
    check=max_abs_difference,
    tolerance=lambda case: 1e-9,
    skip=_skip,
))
