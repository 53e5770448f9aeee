"""esper-bench's harness: measure performance claims, report them, gate on them in CI.

The public API, for declaring findings of your own (see `harness.findings`)::

    from harness import Case, Finding, max_abs_difference, register
    from harness import max_relative_error, rounding_tolerance  # tolerances from the math
    from harness import Defaults, PlantTarget, set_defaults  # optional: the commands' defaults

A module of yours that calls `register` is measured by
`python -m harness.run --findings-module PKG.MODULE` (or with the module named in your
`pyproject.toml`, `[tool.esper-bench] findings-modules = ["PKG.MODULE"]`), reported by
`python -m harness.report` and gated by `python -m harness.gate`.
"""

from __future__ import annotations

import importlib
from typing import Any

#: the public names: frozen by tests/harness/test_public_api.py
__all__ = ["About", "Case", "Defaults", "Finding", "PlantTarget", "Reading", "Recording",
           "max_abs_difference",
           "max_relative_error", "register", "rounding_tolerance", "set_defaults",
           "unit_roundoff"]


def __getattr__(name: str) -> Any:
    # imported on first use, so that `import harness.exits` (every command's start,
    # `--version`) does not load torch
    if name in __all__:
        return getattr(importlib.import_module("harness.findings"), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
