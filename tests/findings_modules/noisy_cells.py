"""NOISE-tiny: a finding that declares one cell noisy between processes (`between_runs`),
measured in 2 processes, so that a run starts a replica process for it."""

from __future__ import annotations

import torch

from harness.findings import Case, CaseNoise, Finding, max_abs_difference, register

register(Finding(
    id="NOISE-tiny",
    title="a cell measured in two processes",
    claim="doubling then halving costs more than a sum",
    variants=("sum", "double"),
    baseline="sum",
    cases=lambda quick: [Case.of(n=64), Case.of(n=4096)],
    build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64, device=device),
    make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum" else (lambda: (x + x).sum() / 2),
    check=max_abs_difference,
    tolerance=lambda case: 1e-9,
    between_runs={"n=4096": CaseNoise(sd={"double": 0.2}, processes=2)},
))
