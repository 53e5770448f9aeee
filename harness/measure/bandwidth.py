"""A memory-bandwidth floor for GAE: how fast could a call be if it only moved its bytes?

`measure_copy_bandwidth` times a large tensor copy on the run's device (the speed of
memory a streaming kernel can reach there); `gae_min_bytes` counts the bytes a GAE call
must read and write at least. Their quotient is the floor time of a call; `bound_label`
says whether the best method is near that floor (`bandwidth-bound`) or far above it,
where per-call overhead (Python, dispatch, kernel launches) dominates (`launch-bound`).
"""

from __future__ import annotations

import time

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


def gae_min_bytes(num_envs: int, max_steps: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes one GAE call over [num_envs, max_steps] must move at least.

    Reads rewards, values and bootstrap_values (floats of `dtype`), dones and truncated
    (1-byte bools) and step_counts (int64 [num_envs]); writes advantages and returns
    (floats of `dtype`).
    """
    elements = num_envs * max_steps
    float_bytes = torch.empty((), dtype=dtype).element_size()
    return (3 + 2) * elements * float_bytes + 2 * elements + 8 * num_envs


def bound_label(best_seconds: float, floor_seconds: float,
                factor: float = BANDWIDTH_BOUND_FACTOR) -> str:
    """`bandwidth-bound` when the best method's time per call is within `factor` of the
    bandwidth floor (best_seconds <= factor * floor_seconds), else `launch-bound`:
    the call spends most of its time on per-call overhead, not on moving bytes."""
    return BANDWIDTH_BOUND if best_seconds <= factor * floor_seconds else LAUNCH_BOUND
