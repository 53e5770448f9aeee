"""Whether this machine's disk caches hold the compiled GAE methods yet.

`compiled` (torch.compile) and `numba_kernel` compile on their first call in a process
and write what they built to disk caches that later processes load: numba's kernels in
0.3 s instead of 6-9 s, torch.compile's graph in 3-7 s instead of 15-80 s (it still
traces) on the 2-core CPU of `esper.gae.crossovers`. `caches_cold()` says whether those
caches are still empty here, as on a fresh machine or CI container, whose first process
pays the compiles. Neither module is compiled or run to find out.
"""

from __future__ import annotations

import glob
import os

__all__ = ["caches_cold", "inductor_cache_cold", "numba_cache_cold"]


def numba_cache_cold() -> bool:
    """Whether numba's cache holds no index of the serial kernel (`_serial_at`, what every
    small call runs); False where numba is not installed (nothing to compile)."""
    try:
        from esper.gae import numba_kernel
    except ImportError:
        return False
    # where numba keeps this module's cache: NUMBA_CACHE_DIR's, or __pycache__ beside it
    folder = numba_kernel._serial_at._cache._cache_path
    return not glob.glob(os.path.join(glob.escape(folder), "numba_kernel._serial_at-*.nbi"))


def inductor_cache_cold() -> bool:
    """Whether inductor's FX graph cache (TORCHINDUCTOR_CACHE_DIR's, else its default
    folder) holds no graph at all. A graph of another program counts as warm: then only
    the first call of `compiled` compiles, as without this check."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # torch's compiler: 1 s

    folder = os.path.join(cache_dir(), "fxgraph")
    if not os.path.isdir(folder):
        return True
    with os.scandir(folder) as entries:
        return not any(entries)


def caches_cold() -> bool:
    """Whether the first call of `numba_kernel` or `compiled` would compile here."""
    return numba_cache_cold() or inductor_cache_cold()
