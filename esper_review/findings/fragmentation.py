"""What the CUDA caching allocator holds but does not use after many calls of a variant:
the measure of the "memory fragmentation" the reviews name (B4-DRL-03, H1), as a
finding's `extra_metrics` on CUDA."""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch


def fragmentation(call: Callable[[], object], device: torch.device, calls: int,
                  allocator: ModuleType = torch.cuda) -> dict[str, float]:
    """`calls` calls of `call` on CUDA `device` from an emptied cache; bytes.

    The allocator's counters are the whole process's on that device, so they hold
    whatever the process kept alive before (other variants' inputs, cuBLAS workspaces,
    compiled kernels' buffers): on the first GPU run all three H1 variants read the same
    2.5 GB reserved to the byte. What the calls themselves did is the difference:
    `reserved_growth_bytes` (memory the allocator had to reserve for them) and
    `live_growth_bytes` (memory they left in use: a pool's envs, or a leak).
    `reserved_minus_allocated_bytes` is the process's cached-but-unused memory after the
    calls (fragmentation and slack, whoever caused it).
    `allocator` is `torch.cuda` (a stand-in in tests on machines without CUDA).
    """
    allocator.synchronize(device)
    allocator.empty_cache()
    reserved_before = allocator.memory_reserved(device)
    live_before = allocator.memory_allocated(device)
    for _ in range(calls):
        call()
    allocator.synchronize(device)
    reserved = allocator.memory_reserved(device)
    live = allocator.memory_allocated(device)
    return {"reserved_growth_bytes": float(reserved - reserved_before),
            "live_growth_bytes": float(live - live_before),
            "reserved_minus_allocated_bytes": float(reserved - live)}
