"""What the CUDA caching allocator holds but does not use after many calls of a variant:
the measure of the "memory fragmentation" the reviews name (B4-DRL-03, H1), as a
finding's `extra_metrics` on CUDA."""

from __future__ import annotations

from typing import Callable

import torch


def fragmentation(call: Callable[[], object], device: torch.device, calls: int) -> dict[str, float]:
    """`calls` calls of `call` from an emptied cache on CUDA `device`, then the allocator's
    reserved and allocated bytes: `reserved_minus_allocated_bytes` is memory cached but
    not in use (fragmentation and slack)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    for _ in range(calls):
        call()
    torch.cuda.synchronize(device)
    reserved = torch.cuda.memory_reserved(device)
    allocated = torch.cuda.memory_allocated(device)
    return {"reserved_bytes": float(reserved), "allocated_bytes_live": float(allocated),
            "reserved_minus_allocated_bytes": float(reserved - allocated)}
