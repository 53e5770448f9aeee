"""Planted regressions for measuring the gate itself (`harness.gate.quality`, tests/test_gate.py).

Nothing in esper or in the gate imports this module. A plant wraps one GAE method of
`esper.gae.METHODS`: `slowed` repeats whole calls so the method does `factor` times its
work on average (1.25: every fourth call runs twice), `allocating` adds one small
allocation per call. `planted` installs a wrapper in this process and restores the
original after; `plant_lines` gives lines that append the same wrapper to the `esper/gae/methods.py` of a
throw-away copy of a tree, for the A/B check, whose worker processes import that copy.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch


def slowed(fn: Callable, factor: float) -> Callable:
    """`fn` doing `factor` (>= 1) times its work on average: some calls run it again."""
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ValueError(f"slowed: factor: expected a finite number >= 1; got {factor!r}")
    credit = 0.0

    def planted_slow(*args, **kwargs):
        nonlocal credit
        result = fn(*args, **kwargs)
        credit += factor - 1.0
        while credit >= 1.0 - 1e-9:  # the tolerance keeps 4 x 0.25 from falling short of 1
            fn(*args, **kwargs)
            credit -= 1.0
        return result

    return planted_slow


def allocating(fn: Callable) -> Callable:
    """`fn` plus one allocation of 16 floats per call (one op, one allocation, 64 bytes)."""

    def planted_allocation(*args, **kwargs):
        torch.empty(16)
        return fn(*args, **kwargs)

    return planted_allocation


@contextlib.contextmanager
def planted(method: str, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Replace `esper.gae.METHODS[method]` by `wrap(original)` in this process, then restore it."""
    from esper import gae  # late: plain imports of this module must not pull in esper

    if method not in gae.METHODS:
        raise ValueError(f"planted: method: expected one of {', '.join(gae.METHODS)}; "
                         f"got {method!r}")
    original = gae.METHODS[method]
    gae.METHODS[method] = wrap(original)
    try:
        yield
    finally:
        gae.METHODS[method] = original


def plant_lines(method: str, factor: float) -> str:
    """Python lines that, appended to a tree's esper/gae/methods.py, slow `method` by `factor`."""
    return (
        "\n\n# planted by harness.gate.quality in a throw-away copy of the tree\n"
        "from harness.gate.plant import slowed as _planted_slowed\n"
        f"METHODS[{method!r}] = _planted_slowed(METHODS[{method!r}], {factor!r})\n"
    )
