"""A user's findings module that cannot be imported: its one declaration names a baseline
that is not among its variants (the import raises, and nothing is registered)."""

from __future__ import annotations

from harness import Case, Finding, register

register(Finding(
    id="USER-broken",
    title="a declaration with a wrong baseline",
    claim="never measured",
    variants=("a", "b"),
    baseline="c",
    cases=[Case.of(n=1)],
    build=lambda case, device, seed: None,
    make_call=lambda variant, inputs: lambda: None,
))
