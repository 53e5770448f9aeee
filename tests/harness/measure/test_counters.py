"""Tests for harness.measure.counters: what counts as a launch, a host sync, an allocation.

The CUDA cases feed `count_events` event lists shaped like a CUDA profile (runtime and
driver API calls on the host, kernels and copies on the device), because this machine
has no GPU: they prove how a CUDA profile is counted and that an empty or partial one
fails loudly, not that CUPTI reports these names on a given driver (only a GPU run can).
The CPU cases profile real calls.
"""

from __future__ import annotations

import os

import pytest
import torch

from harness.measure.counters import (
    host_to_device_copies,
    IncompleteProfileError,
    ProfiledEvent,
    _native_stderr_captured,
    MemoryEvent,
    count_events,
    peak_live_bytes,
    profile_call,
)

CLOSE = ProfiledEvent("cudaDeviceSynchronize")  # how profile_call ends a CUDA window


def host(*names: str) -> list[ProfiledEvent]:
    return [ProfiledEvent(name) for name in names]


def kernels(count: int) -> list[ProfiledEvent]:
    return [ProfiledEvent(f"void kernel_{i}<float>(...)", on_device=True) for i in range(count)]


# --- CUDA profiles, synthetic ------------------------------------------------------------


def test_launches_through_the_runtime_and_the_driver_api_all_count():
    events = (host("aten::add", "cudaLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernelExC",
                   "cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")
              + kernels(6) + [CLOSE])
    counters = count_events(events, on_cuda=True)
    assert counters.kernel_launches == 6
    assert counters.host_syncs == 0
    assert counters.op_calls == 1


@pytest.mark.parametrize("call", ["cudaStreamSynchronize", "cudaDeviceSynchronize",
                                  "cudaEventSynchronize", "cuStreamSynchronize",
                                  "cuCtxSynchronize", "cuEventSynchronize", "cudaMemcpy"])
def test_each_blocking_call_is_one_host_sync(call):
    events = host("cudaLaunchKernel", call, call) + kernels(1) + [CLOSE]
    assert count_events(events, on_cuda=True).host_syncs == 2


def test_a_blocking_copy_to_the_host_counts_once_and_a_non_blocking_one_not_at_all():
    # `.cpu()` / `.item()` of a CUDA tensor: cudaMemcpyAsync closed by a stream sync
    blocking = host("aten::_local_scalar_dense", "cudaMemcpyAsync", "cudaStreamSynchronize")
    non_blocking = host("aten::copy_", "cudaMemcpyAsync")
    copy = [ProfiledEvent("Memcpy DtoH (Device -> Pageable)", on_device=True)]
    assert count_events(blocking + copy + [CLOSE], on_cuda=True).host_syncs == 1
    assert count_events(non_blocking + copy + [CLOSE], on_cuda=True).host_syncs == 0


def test_value_reads_are_host_syncs_on_the_cpu_only():
    events = host("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize")
    on_cpu = count_events(events, on_cuda=False)
    assert (on_cpu.host_syncs, on_cpu.kernel_launches) == (1, None)
    # on CUDA the same read is counted by the stream sync it waits on, not by the op
    assert count_events(events + [CLOSE], on_cuda=True).host_syncs == 1


def test_allocations_count_positive_memory_events_only():
    events = [ProfiledEvent("[memory]", 512), ProfiledEvent("[memory]", -512),
              ProfiledEvent("[memory]", 64), ProfiledEvent("aten::empty")]
    counters = count_events(events, on_cuda=False)
    assert (counters.allocations, counters.allocated_bytes, counters.op_calls) == (2, 576, 1)


def test_peak_is_the_most_live_bytes_in_time_order_on_the_host():
    def memory(nbytes: int, ptr: int, at: int, on_device: bool = False) -> MemoryEvent:
        return MemoryEvent(nbytes, ptr, at, on_device)

    # given out of order: +100 @1, +300 @2, -100 @3, +50 @4, -300 @5 -> live 100, 400, 300, 350
    events = [memory(-100, 1, 3), memory(300, 2, 2), memory(100, 1, 1), memory(-300, 2, 5),
              memory(50, 3, 4), memory(10_000, 9, 2, on_device=True)]  # not the host's
    assert peak_live_bytes(events) == 400
    # freeing what it found (not allocated in the window) neither costs nor saves anything
    assert peak_live_bytes([memory(-64, 7, 1), memory(32, 8, 2)]) == 32


