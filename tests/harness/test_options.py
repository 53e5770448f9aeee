"""harness.options: the typed parsers every command's options go through."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given, strategies as st

from harness import options
from harness.exits import UsageError


@pytest.mark.parametrize(("parse", "good", "bad"), [
    (options.seconds, {"1.5": 1.5, "1e-3": 1e-3}, ["0", "-1", "inf", "nan", "", "abc", "1s"]),
    (options.fraction, {"0.05": 0.05, "0.999": 0.999}, ["0", "1", "-0.1", "nan", "inf", "5"]),
    (options.fraction_or_zero, {"0": 0.0, "0.03": 0.03}, ["1", "-0.01", "nan", "1e9"]),
    (options.factor, {"1.05": 1.05, "4": 4.0}, ["1", "0.9", "inf", "nan", "-2"]),
    (options.positive_int, {"1": 1, "16": 16, " 3 ": 3},
     ["0", "-3", "1.5", "", "1e3", "\u0661", "1_000"]),
    (options.count, {"0": 0, "7": 7, " 7\n": 7}, ["-1", "x", "0\x1f", "\x1c1"]),
    (options.integer_from(1, 8), {"1": 1, "8": 8}, ["0", "9", "-1", "2.0", "\u0661"]),
    (options.seed, {"0": 0, str(2**32 - 1): 2**32 - 1}, ["-1", str(2**32), "1e23", "0x10"]),
])
def test_each_parser_takes_what_it_names_and_refuses_the_rest(parse, good, bad):
    for text, value in good.items():
        assert parse(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError) as info:
            parse(text)
        assert str(info.value).startswith("expected ") and f"got {text!r}" in str(info.value)


@given(st.text(max_size=12))
def test_no_text_makes_a_parser_raise_anything_but_its_own_error(text):
    for parse in (options.seconds, options.fraction, options.fraction_or_zero, options.factor,
                  options.positive_int, options.count, options.seed,
                  options.integer_from(1, 8)):
        try:
            value = parse(text)
        except argparse.ArgumentTypeError:
            continue
        assert not (isinstance(value, float) and not math.isfinite(value))


def test_a_parser_error_is_a_usage_error_naming_the_option():
    parser = options.Parser(prog="python -m something")
    parser.add_argument("--budget", type=options.seconds)
    with pytest.raises(UsageError, match=r"argument --budget: expected finite seconds > 0, "
                                         r"e.g. 1.5; got 'inf' \(see python -m something --help\)"):
        parser.parse_args(["--budget", "inf"])
    with pytest.raises(UsageError, match="unrecognized arguments: --nope"):
        parser.parse_args(["--nope"])


def test_an_empty_path_is_refused():
    assert str(options.path("results")) == "results"
    with pytest.raises(argparse.ArgumentTypeError, match="expected a path; got '  '"):
        options.path("  ")
