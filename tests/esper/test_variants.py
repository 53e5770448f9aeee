"""Variants: presets, parsing and the errors that list the valid choices."""

import dataclasses
import re
import subprocess
import sys

import pytest

from esper.variants import Variants


def test_variants_parse_and_errors():
    v = Variants.parse("gae=scan,reset=mask")
    assert v == dataclasses.replace(Variants.original(), gae="scan", reset="mask")
    for preset in ("original", "reviews", "ours"):
        assert Variants.parse(getattr(Variants, preset)().spec()) == getattr(Variants, preset)()
        assert Variants.parse(preset) == getattr(Variants, preset)()
    assert Variants.parse("ours,gae=batched").gae == "batched"
    with pytest.raises(ValueError, match="valid axes: reset, step_counts, gae, sync"):
        Variants.parse("gea=scan")
    with pytest.raises(ValueError, match="loop, batched, scan"):
        Variants.parse("gae=fast")
    with pytest.raises(ValueError, match="axis=value"):
        Variants.parse("scan")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Variants().gae = "scan"  # type: ignore[misc]


@pytest.mark.integration  # launches a Python process
def test_optional_gae_methods_parse_without_importing_gae_first():
    """`gae=auto` is registered by esper.gae; Variants imports it when it meets an unknown
    method, so a fresh process can parse it straight away."""
    code = ("from esper.variants import Variants; "
            "print(Variants.parse('gae=auto').gae)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "auto"


@pytest.mark.parametrize("spec", ["gae=scan,original", "original,gae=scan", " gae = scan , original "])
def test_presets_apply_first_then_overrides_whatever_the_order(spec):
    """`gae=scan,original` used to drop gae=scan: the preset replaced what came before."""
    assert Variants.parse(spec) == dataclasses.replace(Variants.original(), gae="scan")


def test_an_override_after_or_before_a_preset_wins():
    want = dataclasses.replace(Variants.ours(), reset="clone")
    assert Variants.parse("reset=clone,ours") == want
    assert Variants.parse("ours,reset=clone") == want


def test_a_preset_replaces_the_base_and_overrides_apply_on_top():
    base = Variants.ours()
    assert Variants.parse("gae=batched", base=base) == dataclasses.replace(base, gae="batched")
    assert Variants.parse("original,sync=event", base=base) == dataclasses.replace(
        Variants.original(), sync="event")


def test_repeating_a_preset_or_an_axis_with_the_same_value_is_allowed():
    assert Variants.parse("ours,ours") == Variants.ours()
    assert Variants.parse("gae=scan,gae=scan").gae == "scan"


def test_two_presets_in_one_spec_are_an_error_naming_both():
    with pytest.raises(ValueError, match="'original'.*'reviews'"):
        Variants.parse("original,gae=scan,reviews")


def test_one_axis_given_two_values_is_an_error_naming_both():
    with pytest.raises(ValueError, match="gae.*'scan'.*'batched'"):
        Variants.parse("gae=scan,reset=mask,gae=batched")


@pytest.mark.parametrize("spec, message", [
    ("gae=", "Variants.gae: expected one of"),
    ("=scan", "unknown axis ''"),
    ("gae=scan=x", "Variants.gae: expected one of"),
])
def test_malformed_pairs_name_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Variants.parse(spec)


@pytest.mark.parametrize("spec", [None, 3, b"gae=scan", ["gae=scan"], Variants()])
def test_a_spec_that_is_not_a_str_is_a_type_error_naming_spec(spec):
    """`Variants.parse(None)` used to end in an AttributeError from `None.split`."""
    with pytest.raises(TypeError) as info:
        Variants.parse(spec)
    message = str(info.value)
    assert message.startswith("Variants.parse: spec: expected a str")
    assert f"got {spec!r} ({type(spec).__name__})" in message


@pytest.mark.parametrize("base", ["original", {"gae": "scan"}, 0])
def test_a_base_that_is_not_variants_is_a_type_error_naming_base(base):
    with pytest.raises(TypeError, match=re.escape(
            f"Variants.parse: base: expected a Variants or None; got {base!r}")):
        Variants.parse("gae=scan", base)


@pytest.mark.parametrize("spec", ["", " ", ",", " , ,"])
def test_an_empty_spec_is_the_base(spec):
    assert Variants.parse(spec) == Variants.original()
    assert Variants.parse(spec, Variants.ours()) == Variants.ours()
