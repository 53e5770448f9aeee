"""Every command's options, parsed by one set of typed parsers before anything is done.

`Parser` is the argparse parser of every harness command: a bad option is one line on
stderr (`error: argument --seed: expected an integer seed in [0, 4294967295]; got '-1'`)
and exit 2: a `harness.exits.UsageError`. The types below are passed as `type=`:
each names what it expects and what it got, and none accepts NaN or infinity where a
number of seconds, a fraction or a factor is asked for. Options that depend on others
(or on the machine) are checked by the command right after parsing, still before anything
is created on disk.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from harness import exits

_INTEGER = re.compile(r"[+-]?[0-9]+")
#: the seeds every library the harness seeds accepts (numpy's legacy seeds are 32-bit)
MAX_SEED = 2**32 - 1


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are `exits.UsageError`s: one line naming the
    option, and exit 2 from the command (`exits.command`), not argparse's own exit."""

    def error(self, message: str) -> NoReturn:
        raise exits.UsageError(f"{message} (see {self.prog} --help)")


def _bad(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")


def _number(text: str, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(expected, text) from None
    if not math.isfinite(value):
        raise _bad(expected, text)
    return value


def seconds(text: str) -> float:
    """Finite seconds > 0."""
    value = _number(text, "finite seconds > 0, e.g. 1.5")
    if not value > 0:
        raise _bad("finite seconds > 0, e.g. 1.5", text)
    return value


def fraction(text: str) -> float:
    """A fraction in (0, 1)."""
    value = _number(text, "a fraction in (0, 1), e.g. 0.05")
    if not 0 < value < 1:
        raise _bad("a fraction in (0, 1), e.g. 0.05", text)
    return value


def fraction_or_zero(text: str) -> float:
    """A fraction in [0, 1)."""
    value = _number(text, "a fraction in [0, 1), e.g. 0.03")
    if not 0 <= value < 1:
        raise _bad("a fraction in [0, 1), e.g. 0.03", text)
    return value


def factor(text: str) -> float:
    """A finite factor > 1."""
    value = _number(text, "a finite factor > 1, e.g. 1.05")
    if not value > 1:
        raise _bad("a finite factor > 1, e.g. 1.05", text)
    return value


def _integer(text: str, expected: str) -> int:
    """A decimal integer in ASCII digits between ASCII blanks (`int` would also read '١'
    or '1_000'; `str.strip` would also drop '\\x1f', which `int` refuses)."""
    digits = text.strip(" \t\n\r\f\v")
    if not _INTEGER.fullmatch(digits):
        raise _bad(expected, text)
    return int(digits)


def _integers(low: int, high: int | None, expected: str, name: str) -> Callable[[str], int]:
    """An integer >= `low` (and <= `high` unless None), named `name` to argparse."""

    def parse(text: str) -> int:
        value = _integer(text, expected)
        if value < low or (high is not None and value > high):
            raise _bad(expected, text)
        return value

    parse.__name__ = name  # argparse names a type by its __name__
    return parse


def at_least(low: int, what: str = "an integer") -> Callable[[str], int]:
    """An integer >= `low`."""
    return _integers(low, None, f"{what} >= {low}", f"integer >= {low}")


def integer_from(low: int, high: int) -> Callable[[str], int]:
    """An integer from `low` to `high`, both included."""
    expected = f"an integer from {low} to {high}"
    return _integers(low, high, expected, expected)


positive_int = at_least(1)
count = at_least(0)


def seed(text: str) -> int:
    """An integer seed in [0, MAX_SEED]."""
    expected = f"an integer seed in [0, {MAX_SEED}]"
    value = _integer(text, expected)
    if not 0 <= value <= MAX_SEED:
        raise _bad(expected, text)
    return value


def path(text: str) -> Path:
    """A non-empty path (`''` would silently mean the current folder) that the file
    system can hold (`harness.exits.too_long`)."""
    if not text.strip():
        raise _bad("a path", text)
    long = exits.too_long(Path(text))
    if long is not None:
        raise argparse.ArgumentTypeError(f"expected a path the file system can hold; got {long}")
    return Path(text)
