"""A memory-bandwidth floor: how fast could a call be if it only moved its bytes?

A finding declares the bytes a call must read and write at least (`Recording.min_bytes`);
a floor is those bytes over the speed of memory that holds them. A few megabytes sit in a cache,
whose speed is several times that of DRAM, so a floor taken at DRAM speed is no floor for
them (a call can beat it). `working_set_bandwidth` therefore measures streaming copies
over a working set of the call's own size, with a compiled loop so that no per-copy
dispatch is in the timing, and names the memory level that holds it (`memory_level`:
L1d, L2, L3 or DRAM from the CPU's cache sizes). `measure_copy_bandwidth` times a large
tensor copy (DRAM) for the run's metadata. `bound_label` says whether the best method is
near its floor (`bandwidth-bound`) or far above it, where per-call overhead (Python,
dispatch, kernel launches) dominates (`launch-bound`).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import torch

#: Default copy size: far larger than any CPU's last-level cache, so memory is timed.
COPY_BYTES = 256 * 1024 * 1024
#: A cell is bandwidth-bound when its best method is within this factor of the floor.
BANDWIDTH_BOUND_FACTOR = 3.0
BANDWIDTH_BOUND = "bandwidth-bound"
LAUNCH_BOUND = "launch-bound"


def measure_copy_bandwidth(device: torch.device | str, nbytes: int = COPY_BYTES,
                           repeats: int = 5) -> float:
    """Bytes per second of `dst.copy_(src)` for `nbytes`-byte tensors on `device`,
    counting the read and the write (2 * nbytes per copy); the best of `repeats` copies
    after one warm-up copy. CUDA events time it on a GPU, `time.perf_counter` on the
    CPU (with torch's current thread count)."""
    device = torch.device(device)
    if nbytes < 1 or repeats < 1:
        raise ValueError(f"measure_copy_bandwidth: expected nbytes >= 1 and repeats >= 1; "
                         f"got nbytes={nbytes}, repeats={repeats}")
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page faults and lazy init stay out of the timing
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream(device)
            start.record(stream)
            dst.copy_(src)
            end.record(stream)
            end.synchronize()  # host sync: elapsed_time needs the end event completed
            seconds = start.elapsed_time(end) * 1e-3
        else:
            started = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - started
        best = min(best, seconds)
    return 2 * nbytes / best


#: where the CPU's caches are described (Linux)
CACHE_INFO = Path("/sys/devices/system/cpu/cpu0/cache")
#: bytes a working-set measurement moves at least, so that the clock's resolution is negligible
MOVED_BYTES = 64 * 1024 * 1024


def cpu_caches(info: Path = CACHE_INFO) -> list[tuple[str, int]]:
    """(name, bytes) of the CPU's data and unified caches, smallest first (`L1d`, `L2`,
    `L3`); empty where the system does not say."""
    caches = []
    for index in sorted(info.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction" or not size[:-1].isdigit():
            continue
        scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
        caches.append((f"L{level}" + ("d" if kind == "Data" else ""), int(size[:-1]) * scale))
    return sorted(caches, key=lambda cache: cache[1])


def memory_level(nbytes: int, caches: list[tuple[str, int]] | None = None) -> str:
    """The smallest cache that holds a working set of `nbytes`, or `DRAM`."""
    for name, size in cpu_caches() if caches is None else caches:
        if nbytes <= size:
            return name
    return "DRAM"


@functools.lru_cache(maxsize=1)
def _copy_loop():
    """A compiled loop of `repeats` copies of `src` into `dst` (numba, compiled once)."""
    import numba  # late: numba's import and JIT only for a run that measures a floor

    @numba.njit(cache=True)
    def copy(src, dst, repeats):  # pragma: no cover (runs compiled)
        for _ in range(repeats):
            for i in range(src.size):
                dst[i] = src[i]
        return dst[0]

    return copy


@functools.lru_cache(maxsize=256)
def working_set_bandwidth(device_type: str, nbytes: int) -> tuple[float, str]:
    """(bytes per second, memory level) of streaming copies over a working set of
    `nbytes` bytes (a source and a destination of `nbytes / 2` each, read and write both
    counted): the speed a call of that size could move its bytes at, the floor's speed.
    On the CPU a compiled copy loop, best of 5, each moving at least MOVED_BYTES; on CUDA
    the large-copy bandwidth (no per-size floor is measured there)."""
    if nbytes < 2:
        raise ValueError(f"working_set_bandwidth: nbytes: expected at least 2; got {nbytes}")
    if device_type != "cpu":
        return measure_copy_bandwidth(device_type), "device memory"
    half = nbytes // 2
    src = np.ones(half, dtype=np.uint8)
    dst = np.empty_like(src)
    copy = _copy_loop()
    repeats = max(1, MOVED_BYTES // (2 * half))
    copy(src, dst, 1)  # compile (or load) and touch the pages
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        copy(src, dst, repeats)
        best = min(best, time.perf_counter() - started)
    return 2 * half * repeats / best, memory_level(nbytes)


def bound_label(best_seconds: float, floor_seconds: float,
                factor: float = BANDWIDTH_BOUND_FACTOR) -> str:
    """`bandwidth-bound` when the best method's time per call is within `factor` of the
    bandwidth floor (best_seconds <= factor * floor_seconds), else `launch-bound`:
    the call spends most of its time on per-call overhead, not on moving bytes."""
    return BANDWIDTH_BOUND if best_seconds <= factor * floor_seconds else LAUNCH_BOUND
