"""Timing: clocks, thread pinning, calibration, and interleaved sampling into Measurements.

A `Clock` times `number` back-to-back calls of a function and returns total seconds;
`make_clock` picks the device-correct one at run time (CUDA events on a GPU,
`time.perf_counter_ns` on the CPU). `measure_interleaved` warms each variant up,
calibrates how many calls make one sample, then samples the variants in turn
(A B C A B C ...) so drift in the machine's state hits all of them alike. It returns
one frozen `Measurement` per variant; statistics are derived from its raw samples.
"""

from __future__ import annotations

import contextlib
import enum
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch._inductor import config as inductor_config

from harness.measure import stats

__all__ = [
    "Clock",
    "CpuClock",
    "CudaEventClock",
    "CudaUnavailableError",
    "Measurement",
    "MeasurementKey",
    "StopReason",
    "VariantError",
    "calibrate",
    "make_clock",
    "measure_interleaved",
    "pinned_threads",
]


class Clock(Protocol):
    """Times back-to-back calls of a function on one device."""

    name: str
    """What the clock reads, recorded with results (`perf_counter_ns`, `cuda_event`)."""
    device: torch.device
    """The device whose work the clock covers."""

    def time(self, fn: Callable[[], object], number: int) -> float:
        """Total seconds for `number` back-to-back calls of `fn`."""
        ...


class CudaUnavailableError(RuntimeError):
    """A CUDA clock was asked for where torch sees no CUDA device."""


def _check_number(number: int) -> None:
    """ValueError unless `number` (calls per timing) is an integer >= 1."""
    if not isinstance(number, int) or number < 1:
        raise ValueError(f"number: expected an integer >= 1 calls; got {number!r}")


