"""The argument checks esper's configs and constructors share.

Each raises `ValueError("{field}: expected {what}; got {value!r}")`, naming the field,
what was expected and what was received, and returns the value when it passes. A bool
is never taken for a number (`True` is an `int` to Python, not a count or a rate to us).

`is_int` and `is_integral` are the predicates behind them, for checks on a hot path
that test first and only build a message on failure. `parse_int` reads an int from text
(a command-line value) with `check_int`'s bounds and message. `check_device` is every
constructor's check of the device it is given.
"""

from __future__ import annotations

import math
import re
from numbers import Integral, Real
from typing import Sequence, TypeVar

import torch

Choice = TypeVar("Choice")


def is_int(value: object) -> bool:
    """A Python `int` that is not a `bool`."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_integral(value: object) -> bool:
    """An integer of any kind (a Python int, a NumPy integer) that is not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_int(field: str, value: object, minimum: int = 1, below: int | None = None) -> int:
    """`value`, a Python int (not a bool) >= `minimum` and, given `below`, < `below`."""
    if not is_int(value) or value < minimum or (below is not None and value >= below):
        if below is not None:
            expected = f"an int in [{minimum}, {below})"
        elif minimum == 1:
            expected = "a positive int"
        else:
            expected = f"an int >= {minimum}"
        raise ValueError(f"{field}: expected {expected}; got {value!r}")
    return value


#: a decimal integer in ASCII digits, at most 64 of them (`int` would also take '1_000',
#: other scripts' digits such as '\u0661', and raise on more than 4300 digits)
_DECIMAL = re.compile(r"[+-]?[0-9]{1,64}")


def parse_int(field: str, text: str, minimum: int = 1, below: int | None = None) -> int:
    """The int written in `text` (decimal ASCII digits, spaces around allowed), checked by
    `check_int(field, value, minimum, below)`; anything else is its ValueError with the
    text as received (its first 60 characters and '...' when longer)."""
    stripped = text.strip()
    if _DECIMAL.fullmatch(stripped):
        return check_int(field, int(stripped), minimum, below)
    return check_int(field, text if len(text) <= 63 else text[:60] + "...", minimum, below)


def check_number(field: str, value: object, *, minimum: float | None = None,
                 maximum: float | None = None, positive: bool = False) -> float:
    """`value`, a finite real number (not a bool) within the bounds given: `minimum` and
    `maximum` inclusive, `positive` for > 0."""
    ok = (isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
          and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
          and (not positive or value > 0))
    if not ok:
        if minimum is not None and maximum is not None:
            bound = f" in [{minimum:g}, {maximum:g}]"
        elif positive:
            bound = " > 0"
        elif minimum is not None:
            bound = f" >= {minimum:g}"
        elif maximum is not None:
            bound = f" <= {maximum:g}"
        else:
            bound = ""
        raise ValueError(f"{field}: expected a finite number{bound}; got {value!r}")
    return value


def check_bool(field: str, value: object) -> bool:
    """`value`, a Python bool (not 0 or 1)."""
    if not isinstance(value, bool):
        raise ValueError(f"{field}: expected a bool; got {value!r}")
    return value


def check_choice(field: str, value: Choice, allowed: Sequence[Choice]) -> Choice:
    """`value`, one of `allowed` (listed in the message when it is not)."""
    if value not in allowed:
        raise ValueError(f"{field}: expected one of {', '.join(map(str, allowed))}; got {value!r}")
    return value


#: the kinds of device esper runs on; `meta` holds shapes without data (the tests' stand-in
#: for a device the machine lacks)
DEVICE_TYPES = ("cpu", "cuda", "meta")


def check_device(field: str, value: object) -> torch.device:
    """`value` (a `torch.device` or its name) as a `torch.device` esper can run on here: the
    CPU, a CUDA device this machine has, or `meta`. Anything else is a ValueError naming
    `field`, not torch's own error from deep inside the first tensor made there."""
    if not isinstance(value, (str, torch.device)):
        raise ValueError(f"{field}: expected a torch.device or its name ('cpu', 'cuda', "
                         f"'cuda:0'); got {value!r} ({type(value).__name__})")
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"{field}: expected 'cpu', 'cuda' or 'cuda:N' (or a torch.device of "
                         f"one); got {value!r}, which torch does not know as a device") from None
    if device.type not in DEVICE_TYPES:
        raise ValueError(f"{field}: expected a cpu or cuda device; got {str(value)!r}: esper "
                         "runs on the CPU and on CUDA")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{field}: expected a device this machine has; got {str(value)!r}, "
                             "but this torch has no CUDA (torch.cuda.is_available() is False): "
                             "use 'cpu'")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{field}: expected cuda:0 to cuda:{count - 1} (this machine has "
                             f"{count} CUDA device(s)); got {str(value)!r}")
    return device
