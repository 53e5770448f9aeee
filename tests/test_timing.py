"""Tests for harness.measure.timing, driven by a fake clock with known per-call costs.

Costs are powers of two so sums of them are exact in floating point and expected
samples can be compared with `==`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from harness.measure import stats
from harness.measure.timing import (
    CpuClock,
    CudaEventClock,
    CudaUnavailableError,
    Measurement,
    MeasurementKey,
    Precision,
    StopReason,
    VariantError,
    calibrate,
    make_clock,
    measure_interleaved,
    pinned_threads,
)

MS = 2.0**-10  # ~1 ms, exact in binary
KEY = MeasurementKey("F1", "small", "loop", "cpu", 1)


class FakeClock:
    """A clock over simulated time: each fake call advances `now` by its cost.

    Like torch.utils.benchmark's `_MockTimer`: the measurement algorithm sees known,
    reproducible costs; `log` records which variant ran, call by call.
    """

    name = "fake"

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.now = 0.0
        self.log: list[str] = []

    def time(self, fn: Callable[[], object], number: int) -> float:
        start = self.now
        for _ in range(number):
            fn()
        return self.now - start

    def variant(self, name: str, costs: Iterator[float]) -> Callable[[], None]:
        """A callable that logs `name` and costs the next value of `costs` seconds."""

        def call() -> None:
            self.log.append(name)
            self.now += next(costs)

        return call


def constant(cost: float, first: float | None = None) -> Iterator[float]:
    """`first` for the first call (default `cost`), then `cost` forever."""
    yield cost if first is None else first
    while True:
        yield cost


def lognormal(cost: float, sigma: float, seed: int) -> Iterator[float]:
    """Seeded noisy costs around `cost`."""
    rng = np.random.default_rng(seed)
    while True:
        yield float(cost * rng.lognormal(0.0, sigma))


def measure(fns, clock, **kwargs):
    kwargs.setdefault("finding", "F1")
    kwargs.setdefault("case", "small")
    kwargs.setdefault("now", lambda: clock.now)
    kwargs.setdefault("min_sample_time", MS)
    return measure_interleaved(fns, clock, **kwargs)


# --- clocks ---------------------------------------------------------------------------


def test_cpu_clock_converts_counter_nanoseconds_and_calls_fn_number_times():
    ticks = iter([1_000, 3_500])
    clock = CpuClock(counter_ns=lambda: next(ticks))
    calls = []
    assert clock.time(lambda: calls.append(1), 3) == pytest.approx(2.5e-6, rel=1e-12)
    assert len(calls) == 3


def test_cpu_clock_on_the_real_counter_returns_non_negative_seconds():
    assert CpuClock().time(lambda: sum(range(100)), 10) >= 0.0


@pytest.mark.parametrize("number", [0, -1, 1.5])
def test_clock_rejects_a_bad_number(number):
    with pytest.raises(ValueError, match=r"number: expected an integer >= 1 calls; got"):
        CpuClock().time(lambda: None, number)


def test_make_clock_on_cpu_returns_cpu_clock():
    clock = make_clock(torch.device("cpu"))
    assert isinstance(clock, CpuClock)
    assert clock.device == torch.device("cpu")


def test_make_clock_rejects_other_devices():
    with pytest.raises(ValueError, match=r"device: expected a cpu or cuda device; got 'meta'"):
        make_clock(torch.device("meta"))


def test_cuda_event_clock_rejects_a_cpu_device():
    with pytest.raises(ValueError, match=r"device: expected a cuda device; got 'cpu'"):
        CudaEventClock(torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_event_clock_without_cuda_says_so():
    message = r"needs CUDA.*make_clock\(torch.device\('cpu'\)\)"
    with pytest.raises(CudaUnavailableError, match=message):
        CudaEventClock()
    with pytest.raises(CudaUnavailableError):
        make_clock(torch.device("cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_event_clock_times_device_work():
    clock = make_clock(torch.device("cuda"))
    x = torch.ones(256, 256, device=clock.device)
    assert clock.time(lambda: x @ x, 5) > 0.0


# --- pinned_threads ----------------------------------------------------------------------


def test_pinned_threads_sets_yields_and_restores():
    before = torch.get_num_threads()
    with pinned_threads(1) as threads:
        assert threads == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_pinned_threads_restores_after_an_exception():
    before = torch.get_num_threads()
    with pytest.raises(KeyError):
        with pinned_threads(1):
            raise KeyError("boom")
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("n", [0, -2, 1.0])
def test_pinned_threads_rejects_bad_counts(n):
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match=r"n: expected an integer >= 1 threads; got"):
        with pinned_threads(n):
            pass
    assert torch.get_num_threads() == before


# --- calibrate ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cost", "expected"),
    [(2 * MS, 1), (MS, 1), (MS / 4, 4), (MS / 3, 4), (MS / 1024, 1024)],
)
def test_calibrate_doubles_until_a_sample_reaches_min_sample_time(cost, expected):
    clock = FakeClock()
    assert calibrate(clock.variant("A", constant(cost)), clock, min_sample_time=MS) == expected


def test_calibrate_tries_each_doubling_once():
    clock = FakeClock()
    calibrate(clock.variant("A", constant(MS / 8)), clock, min_sample_time=MS)
    assert len(clock.log) == 1 + 2 + 4 + 8


def test_calibrate_stops_at_max_number_for_free_functions():
    clock = FakeClock()
    free = clock.variant("A", constant(0.0))
    assert calibrate(free, clock, min_sample_time=MS, max_number=100) == 100


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_sample_time": 0.0}, r"min_sample_time: expected finite seconds > 0; got 0.0"),
        ({"min_sample_time": MS, "max_number": 0}, r"max_number: expected an integer >= 1"),
    ],
)
def test_calibrate_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibrate(lambda: None, FakeClock(), **kwargs)


# --- Measurement -------------------------------------------------------------------------


def make_measurement(samples, **overrides) -> Measurement:
    fields = dict(
        key=KEY,
        samples=samples,
        number_per_sample=4,
        first_call_seconds=0.5,
        warmup_calls=2,
        warmup_seconds=0.01,
        stopped_by=StopReason.MAX_SAMPLES,
    )
    fields.update(overrides)
    return Measurement(**fields)


def test_measurement_derives_statistics_from_its_samples():
    m = make_measurement([4.0, 1.0, 3.0, 2.0, 5.0])
    assert m.samples == (4.0, 1.0, 3.0, 2.0, 5.0)
    assert (m.n, m.median, m.iqr) == (5, 3.0, 2.0)
    assert m.iqr_over_median == pytest.approx(2.0 / 3.0)


def test_measurement_is_frozen():
    m = make_measurement([1.0, 2.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.samples = (9.0,)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"samples": []}, r"Measurement.samples: expected a non-empty"),
        (
            {"samples": [1.0, 0.0]},
            r"Measurement.samples: expected finite positive seconds; got 0.0 at index 1",
        ),
        (
            {"number_per_sample": 0},
            r"Measurement.number_per_sample: expected an integer >= 1; got 0",
        ),
    ],
)
def test_measurement_rejects_bad_fields(overrides, message):
    fields = {"samples": [1.0]} | overrides
    with pytest.raises(ValueError, match=message):
        make_measurement(**fields)


def test_measurement_key_rejects_zero_threads():
    message = r"MeasurementKey.threads: expected an integer >= 1; got 0"
    with pytest.raises(ValueError, match=message):
        MeasurementKey("F1", "small", "loop", "cpu", 0)


# --- measure_interleaved -----------------------------------------------------------------


def test_samples_are_exact_per_call_costs_with_calibrated_numbers():
    clock = FakeClock()
    fns = {
        "A": clock.variant("A", constant(MS / 4)),
        "B": clock.variant("B", constant(2 * MS)),
    }
    result = measure(fns, clock, min_samples=5, max_samples=5)
    assert result["A"].samples == (MS / 4,) * 5
    assert result["A"].number_per_sample == 4
    assert result["B"].samples == (2 * MS,) * 5
    assert result["B"].number_per_sample == 1
    assert result["A"].key == MeasurementKey("F1", "small", "A", "cpu", torch.get_num_threads())


def test_variants_are_sampled_interleaved_after_warm_up_and_calibration():
    clock = FakeClock()
    costs = {"A": MS / 2, "B": MS, "C": MS / 4}  # calibrates to 2, 1 and 4 calls
    fns = {name: clock.variant(name, constant(cost)) for name, cost in costs.items()}
    measure(fns, clock, warmup=1, min_samples=3, max_samples=3)
    # B's warm-up call already lasts min_sample_time: one call per sample, no calibration
    prepare = {"A": 1 + 1 + (1 + 2), "B": 1 + 1, "C": 1 + 1 + (1 + 2 + 4)}
    expected = [name for name in "ABC" for _ in range(prepare[name])]
    expected += ["A", "A", "B", "C", "C", "C", "C"] * 3
    assert clock.log == expected


def test_first_call_and_warm_up_are_reported_apart_from_samples():
    clock = FakeClock()
    fns = {"A": clock.variant("A", constant(MS, first=0.5))}  # e.g. a compile on first call
    m = measure(fns, clock, warmup=3, min_samples=4, max_samples=4)["A"]
    assert m.first_call_seconds == 0.5
    assert (m.warmup_calls, m.warmup_seconds) == (3, 3 * MS)
    assert m.samples == (MS,) * 4


def test_stops_at_min_samples_when_spread_is_already_low():
    clock = FakeClock()
    fns = {"A": clock.variant("A", constant(MS)), "B": clock.variant("B", constant(2 * MS))}
    result = measure(fns, clock, min_samples=7, max_samples=100)
    assert [m.n for m in result.values()] == [7, 7]
    assert {m.stopped_by for m in result.values()} == {StopReason.TARGET_REACHED}


def test_stops_at_max_samples_when_spread_stays_high():
    clock = FakeClock()
    fns = {"A": clock.variant("A", lognormal(MS, 0.5, seed=1))}
    m = measure(fns, clock, min_samples=5, max_samples=40, time_budget_s=1e6)["A"]
    assert (m.n, m.stopped_by) == (40, StopReason.MAX_SAMPLES)
    assert m.iqr_over_median > 0.05


def test_stops_at_the_first_round_where_every_variant_reaches_the_target():
    clock = FakeClock()

    def settling(seed: int) -> Iterator[float]:
        """Noisy for the first 60 calls, then constant: spread decays as samples pile up."""
        noisy = lognormal(MS, 0.3, seed)
        for _ in range(60):
            yield next(noisy)
        yield from constant(MS)

    fns = {"A": clock.variant("A", settling(1)), "B": clock.variant("B", settling(2))}
    result = measure(fns, clock, min_samples=3, max_samples=500, target_rel_iqr=0.05)
    n = result["A"].n
    assert result["A"].stopped_by is StopReason.TARGET_REACHED
    assert 3 < n < 500 and result["B"].n == n

    def rel_iqr(samples):
        return stats.iqr(samples) / stats.median(samples)

    assert max(rel_iqr(m.samples) for m in result.values()) <= 0.05
    assert max(rel_iqr(m.samples[:-1]) for m in result.values()) > 0.05


# --- adaptive sampling: Precision ----------------------------------------------------------


def test_precision_stops_early_when_one_variant_is_clearly_faster():
    """A 4x difference under 5% noise is known to +-3% after a few rounds: sampling stops
    long before the budget, with every interval as tight as the target."""
    clock = FakeClock()
    fns = {"loop": clock.variant("loop", lognormal(4 * MS, 0.05, seed=1)),
           "scan": clock.variant("scan", lognormal(MS, 0.05, seed=2))}
    result = measure(fns, clock, min_samples=5, max_samples=200, time_budget_s=1e6,
                     precision=Precision(0.03, reference="loop"))
    m = result["scan"]
    assert m.stopped_by is StopReason.PRECISION_REACHED
    assert 8 <= m.n < 30  # at least min_rounds, far below the cap
    ci = stats.bootstrap_ratio_ci(m.samples, result["loop"].samples)
    assert stats.relative_halfwidth(ci) <= 0.03 and ci.high < 0.3
    assert m.precision_reached == pytest.approx(stats.relative_halfwidth(ci))


def test_precision_runs_a_noisy_no_difference_pair_to_its_budget():
    """Two equal variants under 30% noise: the ratio's interval stays wider than +-3% for
    the whole budget, so sampling ends by the budget, not by a lucky streak."""
    clock = FakeClock()
    fns = {"a": clock.variant("a", lognormal(MS, 0.3, seed=3)),
           "b": clock.variant("b", lognormal(MS, 0.3, seed=4))}
    result = measure(fns, clock, warmup=0, min_samples=5, max_samples=10_000,
                     time_budget_s=0.2, precision=Precision(0.03))
    m = result["b"]
    assert m.stopped_by is StopReason.TIME_BUDGET
    assert m.precision_reached > 0.03
    ci = stats.bootstrap_ratio_ci(m.samples, result["a"].samples)
    assert ci.low < 1.0 < ci.high  # no difference, and the budget was spent to say so


def test_precision_settles_each_variant_on_its_own_and_stops_sampling_it():
    """A variant whose ratio is known leaves the rounds while a noisy one goes on: its
    calls stop (the log shows none after it settled), its interval is the one checked
    (against the reference's samples of the same rounds), and the reference keeps
    sampling with the open variant until the budget."""
    clock = FakeClock()
    fns = {"loop": clock.variant("loop", lognormal(4 * MS, 0.02, seed=6)),
           "fast": clock.variant("fast", lognormal(MS, 0.02, seed=7)),
           "noisy": clock.variant("noisy", lognormal(4 * MS, 0.4, seed=8))}
    result = measure(fns, clock, warmup=0, min_samples=5, max_samples=10_000,
                     time_budget_s=0.5, precision=Precision(0.03, reference="loop"))
    loop, fast, noisy = result["loop"], result["fast"], result["noisy"]
    assert fast.stopped_by is StopReason.PRECISION_REACHED
    assert noisy.stopped_by is StopReason.TIME_BUDGET
    assert loop.stopped_by is StopReason.TIME_BUDGET
    assert 8 <= fast.n < noisy.n == loop.n
    # the calls of `fast` end where its samples end: each sample is `number` calls
    sampled_fast = [name for name in clock.log if name == "fast"]
    prepared_calls = 1 + fast.warmup_calls
    assert len(sampled_fast) == prepared_calls + calibration_calls(fast) + fast.n * fast.number_per_sample
    ci = stats.bootstrap_ratio_ci(fast.samples, loop.samples[:fast.n])
    assert fast.precision_reached == pytest.approx(stats.relative_halfwidth(ci))
    assert fast.precision_reached <= 0.03 < noisy.precision_reached
    assert loop.precision_reached == noisy.precision_reached  # the cell's widest


def calibration_calls(m) -> int:
    """Calls `calibrate` made for `m`: blocks of 1, 2, 4, ... up to its number."""
    return 2 * m.number_per_sample - 1


def test_precision_takes_its_minimum_rounds_even_on_identical_samples():
    clock = FakeClock()
    fns = {"a": clock.variant("a", constant(MS)), "b": clock.variant("b", constant(2 * MS))}
    result = measure(fns, clock, min_samples=2, max_samples=100,
                     precision=Precision(0.03, min_rounds=12))
    assert result["a"].n == 12 and result["a"].stopped_by is StopReason.PRECISION_REACHED


def test_precision_zero_samples_for_the_whole_budget():
    clock = FakeClock()
    fns = {"a": clock.variant("a", constant(MS)), "b": clock.variant("b", constant(2 * MS))}
    result = measure(fns, clock, min_samples=2, max_samples=50, time_budget_s=1e6,
                     precision=Precision(0.0))
    assert (result["a"].n, result["a"].stopped_by) == (50, StopReason.MAX_SAMPLES)


def test_precision_with_one_variant_asks_for_its_median():
    clock = FakeClock()
    fns = {"only": clock.variant("only", lognormal(MS, 0.05, seed=5))}
    m = measure(fns, clock, min_samples=2, max_samples=500, time_budget_s=1e6,
                precision=Precision(0.01))["only"]
    assert m.stopped_by is StopReason.PRECISION_REACHED
    assert stats.relative_halfwidth(stats.bootstrap_median_ci(m.samples)) <= 0.01


@pytest.mark.parametrize("kwargs, message", [
    ({"target": -0.1}, r"Precision.target: expected a fraction >= 0; got -0.1"),
    ({"target": float("nan")}, r"Precision.target: expected a fraction >= 0; got nan"),
    ({"min_rounds": 1}, r"Precision.min_rounds: expected an integer >= 2; got 1"),
])
def test_precision_rejects_bad_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Precision(**kwargs)


def test_stops_when_the_time_budget_is_spent():
    clock = FakeClock()
    fns = {"A": clock.variant("A", lognormal(MS, 0.5, seed=3))}
    m = measure(fns, clock, warmup=0, min_samples=2, max_samples=10_000, time_budget_s=0.25)["A"]
    assert m.stopped_by is StopReason.TIME_BUDGET
    # The budget is checked after each round: the last round started within budget.
    prepare_time = clock.now - sum(m.samples) * m.number_per_sample
    assert prepare_time + sum(m.samples[:-1]) * m.number_per_sample < 0.25 <= clock.now


def test_min_samples_are_taken_even_past_the_budget():
    clock = FakeClock()
    fns = {"A": clock.variant("A", lognormal(MS, 0.5, seed=4))}
    m = measure(fns, clock, min_samples=6, max_samples=100, time_budget_s=1e-9)["A"]
    assert (m.n, m.stopped_by) == (6, StopReason.TIME_BUDGET)


@pytest.mark.parametrize(
    ("failing_call", "phase"),
    [(0, "first call"), (1, "warm-up"), (3, "calibration"), (20, "sampling")],
)
def test_a_raising_variant_surfaces_as_variant_error_naming_it(failing_call, phase):
    clock = FakeClock()
    original = RuntimeError("shape mismatch")

    def costs() -> Iterator[float]:
        for _ in range(failing_call):
            yield MS / 4  # short enough to need calibration after warm-up
        raise original

    fns = {"A": clock.variant("A", constant(MS)), "B": clock.variant("B", costs())}
    with pytest.raises(VariantError) as info:
        measure(fns, clock, warmup=2, min_samples=50, max_samples=50)
    assert (info.value.variant, info.value.phase) == ("B", phase)
    assert info.value.original is original and info.value.__cause__ is original
    assert str(info.value) == f"variant 'B' raised during {phase}: RuntimeError: shape mismatch"


def test_warm_up_of_a_slow_call_stops_at_its_budget_unless_calls_must_align():
    clock = FakeClock()
    slow = {"A": clock.variant("A", constant(0.2))}
    m = measure(slow, clock, warmup=3, min_samples=2, max_samples=2, warmup_budget_s=0.1)["A"]
    assert (m.warmup_calls, m.number_per_sample) == (1, 1)
    assert clock.log == ["A"] * (1 + 1 + 2)  # first, one warm-up, two samples: no calibration
    clock = FakeClock()
    slow = {"A": clock.variant("A", constant(0.2))}
    m = measure(slow, clock, warmup=3, min_samples=2, max_samples=2,
                warmup_budget_s=float("inf"), min_sample_time=None)["A"]
    assert m.warmup_calls == 3 and len(clock.log) == 1 + 3 + 2


def test_threads_in_effect_are_recorded_in_the_key():
    clock = FakeClock()
    with pinned_threads(1):
        m = measure({"A": clock.variant("A", constant(MS))}, clock, min_samples=1, max_samples=1)
    assert m["A"].key.threads == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup": -1}, r"warmup: expected an integer >= 0 calls; got -1"),
        ({"min_samples": 0}, r"min_samples: expected an integer >= 1; got 0"),
        (
            {"min_samples": 5, "max_samples": 4},
            r"max_samples: expected an integer >= min_samples \(5\); got 4",
        ),
        ({"time_budget_s": 0.0}, r"time_budget_s: expected finite seconds > 0; got 0.0"),
        ({"target_rel_iqr": -0.1}, r"target_rel_iqr: expected a fraction >= 0; got -0.1"),
        (
            {"min_sample_time": float("nan")},
            r"min_sample_time: expected finite seconds > 0; got nan",
        ),
    ],
)
def test_measure_interleaved_rejects_bad_arguments(kwargs, message):
    clock = FakeClock()
    with pytest.raises(ValueError, match=message):
        measure({"A": clock.variant("A", constant(MS))}, clock, **kwargs)
    assert clock.log == []


def test_measure_interleaved_rejects_no_variants():
    message = r"fns: expected at least one variant; got an empty mapping"
    with pytest.raises(ValueError, match=message):
        measure({}, FakeClock())


# --- CudaEventClock against a stand-in CUDA API ---------------------------------------


class StandInCuda:
    """The part of `torch.cuda` that `CudaEventClock` calls, logging each call in order.

    A stand-in, because this machine has no CUDA: it proves the clock's ordering (where
    the events are recorded, that the host waits on the end event before reading the
    elapsed time, under which device guard), not any timing. Like real CUDA events,
    `elapsed_time` raises unless the end event has completed (been synchronized).
    """

    def __init__(self, elapsed_ms: float) -> None:
        self.elapsed_ms = elapsed_ms
        self.log: list[tuple] = []
        self.streams: list[object] = []

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 3

    @contextlib.contextmanager
    def device(self, device):
        self.log.append(("device guard", str(device)))
        yield
        self.log.append(("device guard exit", str(device)))

    def current_stream(self, device):
        stream = f"stream of {device}"
        self.log.append(("current_stream", str(device)))
        return stream

    def Event(self, enable_timing: bool = False):  # noqa: N802 (torch.cuda's name)
        cuda = self
        index = sum(1 for entry in self.log if entry[0] == "Event")
        name = ("start", "end")[index] if index < 2 else f"event{index}"
        self.log.append(("Event", name, enable_timing))

        class StandInEvent:
            completed = False

            def record(self, stream):
                cuda.log.append(("record", name, stream))

            def synchronize(self):
                cuda.log.append(("synchronize", name))
                self.completed = True

            def elapsed_time(self, end):
                cuda.log.append(("elapsed_time", name, end.name))
                if not end.completed:
                    raise RuntimeError("CUDA error: device not ready")
                return cuda.elapsed_ms

        event = StandInEvent()
        event.name = name
        return event


def test_cuda_event_clock_records_on_the_stream_it_reads_and_waits_before_reading():
    cuda = StandInCuda(elapsed_ms=2.5)
    clock = CudaEventClock("cuda:1", cuda=cuda)
    assert clock.device == torch.device("cuda", 1)
    seconds = clock.time(lambda: cuda.log.append(("fn",)), 3)
    stream = "stream of cuda:1"
    assert cuda.log == [
        ("device guard", "cuda:1"),
        ("current_stream", "cuda:1"),
        ("Event", "start", True),
        ("Event", "end", True),
        ("record", "start", stream),
        ("fn",), ("fn",), ("fn",),
        ("record", "end", stream),
        ("synchronize", "end"),
        ("elapsed_time", "start", "end"),
        ("device guard exit", "cuda:1"),
    ]
    assert seconds == pytest.approx(2.5e-3)


def test_cuda_event_clock_without_an_index_takes_the_current_device():
    clock = CudaEventClock("cuda", cuda=StandInCuda(elapsed_ms=1.0))
    assert clock.device == torch.device("cuda", 3)
