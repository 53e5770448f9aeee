"""Counts that do not depend on noise: op calls, host syncs, allocations, kernel launches.

One profiled call of a function under `torch.profiler` with memory profiling. The counts
are deterministic for a given input and code path, which makes them usable by the CI gate
as exact checks where timings cannot be.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

#: ops that copy a device value to the host and block on it (`.item()`, `bool(t)`, ...).
HOST_SYNC_OPS = ("aten::_local_scalar_dense",)
#: CUDA runtime calls that block the host until the device catches up.
CUDA_SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
)
KERNEL_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


@dataclass(frozen=True)
class Counters:
    """What one call did, counted by the profiler.

    `host_syncs` counts blocking CUDA runtime calls on CUDA; on the CPU, where nothing
    blocks, it counts the value reads (`aten::_local_scalar_dense`, behind `.item()`,
    `bool(t)`, `float(t)`) that would block on a device. `kernel_launches` is None on CPU.
    Allocation counts come from the caching allocator on CUDA and the CPU allocator on
    CPU, so they are comparable within one device only.
    """

    op_calls: int
    host_syncs: int
    allocations: int
    allocated_bytes: int
    kernel_launches: int | None
    ops: dict[str, int] = field(default_factory=dict, compare=False)

    def as_row(self) -> dict[str, int | None]:
        """The scalar counters, for a results row."""
        return {
            "op_calls": self.op_calls,
            "host_syncs": self.host_syncs,
            "allocations": self.allocations,
            "allocated_bytes": self.allocated_bytes,
            "kernel_launches": self.kernel_launches,
        }


def count_events(prof: profile, on_cuda: bool) -> Counters:
    """Counters from a finished profiler run (its raw Kineto events)."""
    names: collections.Counter[str] = collections.Counter()
    allocations = allocated_bytes = 0
    for event in prof.profiler.kineto_results.events():
        name = event.name()
        if name == "[memory]":
            if event.nbytes() > 0:  # frees are recorded as negative sizes
                allocations += 1
                allocated_bytes += event.nbytes()
            continue
        names[name] += 1
    ops = {n: c for n, c in names.items() if n.startswith("aten::")}
    if on_cuda:
        # every blocking runtime call, less the one that closes the profiled window
        syncs = sum(names[n] for n in CUDA_SYNC_CALLS) - 1
    else:
        # no device to wait for: count the value reads that would block on one
        syncs = sum(names[n] for n in HOST_SYNC_OPS)
    launches = sum(names[n] for n in KERNEL_LAUNCH_CALLS) if on_cuda else None
    return Counters(
        op_calls=sum(ops.values()),
        host_syncs=syncs,
        allocations=allocations,
        allocated_bytes=allocated_bytes,
        kernel_launches=launches,
        ops=ops,
    )


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: Kineto prints a line at every profiler start
    and stop from C++, which Python's sys.stderr cannot catch and which breaks progress bars."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def profiling(device: torch.device | str = "cpu", **kwargs) -> Iterator[profile]:
    """`torch.profiler.profile` with CPU (+ CUDA on a CUDA device) activities, quietly.

    Only the profiler's start and stop are silenced, not the profiled code.
    """
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, **kwargs)
    with _native_stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)


def profile_call(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    trace_path: str | None = None,
) -> Counters:
    """Run `fn` once under torch.profiler (memory profiling on) and count what it did.

    `trace_path`, when given, receives a Chrome trace (open it in Perfetto).
    """
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.synchronize()  # keep earlier work out of the profiled window
    with profiling(device, profile_memory=True) as prof:
        fn()
        if on_cuda:
            torch.cuda.synchronize()  # the window ends when the device is done
    if trace_path is not None:
        prof.export_chrome_trace(trace_path)
    return count_events(prof, on_cuda)
