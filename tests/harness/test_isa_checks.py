"""Inductor's vector-ISA checks, only down to its pick and started early
(`harness.isa_checks`): the builds run in fresh interpreters, since inductor keeps their
answers for the life of a process; the lazy list itself is read here, over stand-in ISAs
that count their checks (inductor's own ISAs would build C++ for each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.isa_checks import ValidIsas


class _Isa:
    """A stand-in for one of inductor's ISAs: `bool()` is its check (a build), counted."""

    def __init__(self, name: str, valid: bool, checks: list[str]) -> None:
        self.name, self.valid, self.checks = name, valid, checks

    def __bool__(self) -> bool:
        self.checks.append(self.name)
        return self.valid

    def __str__(self) -> str:
        return self.name


def _isas(checks: list[str]) -> ValidIsas:
    return ValidIsas([_Isa("amx", False, checks), _Isa("avx512", True, checks),
                      _Isa("avx2", True, checks)])


def test_the_list_checks_only_as_far_as_it_is_read():
    checks: list[str] = []
    isas = _isas(checks)
    assert isas and checks == ["amx", "avx512"]  # pick_vec_isa: empty? then the first
    assert str(isas[0]) == "avx512" and checks == ["amx", "avx512"]
    assert isas.checked() == ["avx512"]
    assert next(str(isa) for isa in isas if "avx512" in str(isa)) == "avx512"
    assert checks == ["amx", "avx512"]  # a capability found before the end stops there
    assert [str(isa) for isa in isas] == ["avx512", "avx2"] and len(isas) == 2
    assert str(isas[-1]) == "avx2" and [str(i) for i in isas[:1]] == ["avx512"]
    assert checks == ["amx", "avx512", "avx2"]  # each checked once
    with pytest.raises(IndexError):
        isas[2]
    empty: list[str] = []
    assert not ValidIsas([_Isa("avx2", False, empty)]) and empty == ["avx2"]


class _Failing(_Isa):
    """An ISA whose first check raises (a build that could not start), as inductor's may."""

    def __bool__(self) -> bool:
        if not self.checks:
            self.checks.append("raised")
            raise OSError("no compiler")
        return super().__bool__()


def test_a_check_that_raises_is_said_and_tried_again_by_the_next_reader():
    checks: list[str] = []
    isas = ValidIsas([_Failing("amx", True, checks), _Isa("avx2", True, checks)])
    with pytest.raises(OSError, match="no compiler"):
        bool(isas)
    assert str(isas[0]) == "amx" and checks == ["raised", "amx"]


def test_two_readers_at_once_check_each_isa_once():
    checks: list[str] = []
    isas = _isas(checks)
    readers = [threading.Thread(target=lambda: list(isas)) for _ in range(8)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert sorted(checks) == ["amx", "avx2", "avx512"]


_CHECK = """
import json
from harness.isa_checks import IsaChecks
checks = IsaChecks()
print(json.dumps({"error": checks.wait(), "picked": checks.picked}))
"""

#: inductor's pick under each ATEN_CPU_CAPABILITY named (none: "-"), lazily or not, and
#: how long its list is read whole
_PICKS = """
import json, os, sys
if sys.argv[1] == "lazy":
    from harness.isa_checks import check_isas_lazily
    check_isas_lazily()
from torch._inductor import cpu_vec_isa
picks = {}
for capability in sys.argv[2:]:
    os.environ.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "-":
        os.environ["ATEN_CPU_CAPABILITY"] = capability
    picks[capability] = str(cpu_vec_isa.pick_vec_isa())
print(json.dumps(picks))
"""
CAPABILITIES = ("-", "default", "avx2", "avx512")


def _python(cache: Path, code: str, *args: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _built(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in cache.rglob("*.so")}


@pytest.mark.integration
@pytest.mark.slow
def test_the_checks_build_what_the_pick_needs_once_and_pick_as_inductor_does(tmp_path):
    """Run early in one process, the checks build into an empty inductor cache only the
    libraries of the ISAs down to the one inductor picks; a later process (a compiling
    warm-up process) picks it again and builds nothing; inductor's own list, read whole
    in the same cache, builds the ISAs below it as well, and picks the same ISA under
    every ATEN_CPU_CAPABILITY as the lazy list does."""
    cache = tmp_path / "inductor"
    early = json.loads(_python(cache, _CHECK))
    assert early["error"] is None
    built = _built(cache)
    if early["picked"] is None:
        assert built == {}
        pytest.skip("this CPU has no vector ISA inductor checks: nothing is built")
    assert built  # the pick's checks were built and loaded
    assert json.loads(_python(cache, _PICKS, "lazy", "-")) == {"-": early["picked"]}
    assert _built(cache) == built  # nothing built again, nothing rewritten
    lazy = json.loads(_python(cache, _PICKS, "lazy", *CAPABILITIES))
    alone = json.loads(_python(cache, _PICKS, "inductor", *CAPABILITIES))
    assert alone == lazy
    after = _built(cache)
    assert {k: after[k] for k in built} == built
    if len(set(lazy.values()) - {"INVALID_VEC_ISA"}) >= 2:  # a capability picked one below
        assert len(after) > len(built)  # whose checks the first pick had not built


@pytest.mark.integration
def test_checks_that_fail_say_why_instead_of_stopping_the_run(tmp_path):
    """A cache folder that cannot be made (a file stands where it would go): `wait`
    returns the error, which the run prints; the compiling processes then meet it
    themselves."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    said = json.loads(_python(blocked / "inductor", _CHECK))
    if said["picked"] is None and said["error"] is None:
        pytest.skip("this CPU has no vector ISA inductor checks: nothing is built")
    assert said["picked"] is None and said["error"] is not None
    assert "a-file" in said["error"]
