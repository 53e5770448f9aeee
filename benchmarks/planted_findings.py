"""Findings whose answer is known: the variant does a planted fraction more work.

`PLANTED-10` and `PLANTED-3` time a call against the same call doing 10% (3%) more of
the same work: a Python loop of N against 1.1 N (1.03 N) iterations, or N small torch
ops against 1.1 N (1.03 N). Their true ratios are 1.10 and 1.03 (to within the call's
fixed cost, a few hundred nanoseconds), so the words a run gives them measure how often
the harness is right: +10% should read *slower*, +3% never *faster*. Cases: the kind of
work, its size (Python: about 5 us, 100 us and 2 ms per call here; torch: 200 us and 2 ms)
and a replicate index, so that each (kind, size) is judged in several cells of one run.

Used by `benchmarks/verdict_stability.py planted`; run by hand with
`python -m harness.run --findings-module benchmarks.planted_findings`.
"""

from __future__ import annotations

import torch

from harness import About, Case, Finding, register

#: iterations (Python) or ops (torch) of the baseline call, per size: multiples of 100,
#: so that 1.10 N and 1.03 N are whole and the true ratios exact. A torch call of a few
#: microseconds is two ops, to which no whole op adds 10% (a first version planted
#: round(2 x 1.1) = 2 ops, a ratio of 1, and counted its "same" words as misses)
SIZES = {"python": {"5us": 200, "100us": 4_000, "2ms": 80_000},
         "torch": {"200us": 100, "2ms": 800}}
REPLICATES = 10


def _cases(quick: bool) -> list[Case]:
    replicates = 2 if quick else REPLICATES
    return [Case.of(kind=kind, size=size, replicate=r)
            for kind, sizes in SIZES.items() for size in sizes for r in range(replicates)]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    return {"n": SIZES[case["kind"]][case["size"]], "kind": case["kind"],
            "x": torch.ones(8, device=device)}


def _python_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i & 7
    return total


def _torch_ops(x: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = x.mul(1.0)
    return x


def _make_call(factor: float):
    def make_call(variant: str, inputs: dict):
        n = inputs["n"] if variant == "baseline" else round(inputs["n"] * factor)
        assert variant == "baseline" or n / inputs["n"] == factor, (inputs["n"], factor)
        if inputs["kind"] == "python":
            return lambda: _python_loop(n)
        x = inputs["x"]
        return lambda: _torch_ops(x, n)

    return make_call


for percent, factor in ((10, 1.10), (3, 1.03)):
    register(Finding(
        id=f"PLANTED-{percent}",
        title=f"A call against the same call doing {percent}% more work",
        claim=f"the planted variant is {percent}% slower",
        variants=("baseline", "planted"), baseline="baseline",
        cases=_cases, build=_build, make_call=_make_call(factor),
        gated=False,
        about=About(
            notes=(f"The planted variant runs {factor:g}x the baseline's loop iterations or "
                   "torch ops: its true time ratio is known.",),
        ),
    ))
