"""COMPILES-first-call: `compiling`'s finding, every variant's first call in one warm-up
process (no compile groups)."""

from __future__ import annotations

from harness.findings import register
from tests.findings_modules.compiling import compiling_finding

register(compiling_finding("COMPILES-first-call"))
