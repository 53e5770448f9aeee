"""What counts as a number where the harness checks one: never a bool.

`True` is an `int` in Python, so `isinstance(x, int)` lets `True` through as 1; every check
of a count, a number of seconds or a fraction in the harness goes through these two.
"""

from __future__ import annotations

import math


def is_real(value: object, *, finite: bool = True) -> bool:
    """An int or float that is not a bool (and, by default, finite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not finite or math.isfinite(value)


def is_whole(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
