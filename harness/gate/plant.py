"""Planted regressions for measuring the gate itself (`harness.gate.quality`, tests/harness/gate/test_gate.py).

Nothing in the code under test or in the gate imports this module. A plant wraps one
function of the code under test, a `PlantTarget` that the findings module names
(`harness.Defaults.plant`, e.g. `mylib.ops.KERNELS['fast']`):
`slowed` makes every call last `factor` times as long as the function took for it,
`allocating` adds one small allocation per call.
`planted` installs a wrapper in this process and restores the original after;
`plant_lines` gives lines that append the same wrapper to the target's module file in a
throw-away copy of a tree, for the A/B check, whose worker processes import that copy.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
from collections.abc import Callable, Iterator

import torch

from harness.findings import PlantTarget


def slowed(fn: Callable, factor: float) -> Callable:
    """`fn` with every call lasting `factor` (>= 1) times as long as `fn` took for it: it
    runs once, then the wrapper spins on the clock for the rest. Every call alike, as a
    real regression of the code would be (repeating one call in four, as this did once,
    made a sample of a few calls two-mode, and a trimmed mean read such a plant short).
    Where CUDA is in use the device is synchronized around the call, so that the time
    slowed is the device's too (the spin itself is host time)."""
    if not (math.isfinite(factor) and factor >= 1.0):
        raise ValueError(f"slowed: factor: expected a finite number >= 1; got {factor!r}")

    def planted_slow(*args, **kwargs):
        synchronize = torch.cuda.is_initialized()
        if synchronize:
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        if synchronize:
            torch.cuda.synchronize()
        until = started + factor * (time.perf_counter() - started)
        while time.perf_counter() < until:
            pass
        return result

    return planted_slow


def allocating(fn: Callable) -> Callable:
    """`fn` plus one allocation of 16 floats per call (one op, one allocation, 64 bytes)."""

    def planted_allocation(*args, **kwargs):
        torch.empty(16)
        return fn(*args, **kwargs)

    return planted_allocation


@contextlib.contextmanager
def planted(target: PlantTarget, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Replace `target` (`module.attribute[key]`) by `wrap(original)` in this process, then
    restore it."""
    table = getattr(importlib.import_module(target.module), target.attribute)
    if target.key not in table:
        raise ValueError(f"planted: target: expected one of {', '.join(map(str, table))} in "
                         f"{target.module}.{target.attribute}; got {target.key!r}")
    original = table[target.key]
    table[target.key] = wrap(original)
    try:
        yield
    finally:
        table[target.key] = original


def plant_lines(target: PlantTarget, factor: float) -> str:
    """Python lines that, appended to `target`'s module file, slow it by `factor`."""
    entry = f"{target.attribute}[{target.key!r}]"
    return (
        "\n\n# planted by harness.gate.quality in a throw-away copy of the tree\n"
        "from harness.gate.plant import slowed as _planted_slowed\n"
        f"{entry} = _planted_slowed({entry}, {factor!r})\n"
    )
