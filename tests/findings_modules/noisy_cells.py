"""NOISE-tiny: two cells of a sum against doubling then halving, and a print to stdout in
every call (a worker's protocol must not take it for an answer). With NOISE_THREADS_LOG
set, each build appends the torch threads it ran at to that file; with NOISE_EXTRA_LOG,
each extra-metrics call appends its process id and variant."""

from __future__ import annotations

import os

import torch

from harness.findings import Case, Finding, Recording, max_abs_difference, register


def _build(case, device, seed) -> torch.Tensor:
    log = os.environ.get("NOISE_THREADS_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} {torch.get_num_threads()}\n")
    return torch.arange(case["n"], dtype=torch.float64, device=device)


def _extra(variant: str, x: torch.Tensor) -> dict[str, float]:
    log = os.environ.get("NOISE_EXTRA_LOG")
    if log:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} {variant}\n")
    return {"elements": float(x.numel())}


def _double(x: torch.Tensor):
    def call():
        print("a finding that prints")
        return (x + x).sum() / 2
    return call


register(Finding(
    id="NOISE-tiny",
    title="a sum against doubling then halving",
    claim="doubling then halving costs more than a sum",
    variants=("sum", "double"),
    baseline="sum",
    cases=lambda quick: [Case.of(n=64), Case.of(n=4096)],
    build=_build,
    make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum" else _double(x),
    check=max_abs_difference,
    tolerance=lambda case: 1e-9,
    recording=Recording(extra_metrics=_extra),
))
