"""Variants: presets, parsing and the errors that list the valid choices."""

import dataclasses
import subprocess
import sys

import pytest

from esper.variants import Variants


def test_variants_parse_and_errors():
    v = Variants.parse("gae=scan,reset=mask")
    assert v == dataclasses.replace(Variants.original(), gae="scan", reset="mask")
    assert Variants.parse(Variants.optimized().spec()) == Variants.optimized()
    assert Variants.parse("optimized,gae=batched").gae == "batched"
    with pytest.raises(ValueError, match="valid axes: reset, step_counts, gae, sync"):
        Variants.parse("gea=scan")
    with pytest.raises(ValueError, match="loop, batched, scan"):
        Variants.parse("gae=fast")
    with pytest.raises(ValueError, match="axis=value"):
        Variants.parse("scan")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Variants().gae = "scan"  # type: ignore[misc]


def test_optional_gae_methods_parse_without_importing_gae_first():
    """`gae=auto` is registered by esper.gae; Variants imports it when it meets an unknown
    method, so a fresh process can parse it straight away."""
    code = ("from esper.variants import Variants; "
            "print(Variants.parse('gae=auto').gae)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "auto"