def test_profile_call_on_the_cpu_reports_the_peak_of_a_real_call():
    def call():
        a = torch.empty(1000, dtype=torch.float64)  # 8000 bytes
        b = torch.empty(2000, dtype=torch.float64)  # 16000 bytes, both alive: 24000
        del a, b
        return torch.empty(100, dtype=torch.float64)

    counters = profile_call(call)
    assert counters.peak_bytes >= 24_000 and counters.peak_bytes < 24_000 + 4096
    assert counters.as_row()["peak_bytes"] == counters.peak_bytes


def test_the_peak_does_not_depend_on_what_an_earlier_call_left_to_free():
    """A call that frees the previous call's result (like gradients set to None) has the
    same peak on every call, the first included."""
    kept = {}

    def call():
        kept.pop("last", None)  # frees what the previous call allocated
        kept["last"] = torch.empty(5000, dtype=torch.float64)  # 40000 bytes
        return torch.empty(100)

    peaks = [profile_call(call).peak_bytes for _ in range(3)]
    assert peaks[0] == peaks[1] == peaks[2] >= 40_000


def test_an_empty_cuda_profile_fails_and_says_why():
    with pytest.raises(IncompleteProfileError, match=r"CUDA profile is empty.*CUPTI") as info:
        count_events([], on_cuda=True, profiler_log="CUPTI_ERROR_NOT_INITIALIZED")
    assert "the profiler said: CUPTI_ERROR_NOT_INITIALIZED" in str(info.value)


def test_a_profile_without_its_closing_sync_is_partial():
    # host ops were recorded but no runtime call: CUPTI's callbacks are missing
    events = host("aten::add", "aten::mul") + kernels(2)
    with pytest.raises(IncompleteProfileError, match=r"CUDA profile is partial: the closing "
                                                     r"cudaDeviceSynchronize .* \(4 events"):
        count_events(events, on_cuda=True)


def test_launches_without_device_activity_are_a_partial_profile():
    events = host("aten::add", "cudaLaunchKernel", "cuLaunchKernel") + [CLOSE]
    with pytest.raises(IncompleteProfileError,
                       match=r"partial: 2 kernel launches were recorded on the host but no "
                             r"activity on the device"):
        count_events(events, on_cuda=True)


def test_a_window_with_no_launch_needs_no_device_activity():
    counters = count_events(host("aten::view", "cudaStreamSynchronize") + [CLOSE], on_cuda=True)
    assert (counters.kernel_launches, counters.host_syncs) == (0, 1)


# --- real profiles on the CPU -------------------------------------------------------------


def test_profile_call_on_the_cpu_counts_a_value_read_as_one_host_sync():
    x = torch.arange(6.0)
    counters = profile_call(lambda: (x * 2).sum().item())
    assert counters.host_syncs == 1
    assert counters.kernel_launches is None
    assert counters.ops["aten::_local_scalar_dense"] == 1


def test_profile_call_on_the_cpu_without_a_value_read_has_no_host_sync():
    x = torch.arange(6.0)
    assert profile_call(lambda: (x * 2).sum()).host_syncs == 0


def test_native_stderr_is_captured_not_shown(capfd):
    said: list[str] = []
    with _native_stderr_captured(said):
        os.write(2, b"WARNING: CUPTI initialization failed\n")
    assert said == ["WARNING: CUPTI initialization failed"]
    assert capfd.readouterr().err == ""


def test_no_copy_leaves_the_host_on_the_cpu_device_and_the_call_is_not_run():
    """The CPU device has no host-to-device copy to count: the call (11 s a process for a
    buffer's 2,400 adds under a dispatch mode that sees every op) is not run for it; a
    device off the host still counts (meta here, CUDA's from the profiler)."""
    calls = []
    assert host_to_device_copies(lambda: calls.append(1), torch.device("cpu")) == 0
    assert calls == []
    meta = torch.device("meta")
    assert host_to_device_copies(lambda: torch.ones(3).to(meta), meta) == 1
