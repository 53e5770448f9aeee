"""Inductor's vector-ISA build checks: only down to the ISA it picks, run early in a
thread of the run's own process.

A process's first CPU compile by torch.compile (inductor) picks the vector ISA its kernels
use (`pick_vec_isa`: the best the CPU claims, or the one ATEN_CPU_CAPABILITY names) from
`valid_vec_isa_list`, which checks every ISA the CPU claims (AMX, AVX-512 with VNNI,
AVX-512, AVX2) by building small C++ libraries with that ISA's flags and loading them,
one build after another, in the middle of the compile: ten builds on an Intel Xeon with
AMX (19 s of one core; 9.4 s of wall time on two cores built at once), though only the
picked ISA's decide anything. `check_isas_lazily` makes that list lazy in this process:
an ISA is checked only when a reader reaches it, so the pick builds the checks of the
ISAs above it and its own (four builds, 3.8 s of one core, on that Xeon), and answers
as before. Inductor keeps each library in its disk cache (TORCHINDUCTOR_CACHE_DIR), so a
later process only loads them.

A run whose compile caches are cold starts the checks (`IsaChecks`) as its warm-up
processes start, so that they overlap those processes' imports and tracing instead of
following them; the warm-up process that compiles finds the libraries built (inductor's
own file lock makes it wait for one still being built). In a run whose findings never
call torch.compile they cost those seconds, once per cache.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import math
import platform
import sys
import threading
from collections.abc import Iterator, Sequence

__all__ = ["IsaChecks", "check_isas_lazily"]


def _candidates() -> list:
    """The ISAs `valid_vec_isa_list` checks on this x86 CPU (`check_isas_lazily` installs
    the lazy list nowhere else), best first: those whose flags the CPU reports."""
    from torch._inductor import cpu_vec_isa

    flags = cpu_vec_isa.x86_isa_checker()
    return [isa for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())]


class ValidIsas(Sequence):
    """Inductor's `valid_vec_isa_list()`, checked as it is read: `candidates` (best first)
    are checked (`bool(isa)`: built and loaded, once per process) one at a time, only as
    far as a reader looks. `pick_vec_isa` asks whether the list is empty and takes its
    first (under ATEN_CPU_CAPABILITY, the first it names), so the ISAs below the pick are
    never built. Thread-safe: one check at a time."""

    def __init__(self, candidates: Sequence) -> None:
        self._unchecked = list(candidates)
        self._valid: list = []
        self._lock = threading.Lock()

    def _check_until(self, count: float) -> None:
        with self._lock:
            while len(self._valid) < count and self._unchecked:
                isa = self._unchecked[0]
                valid = bool(isa)  # a check that raises is tried again by the next reader
                self._unchecked.pop(0)
                if valid:
                    self._valid.append(isa)

    def __getitem__(self, index):
        self._check_until(index + 1 if isinstance(index, int) and index >= 0 else math.inf)
        return self._valid[index]

    def __len__(self) -> int:
        self._check_until(math.inf)
        return len(self._valid)

    def __bool__(self) -> bool:
        self._check_until(1)
        return bool(self._valid)

    def __iter__(self) -> Iterator:
        index = 0
        while True:
            self._check_until(index + 1)
            if index >= len(self._valid):
                return
            yield self._valid[index]
            index += 1

    def checked(self) -> list[str]:
        """The ISAs found valid so far, best first (what was built), without checking more."""
        with self._lock:
            return [str(isa) for isa in self._valid]


_MODULE = "torch._inductor.cpu_vec_isa"
_installing = threading.Lock()


def _make_lazy(cpu_vec_isa) -> None:
    """Replace the module's `valid_vec_isa_list` by a cached function returning a
    `ValidIsas`, where the module has what this replaces (else it stays as it is)."""
    with _installing:
        current = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
        if getattr(current, "lazy", False) or not all(
                hasattr(cpu_vec_isa, name) for name in ("valid_vec_isa_list", "pick_vec_isa",
                                                        "supported_vec_isa_list", "x86_isa_checker")):
            return

        @functools.cache
        def valid_vec_isa_list() -> ValidIsas:
            return ValidIsas(_candidates())

        valid_vec_isa_list.lazy = True
        cpu_vec_isa.valid_vec_isa_list = valid_vec_isa_list


class _OnImport(importlib.abc.MetaPathFinder):
    """Makes inductor's list lazy as its module is imported (by the first compile), so that
    a process that never compiles never imports inductor for it (2.4 s)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            _make_lazy(module)

        spec.loader.exec_module = exec_module
        return spec


def check_isas_lazily() -> None:
    """In this process, make inductor's `valid_vec_isa_list` return a `ValidIsas` (from a
    cached function, as inductor's own is, with its `cache_clear`), so that its pick builds
    no check below the ISA it picks: now if inductor is imported, else as it is imported.
    Where inductor lacks what this replaces (another torch version) or builds no checks
    (not x86 Linux or Windows), its own list stays."""
    if sys.platform not in ("linux", "win32") or platform.machine() not in ("x86_64", "AMD64"):
        return
    module = sys.modules.get(_MODULE)
    if module is not None:
        _make_lazy(module)
    elif not any(isinstance(finder, _OnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OnImport())


class IsaChecks:
    """Inductor's vector-ISA checks down to its pick (`check_isas_lazily`), started on
    creation in a daemon thread (an interrupted run does not wait for it); `wait()` for
    them before anything is timed."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.picked: str | None = None
        """The ISA inductor compiles for (None: none, or not checked)."""
        self._thread = threading.Thread(target=self._check, name="inductor-isa-checks",
                                        daemon=True)
        self._thread.start()

    def _check(self) -> None:
        try:
            check_isas_lazily()
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            picked = pick_vec_isa()  # builds what the compiles' own pick would
            self.picked = str(picked) if picked else None
        except Exception as err:  # said by `wait`: the compiling processes check themselves
            self.error = f"{type(err).__name__}: {err}"

    def wait(self) -> str | None:
        """Block until the checks have ended; None, or why they failed (the processes
        that compile then run them themselves, as without this)."""
        self._thread.join()
        return self.error
