"""The fragmentation measure's arithmetic, over a stand-in for `torch.cuda`'s allocator
counters: a process that already holds memory before the calls, as the first GPU run's
did. What CUDA's caching allocator reports for a real variant only a GPU run tells
(docs/gpu.md); this proves which differences the measure takes."""

from __future__ import annotations

import torch

from esper_review.findings.fragmentation import fragmentation


class Allocator:
    """Counters of one device: `reserved` and `allocated` bytes; emptying the cache gives
    back what is reserved but not in use, except `stuck` bytes (split blocks that hold a
    live allocation, which no empty_cache returns)."""

    def __init__(self, reserved: int, allocated: int, stuck: int):
        self.reserved, self.allocated, self.stuck = reserved, allocated, stuck
        self.log: list[str] = []

    def synchronize(self, device):
        self.log.append("synchronize")

    def empty_cache(self):
        self.log.append("empty_cache")
        self.reserved = self.allocated + self.stuck

    def memory_reserved(self, device):
        return self.reserved

    def memory_allocated(self, device):
        return self.allocated


def test_the_growth_is_the_calls_own_and_the_slack_is_the_process_s():
    # the process holds 2 GB live and 200 MB of slack no empty_cache returns
    allocator = Allocator(reserved=3_000, allocated=2_000, stuck=200)

    def call():  # keeps 10 bytes alive a call, and needs 50 more reserved per call
        allocator.allocated += 10
        allocator.reserved += 50

    out = fragmentation(call, torch.device("cuda"), 4, allocator=allocator)
    assert out == {"reserved_growth_bytes": 200.0, "live_growth_bytes": 40.0,
                   "reserved_minus_allocated_bytes": (2_200 + 200) - 2_040.0}
    # the cache is emptied after the device is idle, and read after it is idle again
    assert allocator.log == ["synchronize", "empty_cache", "synchronize"]


def test_calls_that_fit_in_what_is_reserved_grow_nothing():
    allocator = Allocator(reserved=3_000, allocated=2_000, stuck=500)
    out = fragmentation(lambda: None, torch.device("cuda"), 20, allocator=allocator)
    assert out["reserved_growth_bytes"] == 0.0 and out["live_growth_bytes"] == 0.0
    assert out["reserved_minus_allocated_bytes"] == 500.0
