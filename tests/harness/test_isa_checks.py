"""Inductor's vector-ISA checks started early (`harness.isa_checks`): each test runs them in
a fresh interpreter, since inductor keeps their answers for the life of a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_CHECK = """
import json
from harness.isa_checks import IsaChecks
checks = IsaChecks()
print(json.dumps({"error": checks.wait(), "isas": checks.isas}))
"""

_INDUCTOR_ALONE = """
import json
from torch._inductor.cpu_vec_isa import valid_vec_isa_list
print(json.dumps([str(isa) for isa in valid_vec_isa_list()]))
"""


def _python(code: str, cache: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)},
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _built(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*.so")}


@pytest.mark.slow
def test_the_checks_build_into_the_cache_what_a_later_process_only_loads(tmp_path):
    """Run early in one process, the checks build their libraries into an empty inductor
    cache and find the ISAs inductor itself finds; a later process (a compiling warm-up
    process) finds the same ISAs and builds nothing: the seconds of building were paid
    once, where the run started them."""
    cache = tmp_path / "inductor"
    early = json.loads(_python(_CHECK, cache))
    assert early["error"] is None
    built = _built(cache)
    if early["isas"]:  # a CPU with a vector ISA inductor knows: each was built and loaded
        assert built
    assert json.loads(_python(_INDUCTOR_ALONE, cache)) == early["isas"]
    assert _built(cache) == built  # nothing built again, nothing rewritten


def test_checks_that_fail_say_why_instead_of_stopping_the_run(tmp_path):
    """A cache folder that cannot be made (a file stands where it would go): `wait`
    returns the error, which the run prints; the compiling processes then meet it
    themselves."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    said = json.loads(_python(_CHECK, blocked / "inductor"))
    if not said["isas"] and said["error"] is None:
        pytest.skip("this CPU has no vector ISA inductor checks: nothing is built")
    assert said["isas"] == [] and said["error"] is not None
    assert "a-file" in said["error"]


@pytest.mark.slow
def test_the_isas_are_built_at_once(tmp_path):
    """Each ISA's check library is built in a thread of its own: the builds' spans (its
    source written, its library linked: the files' times) overlap, where the CPU has two
    or more ISAs inductor checks. One after another they took 8 s on the 2-core machine
    this project is developed on, at once 4.5 s."""
    cache = tmp_path / "inductor"
    said = json.loads(_python(_CHECK, cache))
    assert said["error"] is None
    spans = []
    for library in cache.rglob("*.so"):
        sources = list(library.parent.glob("*.cpp"))
        assert len(sources) == 1, sorted(p.name for p in library.parent.iterdir())
        spans.append((sources[0].stat().st_mtime_ns, library.stat().st_mtime_ns))
    if len(said["isas"]) < 2:
        pytest.skip(f"this CPU has {len(said['isas'])} vector ISA inductor checks: nothing "
                    "to build at once")
    spans.sort()
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), spans
