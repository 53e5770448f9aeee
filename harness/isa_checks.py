"""Inductor's vector-ISA build checks, run early in a thread of the run's own process.

A process's first CPU compile by torch.compile (inductor) checks each vector ISA the CPU
claims (AVX-512 with VNNI, AVX-512, AVX2, ...) by building a small C++ library with that
ISA's flags and loading it, one build after another: six builds, 6-9 s of one core on the
2-core machine this project is developed on, in the middle of the compile. It keeps each
library in its disk cache (TORCHINDUCTOR_CACHE_DIR), so a later process only loads them.

A run whose compile caches are cold starts these checks (`IsaChecks`) as its warm-up
processes start: the builds then overlap those processes' imports and tracing instead of
following them, and the warm-up process that compiles finds the libraries built
(inductor's own file lock makes it wait for one still being built). In a run whose
findings never call torch.compile they cost those seconds of one core, once per cache.
"""

from __future__ import annotations

import threading

__all__ = ["IsaChecks"]


class IsaChecks:
    """Inductor's vector-ISA checks (`torch._inductor.cpu_vec_isa.valid_vec_isa_list`),
    started in a daemon thread on creation; `wait()` for them before anything is timed."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.isas: list[str] = []
        self._thread = threading.Thread(target=self._check, name="inductor-isa-checks",
                                        daemon=True)  # an interrupted run does not wait
        self._thread.start()

    def _check(self) -> None:
        try:
            from torch._inductor.cpu_vec_isa import valid_vec_isa_list

            self.isas = [str(isa) for isa in valid_vec_isa_list()]
        except Exception as err:  # said by `wait`: the compiling processes check themselves
            self.error = f"{type(err).__name__}: {err}"

    def wait(self) -> str | None:
        """Block until the checks have ended; None, or why they failed (the processes
        that compile then run them themselves, as without this)."""
        self._thread.join()
        return self.error
