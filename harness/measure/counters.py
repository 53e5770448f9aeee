"""Counts that do not depend on noise: op calls, host syncs, allocations, kernel launches.

One profiled call of a function under `torch.profiler` with memory profiling. The counts
are deterministic for a given input and code path, which makes them usable by the CI gate
as exact checks where timings cannot be.

"Host syncs" is not the same quantity on the two devices:

- on the CPU nothing blocks, so it counts the value reads that *would* block on a device:
  `aten::_local_scalar_dense`, behind `.item()`, `bool(t)`, `float(t)`, `int(t)`;
- on CUDA it counts every call that blocks the host until the device catches up:
  `cudaStreamSynchronize`, `cudaDeviceSynchronize`, `cudaEventSynchronize` (and their
  driver-API forms), and synchronous copies (`cudaMemcpy`). PyTorch's blocking copies
  (`.cpu()`, `.item()`, `.tolist()` of a CUDA tensor, a blocking host-to-device `.to()`)
  are a `cudaMemcpyAsync` closed by a `cudaStreamSynchronize`, so each counts once.
  A `.cpu()` or a blocking upload counts on CUDA but not on the CPU. Not counted: a
  `cudaMemcpyAsync` into pageable host memory with no sync after it
  (`pageable.copy_(cuda_tensor, non_blocking=True)`), which CUDA also completes before
  returning.

A CUDA profile that lacks the events the profiled window must contain (CUPTI missing, or
held by nsys or ncu) raises `IncompleteProfileError` instead of counting zeros.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

import torch
from torch._C._profiler import _EventType
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

#: ops that copy a device value to the host and block on it (`.item()`, `bool(t)`, ...).
HOST_SYNC_OPS = ("aten::_local_scalar_dense",)
#: the call `profile_call` closes its CUDA window with (`torch.cuda.synchronize`): present
#: exactly once in a complete profile, and not counted as a sync of the profiled code.
CLOSING_SYNC = "cudaDeviceSynchronize"
#: CUDA runtime and driver calls that block the host until the device catches up.
CUDA_SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cudaMemcpy",  # the synchronous copy (PyTorch uses cudaMemcpyAsync + a stream sync)
)
#: kernel launches through the runtime API (PyTorch's kernels) and the driver API (Triton's).
KERNEL_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


class IncompleteProfileError(RuntimeError):
    """A CUDA profile lacks events every profiled window has: its counts would be wrong."""


class ProfiledEvent(NamedTuple):
    """One profiler event, as far as the counters read it (a tuple: a profile of one
    training iteration holds hundreds of thousands)."""

    name: str
    """The op, runtime call or kernel name (`aten::add`, `cudaLaunchKernel`, `[memory]`)."""
    nbytes: int = 0
    """For a `[memory]` event: bytes allocated (> 0) or freed (< 0)."""
    on_device: bool = False
    """Whether the event ran on the GPU (a kernel, a copy, a memset), not on the host."""


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off in the body: reading a profile of a training
    iteration makes hundreds of thousands of objects, which would set off a collection
    every few hundred (about half the reading time); they hold no reference cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def kineto_events(prof: profile) -> list[ProfiledEvent]:
    """The raw Kineto events of a finished profiler run."""
    return [
        ProfiledEvent(event.name(), event.nbytes(), event.device_type() != DeviceType.CPU)
        for event in prof.profiler.kineto_results.events()
    ]


class MemoryEvent(NamedTuple):
    """One allocation (`nbytes` > 0) or free (< 0) the profiler saw."""

    nbytes: int
    ptr: int
    """The address: a free is matched with the allocation it undoes."""
    start_ns: int
    on_device: bool = False
    """Whether it is the GPU's memory (not the host's)."""


def memory_events(prof: profile) -> list[MemoryEvent]:
    """The allocations and frees of a finished profiler run (`profile_memory=True`)."""
    out = []
    nodes = list(prof.profiler.kineto_results.experimental_event_tree())
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        if node.typed[0] == _EventType.Allocation:
            fields = node.typed[1]
            out.append(MemoryEvent(fields.alloc_size, fields.ptr, node.start_time_ns,
                                   fields.device.type != "cpu"))
    return out


def peak_live_bytes(events: Iterable[MemoryEvent]) -> int:
    """The most host bytes allocated within the window and alive at once, in time order:
    what the call needed on top of what it found. A free of memory the window did not
    allocate (an earlier call's gradients, say) is not counted, so the peak of a call is
    the same whatever ran before it."""
    live = peak = 0
    mine: dict[int, int] = {}
    for event in sorted((e for e in events if not e.on_device), key=lambda e: e.start_ns):
        if event.nbytes > 0:
            mine[event.ptr] = event.nbytes
            live += event.nbytes
            peak = max(peak, live)
        elif event.ptr in mine:
            live -= mine.pop(event.ptr)
    return peak


@dataclass(frozen=True)
class Counters:
    """What one call did, counted by the profiler.

    `host_syncs` counts blocking CUDA calls on CUDA and value reads on the CPU (see the
    module docstring: the two are different quantities). `kernel_launches` is None on CPU.
    Allocation counts come from the caching allocator on CUDA and the CPU allocator on
    CPU, so they are comparable within one device only.
    """

    op_calls: int
    host_syncs: int
    allocations: int
    allocated_bytes: int
    kernel_launches: int | None
    peak_bytes: int = 0
    """The most bytes the call held allocated at once (`profile_call` fills it): on the
    CPU from the profiler's allocation events (`peak_live_bytes`); on CUDA
    `torch.cuda.max_memory_allocated` of the device, reset before the call, less what was
    allocated before it."""
    ops: dict[str, int] = field(default_factory=dict, compare=False)

    def as_row(self) -> dict[str, int | None]:
        """The scalar counters, for a results row."""
        return {
            "op_calls": self.op_calls,
            "host_syncs": self.host_syncs,
            "allocations": self.allocations,
            "allocated_bytes": self.allocated_bytes,
            "peak_bytes": self.peak_bytes,
            "kernel_launches": self.kernel_launches,
        }


def count_events(
    events: Iterable[ProfiledEvent], on_cuda: bool, profiler_log: str = ""
) -> Counters:
    """Counters from the events of one `profile_call` window.

    On CUDA the window must end with the one `cudaDeviceSynchronize` that `profile_call`
    issues (it is not counted as a sync), and launched kernels must show up on the device;
    otherwise the profile is empty or partial and `IncompleteProfileError` says so, with
    `profiler_log` (what the profiler printed) appended.
    """
    events = list(events)
    names: collections.Counter[str] = collections.Counter()
    allocations = allocated_bytes = device_events = 0
    for event in events:
        if event.name == "[memory]":
            if event.nbytes > 0:  # frees are recorded as negative sizes
                allocations += 1
                allocated_bytes += event.nbytes
            continue
        names[event.name] += 1
        device_events += event.on_device
    ops = {n: c for n, c in names.items() if n.startswith("aten::")}
    if on_cuda:
        launches = sum(names[n] for n in KERNEL_LAUNCH_CALLS)
        _check_complete(names, launches, device_events, profiler_log)
        syncs = sum(names[n] for n in CUDA_SYNC_CALLS) - 1  # less the closing sync
    else:
        # no device to wait for: count the value reads that would block on one
        syncs = sum(names[n] for n in HOST_SYNC_OPS)
        launches = None
    return Counters(
        op_calls=sum(ops.values()),
        host_syncs=syncs,
        allocations=allocations,
        allocated_bytes=allocated_bytes,
        kernel_launches=launches,
        ops=ops,
    )


def _check_complete(
    names: collections.Counter[str], launches: int, device_events: int, profiler_log: str
) -> None:
    """IncompleteProfileError unless a CUDA window holds its closing sync and, when it
    launched kernels, some device activity."""
    said = f"; the profiler said: {profiler_log.strip()}" if profiler_log.strip() else ""
    why = ("CUPTI is missing or unusable, or another tool (nsys, ncu) holds it; "
           "profile without it, or read counts from that tool")
    if names[CLOSING_SYNC] == 0:
        state = "empty" if not names else "partial"
        raise IncompleteProfileError(
            f"CUDA profile is {state}: the closing {CLOSING_SYNC} of the profiled window "
            f"is not in it ({sum(names.values())} events recorded), so host syncs and "
            f"kernel launches cannot be counted; {why}{said}"
        )
    if launches > 0 and device_events == 0:
        raise IncompleteProfileError(
            f"CUDA profile is partial: {launches} kernel launches were recorded on the host "
            f"but no activity on the device; {why}{said}"
        )


@contextlib.contextmanager
def _native_stderr_captured(into: list[str]) -> Iterator[None]:
    """Send file descriptor 2 to a temporary file and append what was written to `into`.

    Kineto prints a line at every profiler start and stop from C++, which Python's
    sys.stderr cannot catch and which breaks progress bars; its warnings (CUPTI missing)
    are kept this way for the error that reports an incomplete profile.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace").strip()
            if text:
                into.append(text)


@contextlib.contextmanager
def profiling(
    device: torch.device | str = "cpu", *, messages: list[str] | None = None, **kwargs
) -> Iterator[profile]:
    """`torch.profiler.profile` with CPU (+ CUDA on a CUDA device) activities, quietly.

    Only the profiler's start and stop are kept off the terminal, not the profiled code;
    what the profiler printed then is appended to `messages` when given.
    """
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    printed = messages if messages is not None else []
    prof = profile(activities=activities, **kwargs)
    with _native_stderr_captured(printed):
        prof.__enter__()
    try:
        yield prof
    finally:
        with _native_stderr_captured(printed):
            prof.__exit__(None, None, None)


def profile_call(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    trace_path: str | None = None,
) -> Counters:
    """Run `fn` once under torch.profiler (memory profiling on) and count what it did.

    On CUDA the window is closed by synchronizing `device` (the device in use, not the
    current one). `trace_path`, when given, receives a Chrome trace (open it in Perfetto).
    Raises `IncompleteProfileError` when a CUDA profile came back empty or partial.
    """
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)  # keep earlier work out of the profiled window
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    messages: list[str] = []
    with profiling(device, messages=messages, profile_memory=True) as prof:
        fn()
        if on_cuda:
            torch.cuda.synchronize(device)  # the window ends when the device is done
    if trace_path is not None:
        prof.export_chrome_trace(trace_path)
    with collector_paused():
        counters = count_events(kineto_events(prof), on_cuda, "\n".join(messages))
        if on_cuda:  # the device's own allocator knows its peak
            peak = torch.cuda.max_memory_allocated(device) - before
        else:
            peak = peak_live_bytes(memory_events(prof))
    return dataclasses.replace(counters, peak_bytes=peak)


# --- host-to-device copies (the transfer findings: H4, H5, audit 1.3) ---------------------
# On CUDA the profiler's device activity names each copy (`Memcpy HtoD (Pageable ->
# Device)`, `... (Pinned -> Device)`): those are counted. On the CPU there is no device to
# copy to, unless a finding moves to the `meta` device as a stand-in, whose copies move no
# bytes but are real dispatcher calls: those are counted by a dispatch mode.

COPY_OPS = (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default)


class _HostToOtherDevice(TorchDispatchMode):
    """Counts copies whose source is on the host and whose result is not."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in COPY_OPS:
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            if source.device.type == "cpu" and out.device.type != "cpu":
                self.copies += 1
        return out


def host_to_device_copies(call: Callable[[], object], device: torch.device) -> int:
    """Copies from the host to `device` during one `call()` (0 when `device` is the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        with profiling(device) as prof:
            call()
            torch.cuda.synchronize(device)
        return sum(1 for e in kineto_events(prof) if e.on_device and e.name.startswith("Memcpy HtoD"))
    if device.type == "cpu":  # no copy can leave the host: the call (seconds under a
        return 0                # dispatch mode that sees every op) would count nothing
    with _HostToOtherDevice() as mode:
        call()
    return mode.copies
