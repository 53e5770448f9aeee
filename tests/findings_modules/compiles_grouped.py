"""COMPILES-grouped: `compiling`'s finding with each variant a compile group of its own
(`Recording.compile_groups`): the warm step prepares each in a process of its own, at once."""

from __future__ import annotations

from harness.findings import register
from tests.findings_modules.compiling import compiling_finding

register(compiling_finding("COMPILES-grouped", compile_groups=(("sum",), ("cumsum",))))
