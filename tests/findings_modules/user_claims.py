"""USER-rowsums: a finding declared as a user of the harness would, through its public API.

The claim is about code this project did not write (torch's own reduction against a
Python loop over rows), and the module is named to `harness.run` / `harness.gate` with
`--findings-module tests.findings_modules.user_claims`.
"""

from __future__ import annotations

import torch

from harness import About, Case, Finding, max_abs_difference, register


def build(case: Case, device: torch.device, seed: int) -> torch.Tensor:
    """[rows, cols] float32 uniform in [0, 1), from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(case["rows"], case["cols"], generator=generator).to(device)


def make_call(variant: str, x: torch.Tensor):
    if variant == "row_loop":
        return lambda: torch.stack([row.sum() for row in x])
    return lambda: x.sum(dim=1)


register(Finding(
    id="USER-rowsums",
    title="Row sums: a Python loop over rows vs one sum(dim=1)",
    claim="sum(dim=1) is ~8x faster than summing row by row",
    variants=("row_loop", "sum_dim"),
    baseline="row_loop",
    cases=lambda quick: [Case.of(rows=16, cols=64)] if quick else
    [Case.of(rows=16, cols=64), Case.of(rows=128, cols=64)],
    build=build,
    make_call=make_call,
    reference=lambda x: x.double().sum(dim=1),
    check=max_abs_difference,
    tolerance=1e-4,
    about=About(
        ticket="https://example.org/review/1",
    ),
))
