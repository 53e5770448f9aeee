"""harness.measure.bandwidth: the bytes GAE must move, the copy bandwidth, the label, and the rows."""

from __future__ import annotations

import time

import pytest
import torch

from harness.measure.bandwidth import (
    BANDWIDTH_BOUND, LAUNCH_BOUND, bound_label, cpu_caches,
    measure_copy_bandwidth, memory_level, working_set_bandwidth,
)
from harness.findings import Case, Finding, Recording
from harness.runner import CaseRun, RunOptions


def test_copy_bandwidth_is_positive_and_plausible():
    bandwidth = measure_copy_bandwidth("cpu", nbytes=64 * 1024 * 1024, repeats=3)
    assert 1e8 < bandwidth < 1e13
    with pytest.raises(ValueError, match="nbytes >= 1"):
        measure_copy_bandwidth("cpu", nbytes=0)


def test_bound_label_is_bandwidth_bound_within_3x_of_the_floor():
    assert bound_label(1e-3, 1e-3) == BANDWIDTH_BOUND
    assert bound_label(3e-3, 1e-3) == BANDWIDTH_BOUND
    assert bound_label(3.01e-3, 1e-3) == LAUNCH_BOUND
    assert bound_label(1e-5, 1e-7) == LAUNCH_BOUND
    assert bound_label(2e-3, 1e-3, factor=1.5) == LAUNCH_BOUND


def _sleepy_finding() -> Finding:
    """`ours` sleeps 2 ms a call; `peer`, a comparator, returns at once."""
    calls = {"ours": lambda: time.sleep(2e-3), "peer": lambda: None}
    return Finding(
        id="TEST-bandwidth", title="t", claim="c", variants=("ours", "peer"), baseline="ours",
        peers=("peer",), cases=lambda quick: [Case.of(n=1)],
        build=lambda case, device, seed: None, make_call=lambda variant, inputs: calls[variant],
        recording=Recording(min_bytes=lambda case: 1000),
    )


def test_rows_carry_achieved_bandwidth_and_the_floor_judged_on_our_variants_only():
    # the floor: 1000 B at the speed of the memory that holds 1000 B (a cache here), far
    # below ours (>= 2 ms); the peer returns at once, but peers do not count as our best
    options = RunOptions(device=torch.device("cpu"), min_samples=3,
                         profile=False, copy_bandwidth_bytes_per_s=1e7)
    summary = CaseRun(_sleepy_finding(), Case.of(n=1), options, sampling_s=0.05).run().summary
    rows = {r["variant"]: r for r in summary}
    speed, level = working_set_bandwidth("cpu", 1000)
    for row in rows.values():
        assert row["min_bytes"] == 1000
        assert row["floor_s"] == pytest.approx(1000 / speed)
        assert row["floor_level"] == level == memory_level(1000)
        assert row["bound"] == LAUNCH_BOUND
        assert row["achieved_bytes_per_s"] == pytest.approx(1000 / row["median_s"])
    assert rows["ours"]["achieved_bytes_per_s"] < 1000 / 2e-3


def test_without_a_copy_bandwidth_rows_have_no_floor():
    options = RunOptions(device=torch.device("cpu"), min_samples=3, profile=False)
    (row, _) = CaseRun(_sleepy_finding(), Case.of(n=1), options, sampling_s=0.05).run().summary
    assert "achieved_bytes_per_s" in row and "floor_s" not in row and "bound" not in row


def test_cache_sizes_are_read_from_the_systems_description(tmp_path):
    for index, (level, kind, size) in enumerate([("1", "Data", "32K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "1024K"), ("3", "Unified", "32M")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(value + "\n")
    caches = cpu_caches(tmp_path)
    assert caches == [("L1d", 32 * 1024), ("L2", 1024 * 1024), ("L3", 32 * 1024 * 1024)]
    assert [memory_level(n, caches) for n in (1000, 600_000, 5_800_000, 10**9)] == \
        ["L1d", "L2", "L3", "DRAM"]
    assert cpu_caches(tmp_path / "none") == []
