"""USER-failing and USER-no-cases: a user's findings that go wrong in every way a run
must record and survive: a variant whose output is wrong (a FAIL row, not timed), a
variant that raises (a failed row with its error), and a `cases` function that raises
(the finding's one failed row)."""

from __future__ import annotations

import torch

from harness import Case, Finding, max_abs_difference, register

PLANTED = "planted: this variant raises"


def make_call(variant: str, x: torch.Tensor):
    if variant == "wrong":
        return lambda: x.sum(dim=1) + 1.0  # off by one everywhere: a mismatch
    if variant == "raises":
        def call():
            raise RuntimeError(PLANTED)
        return call
    return lambda: x.sum(dim=1)


def no_cases(quick: bool) -> list[Case]:
    raise KeyError("planted: cases() raises")


register(Finding(
    id="USER-failing",
    title="A right, a wrong and a raising variant",
    claim="every variant agrees",
    variants=("right", "wrong", "raises"),
    baseline="right",
    cases=[Case.of(rows=8, cols=32)],
    build=lambda case, device, seed: torch.ones(case["rows"], case["cols"], device=device),
    make_call=make_call,
    check=max_abs_difference,
    tolerance=1e-6,
))

register(Finding(
    id="USER-no-cases",
    title="A finding whose cases() raises",
    claim="its cases can be listed",
    variants=("a", "b"),
    baseline="a",
    cases=no_cases,
    build=lambda case, device, seed: None,
    make_call=lambda variant, inputs: lambda: None,
))
