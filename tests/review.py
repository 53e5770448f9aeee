"""The review of esper, the findings module this repository's pyproject.toml names, loaded
into the registry as `harness.run` loads it, for tests that use its findings directly."""

from __future__ import annotations

from harness import findings as registry

MODULE = "esper_review"


def review_findings() -> list[str]:
    """Import the review's findings module (once per process); the ids it registered."""
    registry.load_findings_module(MODULE)
    return registry.from_modules([MODULE])