class CpuClock:
    """Host wall time from `time.perf_counter_ns` (an injectable nanosecond counter)."""

    name = "perf_counter_ns"

    def __init__(self, counter_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self.device = torch.device("cpu")
        self._counter_ns = counter_ns

    def time(self, fn: Callable[[], object], number: int) -> float:
        """Total seconds for `number` back-to-back calls of `fn`."""
        _check_number(number)
        start = self._counter_ns()
        for _ in range(number):
            fn()
        return (self._counter_ns() - start) * 1e-9


class CudaEventClock:
    """Device time between two CUDA events recorded on the device's current stream.

    Work that `fn` queues on other streams is covered only if `fn` joins it back into
    the current stream (`wait_event`/`wait_stream`) or synchronizes on the host.
    `cuda` is the CUDA API the clock calls (`torch.cuda`: `is_available`,
    `current_device`, `device`, `current_stream`, `Event`); tests pass a stand-in.
    """

    name = "cuda_event"

    def __init__(self, device: torch.device | str = "cuda", *, cuda=torch.cuda) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device: expected a cuda device; got {str(device)!r}")
        if not cuda.is_available():
            raise CudaUnavailableError(
                "CudaEventClock needs CUDA, but torch.cuda.is_available() is False "
                f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                "time on the CPU with make_clock(torch.device('cpu'))"
            )
        index = device.index if device.index is not None else cuda.current_device()
        self.device = torch.device("cuda", index)
        self._cuda = cuda

    def time(self, fn: Callable[[], object], number: int) -> float:
        """Total seconds for `number` back-to-back calls of `fn`, read from CUDA events."""
        _check_number(number)
        cuda = self._cuda
        with cuda.device(self.device):
            # both events on the stream `fn`'s work lands on: the device's current stream
            stream = cuda.current_stream(self.device)
            start = cuda.Event(enable_timing=True)
            end = cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(number):
                fn()
            end.record(stream)
            # host sync: elapsed_time is only defined once `end` has completed on the
            # device; it also leaves the stream idle, so the next sample's `start`
            # marks when its host-side launches begin rather than a backlog draining.
            end.synchronize()
            return start.elapsed_time(end) * 1e-3  # milliseconds -> seconds


def make_clock(device: torch.device) -> Clock:
    """The device-correct clock for `device`, chosen when called (never at import)."""
    if device.type == "cuda":
        return CudaEventClock(device)
    if device.type == "cpu":
        return CpuClock()
    raise ValueError(f"device: expected a cpu or cuda device; got {str(device)!r}")


@contextlib.contextmanager
def pinned_threads(n: int) -> Iterator[int]:
    """Run the body with `torch.set_num_threads(n)` and torch.compile compiling in this
    process; restore both after.

    Inductor otherwise compiles in a pool of worker processes that start (and import
    torch) in the background, taking a core from the timings of the next cases on a
    small machine. Yields the thread count in effect, to record with the measurements.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an integer >= 1 threads; got {n!r}")
    previous, previous_compile = torch.get_num_threads(), inductor_config.compile_threads
    torch.set_num_threads(n)
    inductor_config.compile_threads = 1
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)
        inductor_config.compile_threads = previous_compile


def _check_min_sample_time(min_sample_time: float) -> None:
    """ValueError unless `min_sample_time` is finite positive seconds."""
    if not (math.isfinite(min_sample_time) and min_sample_time > 0.0):
        raise ValueError(
            f"min_sample_time: expected finite seconds > 0; got {min_sample_time!r}"
        )


def calibrate(
    fn: Callable[[], object],
    clock: Clock,
    *,
    min_sample_time: float,
    max_number: int = 1 << 20,
) -> int:
    """Calls per sample: double from 1 until one sample takes >= `min_sample_time` s.

    Growing the block until it is long next to the clock's own overhead and resolution
    makes that overhead negligible (like `torch.utils.benchmark`'s `blocked_autorange`,
    with x2 steps so a sample lands within about 2x of the target). Stops at
    `max_number` for functions too cheap for the clock to see.
    """
    _check_min_sample_time(min_sample_time)
    if not isinstance(max_number, int) or max_number < 1:
        raise ValueError(f"max_number: expected an integer >= 1 calls; got {max_number!r}")
    number = 1
    while number < max_number and clock.time(fn, number) < min_sample_time:
        number *= 2
    return min(number, max_number)


@dataclass(frozen=True)
class MeasurementKey:
    """Identity of a measurement: finding -> table, variant -> row, case -> column."""

    finding: str
    """Id of the review finding (ticket) being measured."""
    case: str
    """Name of the input case."""
    variant: str
    """Name of the variant timed."""
    device: str
    """`str(torch.device)` the clock covered, e.g. `cpu` or `cuda:0`."""
    threads: int
    """`torch.get_num_threads()` while sampling."""

    def __post_init__(self) -> None:
        if not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(
                f"MeasurementKey.threads: expected an integer >= 1; got {self.threads!r}"
            )


class StopReason(str, enum.Enum):
    """Why interleaved sampling stopped."""

    TARGET_REACHED = "target_reached"
    """Every variant's IQR/median fell to the target."""
    MAX_SAMPLES = "max_samples"
    """The sample cap was reached first."""
    TIME_BUDGET = "time_budget"
    """The time budget was spent first."""


@dataclass(frozen=True)
class Measurement:
    """Raw samples of one variant and the statistics derived from them.

    Frozen and derived on read, so no statistic can go stale.
    """

    key: MeasurementKey
    """What was measured, where."""
    samples: tuple[float, ...]
    """Seconds per call, one entry per sample, in the order taken."""
    number_per_sample: int
    """Back-to-back calls timed together for each sample."""
    first_call_seconds: float
    """The very first call alone: includes compile/JIT, lazy init and allocator warm-up."""
    warmup_calls: int
    """Calls after the first, run before calibration and not sampled."""
    warmup_seconds: float
    """Total seconds of the `warmup_calls`."""
    stopped_by: StopReason
    """Why sampling stopped."""

    def __post_init__(self) -> None:
        # Coerce lists from callers or JSON into the immutable form the stats assume.
        object.__setattr__(self, "samples", tuple(float(s) for s in self.samples))
        stats.as_samples(self.samples, "Measurement.samples")
        if not isinstance(self.number_per_sample, int) or self.number_per_sample < 1:
            raise ValueError(
                "Measurement.number_per_sample: expected an integer >= 1; "
                f"got {self.number_per_sample!r}"
            )

    @property
    def n(self) -> int:
        """Number of samples."""
        return len(self.samples)

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return stats.median(self.samples)

    @property
    def iqr(self) -> float:
        """Interquartile range of seconds per call."""
        return stats.iqr(self.samples)

    @property
    def iqr_over_median(self) -> float:
        """Relative spread; above ~0.1 the machine was noisy for this measurement."""
        return self.iqr / self.median


class VariantError(Exception):
    """A variant raised while being measured.

    The original exception is `original` and also `__cause__`. The whole interleaved
    measurement stops at the first failure: samples of the other variants are dropped,
    and the caller may record this variant as failed and measure the rest again.
    """

    def __init__(self, variant: str, phase: str, original: Exception) -> None:
        super().__init__(
            f"variant {variant!r} raised during {phase}: {type(original).__name__}: {original}"
        )
        self.variant = variant
        self.phase = phase
        self.original = original


@contextlib.contextmanager
def _attributed(variant: str, phase: str) -> Iterator[None]:
    """Re-raise any exception from the body as a VariantError naming `variant`."""
    try:
        yield
    except Exception as err:
        raise VariantError(variant, phase, err) from err


@dataclass(frozen=True)
class _Prepared:
    """One variant after warm-up and calibration."""

    first_call_seconds: float
    warmup_seconds: float
    number: int


def _prepare(
    name: str, fn: Callable[[], object], clock: Clock, warmup: int, min_sample_time: float
) -> _Prepared:
    """Time the first call apart, run `warmup` more calls, then calibrate."""
    with _attributed(name, "first call"):
        first = clock.time(fn, 1)
    with _attributed(name, "warm-up"):
        warm = clock.time(fn, warmup) if warmup else 0.0
    with _attributed(name, "calibration"):
        number = calibrate(fn, clock, min_sample_time=min_sample_time)
    return _Prepared(first_call_seconds=first, warmup_seconds=warm, number=number)


def _sample_round(
    fns: Mapping[str, Callable[[], object]],
    clock: Clock,
    prepared: Mapping[str, _Prepared],
    samples: dict[str, list[float]],
) -> None:
    """Append one sample (seconds per call) to each variant's list, in `fns` order."""
    for name, fn in fns.items():
        number = prepared[name].number
        with _attributed(name, "sampling"):
            samples[name].append(clock.time(fn, number) / number)


def _stop_reason(
    samples: Mapping[str, list[float]],
    *,
    min_samples: int,
    max_samples: int,
    target_rel_iqr: float,
    budget_spent: Callable[[], bool],
) -> StopReason | None:
    """Why sampling should stop now, or None to take another round."""
    rounds = len(next(iter(samples.values())))
    if rounds < min_samples:
        return None
    if _converged(samples, target_rel_iqr):
        return StopReason.TARGET_REACHED
    if rounds >= max_samples:
        return StopReason.MAX_SAMPLES
    if budget_spent():
        return StopReason.TIME_BUDGET
    return None


def _converged(samples: Mapping[str, list[float]], target_rel_iqr: float) -> bool:
    """Whether every variant's IQR/median is at or below the target."""
    return all(stats.iqr(s) / stats.median(s) <= target_rel_iqr for s in samples.values())


def _check_sampling_args(
    fns: Mapping[str, Callable[[], object]],
    warmup: int,
    min_samples: int,
    max_samples: int,
    time_budget_s: float,
    target_rel_iqr: float,
    min_sample_time: float,
) -> None:
    """ValueError naming the first argument of `measure_interleaved` that is out of range."""
    if not fns:
        raise ValueError("fns: expected at least one variant; got an empty mapping")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected an integer >= 0 calls; got {warmup!r}")
    if not isinstance(min_samples, int) or min_samples < 1:
        raise ValueError(f"min_samples: expected an integer >= 1; got {min_samples!r}")
    if not isinstance(max_samples, int) or max_samples < min_samples:
        raise ValueError(
            f"max_samples: expected an integer >= min_samples ({min_samples}); got {max_samples!r}"
        )
    if not (math.isfinite(time_budget_s) and time_budget_s > 0.0):
        raise ValueError(f"time_budget_s: expected finite seconds > 0; got {time_budget_s!r}")
    if not target_rel_iqr >= 0.0:
        raise ValueError(f"target_rel_iqr: expected a fraction >= 0; got {target_rel_iqr!r}")
    _check_min_sample_time(min_sample_time)


def measure_interleaved(
    fns: Mapping[str, Callable[[], object]],
    clock: Clock,
    *,
    finding: str,
    case: str,
    warmup: int = 2,
    min_samples: int = 10,
    max_samples: int = 200,
    time_budget_s: float = 10.0,
    target_rel_iqr: float = 0.05,
    min_sample_time: float = 1e-3,
    now: Callable[[], float] = time.perf_counter,
) -> dict[str, Measurement]:
    """Time every variant in `fns` (name -> zero-argument callable), interleaved.

    Each variant in turn: its first call is timed alone, `warmup` more calls run, and
    its calls per sample are calibrated to `min_sample_time`. Then rounds of one sample
    per variant, in `fns` order (A B C A B C ...), run until after `min_samples` rounds
    either every variant's IQR/median <= `target_rel_iqr`, or `max_samples` rounds are
    done, or `time_budget_s` seconds (read from `now`, counted from entry, warm-up and
    calibration included) are spent. `min_samples` rounds are always taken.

    Returns name -> Measurement, keyed by `finding`, `case`, the clock's device and
    the torch thread count in effect. A raising variant stops everything with a
    `VariantError` naming it, chained `from` the original exception.
    """
    _check_sampling_args(
        fns, warmup, min_samples, max_samples, time_budget_s, target_rel_iqr, min_sample_time
    )
    started = now()
    prepared = {
        name: _prepare(name, fn, clock, warmup, min_sample_time) for name, fn in fns.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in fns}
    stopped_by = None
    while stopped_by is None:
        _sample_round(fns, clock, prepared, samples)
        stopped_by = _stop_reason(
            samples,
            min_samples=min_samples,
            max_samples=max_samples,
            target_rel_iqr=target_rel_iqr,
            budget_spent=lambda: now() - started >= time_budget_s,
        )
    threads = torch.get_num_threads()
    return {
        name: Measurement(
            key=MeasurementKey(finding, case, name, str(clock.device), threads),
            samples=tuple(samples[name]),
            number_per_sample=prepared[name].number,
            first_call_seconds=prepared[name].first_call_seconds,
            warmup_calls=warmup,
            warmup_seconds=prepared[name].warmup_seconds,
            stopped_by=stopped_by,
        )
        for name in fns
    }
