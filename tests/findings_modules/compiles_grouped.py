"""COMPILES-grouped: `compiles`'s finding with each variant a compile group of its own
(`Recording.compile_groups`): the warm step prepares each in a process of its own, at once."""

from __future__ import annotations

import dataclasses

from harness.findings import register
from tests.findings_modules.compiles import FINDING

register(dataclasses.replace(
    FINDING, id="COMPILES-grouped",
    recording=dataclasses.replace(FINDING.recording, compile_groups=(("sum",), ("cumsum",)))))
