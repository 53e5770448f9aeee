"""Inductor's vector-ISA build checks, run early in threads of the run's own process.

A process's first CPU compile by torch.compile (inductor) checks each vector ISA the CPU
claims (AVX-512 with VNNI, AVX-512, AVX2, ...) by building a small C++ library with that
ISA's flags and loading it, one build after another: six builds, 6-9 s of one core on an
AMD EPYC with AVX-512; ten, about 12 s, on an Intel Xeon that adds AMX; in the middle of
the compile. It keeps each library in its disk cache (TORCHINDUCTOR_CACHE_DIR), so a
later process only loads them.

A run whose compile caches are cold starts these checks (`IsaChecks`) as its warm-up
processes start, one thread per ISA, so that the builds of different ISAs run at once
(4.5 s instead of 8 s of wall time on that machine, idle) and overlap those processes'
imports and tracing instead of following them; the warm-up process that compiles finds
the libraries built (inductor's own file lock makes it wait for one still being built).
In a run whose findings never call torch.compile they cost those seconds, once per cache.
"""

from __future__ import annotations

import platform
import threading

__all__ = ["IsaChecks"]


def _candidates() -> list:
    """The ISAs `valid_vec_isa_list` builds a check for on this CPU: on x86, those whose
    flags the CPU reports; elsewhere none (it checks those itself, without building)."""
    from torch._inductor import cpu_vec_isa

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = cpu_vec_isa.x86_isa_checker()
    return [isa for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())]


class IsaChecks:
    """Inductor's vector-ISA checks (`torch._inductor.cpu_vec_isa.valid_vec_isa_list`),
    started on creation in daemon threads (an interrupted run does not wait for them), one
    per ISA; `wait()` for them before anything is timed."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.isas: list[str] = []
        self._thread = threading.Thread(target=self._check, name="inductor-isa-checks",
                                        daemon=True)
        self._thread.start()

    def _check(self) -> None:
        try:
            from torch._inductor.cpu_vec_isa import valid_vec_isa_list

            # each ISA's answer is cached on its object: the list below then builds nothing
            builds = [threading.Thread(target=self._build, args=(isa,), daemon=True,
                                       name=f"inductor-isa-check-{isa}")
                      for isa in _candidates()]
            for build in builds:
                build.start()
            for build in builds:
                build.join()
            if self.error is None:
                self.isas = [str(isa) for isa in valid_vec_isa_list()]
        except Exception as err:  # said by `wait`: the compiling processes check themselves
            self.error = f"{type(err).__name__}: {err}"

    def _build(self, isa) -> None:
        """Build and load one ISA's check (`bool(isa)` does, once per process)."""
        try:
            bool(isa)
        except Exception as err:  # said by `wait`, as a failure of the list
            self.error = f"{type(err).__name__}: {err}"

    def wait(self) -> str | None:
        """Block until the checks have ended; None, or why they failed (the processes
        that compile then run them themselves, as without this)."""
        self._thread.join()
        return self.error
