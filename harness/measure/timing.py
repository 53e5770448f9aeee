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
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.measure import stats

__all__ = [
    "Clock",
    "CpuClock",
    "CudaEventClock",
    "CudaUnavailableError",
    "Measurement",
    "MeasurementKey",
    "Precision",
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


#: read by torch._inductor.config when it is imported: how many processes compile
COMPILE_THREADS_VARIABLE = "TORCHINDUCTOR_COMPILE_THREADS"


@contextlib.contextmanager
def _compiling_in_process() -> Iterator[None]:
    """torch.compile compiles in this process inside the body (inductor's compile_threads = 1).

    Importing torch._inductor takes about a second, so it is not imported here: if it is
    loaded already its setting is changed and restored; if not, the environment variable
    it reads at import is set for the body (a compile that imports it inside keeps 1 for
    the rest of the process, which is what a measuring process wants).
    """
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        previous = config.compile_threads
        config.compile_threads = 1
        try:
            yield
        finally:
            config.compile_threads = previous
        return
    previous_variable = os.environ.get(COMPILE_THREADS_VARIABLE)
    os.environ[COMPILE_THREADS_VARIABLE] = "1"
    try:
        yield
    finally:
        if previous_variable is None:
            del os.environ[COMPILE_THREADS_VARIABLE]
        else:
            os.environ[COMPILE_THREADS_VARIABLE] = previous_variable


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
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with _compiling_in_process():
            yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


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

    PRECISION_REACHED = "precision_reached"
    """Every ratio's 95% interval became as tight as the `Precision` target."""
    TARGET_REACHED = "target_reached"
    """Every variant's IQR/median fell to the target (without a `Precision`)."""
    MAX_SAMPLES = "max_samples"
    """The sample cap was reached first."""
    TIME_BUDGET = "time_budget"
    """The time budget was spent first."""


@dataclass(frozen=True)
class Precision:
    """Adaptive sampling: stop sampling each variant as soon as its answer is known to
    +-`target`, and the cell once every answer is.

    The answer of a cell is each variant's time ratio to `reference`; it is known to
    +-`target` when the half-width of its 95% bootstrap interval (the one the results
    report, `stats.bootstrap_ratio_ci`) is at most `target` times the ratio. A variant
    whose ratio is known leaves the rounds (it is *settled*); the reference keeps
    sampling while any other is open, and a settled variant's interval is taken against
    the reference's samples of the rounds it was in. A cell with one variant asks the
    same of that variant's median. Intervals are checked after `min_rounds` rounds and
    then every quarter more rounds (their cost stays a small part of the sampling), so a
    lucky streak of a few similar samples cannot end sampling.
    """

    target: float = 0.03
    """Relative half-width of every interval at which sampling stops; 0: never early."""
    reference: str | None = None
    """The variant ratios are taken against; None: the first variant sampled."""
    min_rounds: int = 8
    """Rounds always taken before the first check."""
    seed: int = 0
    """Seed of the bootstrap (the same seed gives the same decision)."""
    paired: bool = False
    """Round k of every variant did the same work: intervals of per-round ratios
    (`stats.paired_ratio_ci`) instead of two independent sets of samples; variants
    settle together, so that every one makes the same calls."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target) and self.target >= 0.0):
            raise ValueError(f"Precision.target: expected a fraction >= 0; got {self.target!r}")
        if not isinstance(self.min_rounds, int) or self.min_rounds < 2:
            raise ValueError(
                f"Precision.min_rounds: expected an integer >= 2; got {self.min_rounds!r}")

    def reference_of(self, names: Sequence[str]) -> str:
        """The variant the ratios are taken against, among `names`."""
        return self.reference if self.reference in names else names[0]

    def widths(self, samples: Mapping[str, Sequence[float]],
               names: Sequence[str] | None = None) -> dict[str, float]:
        """Relative half-width of each of `names`' interval now (default: every variant
        but the reference; the reference itself when it is alone)."""
        reference = self.reference_of(list(samples))
        if names is None:
            names = [n for n in samples if n != reference] or [reference]
        widths = {}
        for name in names:
            if name == reference:  # one variant: how well its median is known
                ci = stats.bootstrap_median_ci(samples[name], seed=self.seed)
            else:
                interval = stats.paired_ratio_ci if self.paired else stats.bootstrap_ratio_ci
                own = samples[name]
                ci = interval(own, samples[reference][:len(own)], seed=self.seed)
            widths[name] = stats.relative_halfwidth(ci)
        return widths


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
    """Why sampling of this variant stopped (with a `Precision`, a variant whose ratio
    was known stops before the others)."""
    precision_reached: float | None = None
    """With adaptive sampling: the relative 95% interval half-width of this variant's
    ratio at its last check (0.03 = +-3%; the reference: the widest of the cell's);
    None without it."""

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
    warmup_calls: int
    warmup_seconds: float
    number: int


def _prepare(
    name: str, fn: Callable[[], object], clock: Clock, warmup: int,
    min_sample_time: float | None, warmup_budget_s: float,
) -> _Prepared:
    """Time the first call apart, warm up, then calibrate.

    Warm-up runs `warmup` more calls, but stops after the first once they have taken
    `warmup_budget_s` (a call of seconds needs no second warm-up call). A warm-up call
    that alone lasts `min_sample_time` settles the calibration at one call per sample
    without another call. With `min_sample_time` None: one call per sample, no
    calibration.
    """
    with _attributed(name, "first call"):
        first = clock.time(fn, 1)
    calls, warm, last = 0, 0.0, None
    with _attributed(name, "warm-up"):
        while calls < warmup and (calls == 0 or warm < warmup_budget_s):
            last = clock.time(fn, 1)
            warm, calls = warm + last, calls + 1
    number = 1
    if min_sample_time is not None and (last is None or last < min_sample_time):
        with _attributed(name, "calibration"):
            number = calibrate(fn, clock, min_sample_time=min_sample_time)
    return _Prepared(first_call_seconds=first, warmup_calls=calls, warmup_seconds=warm,
                     number=number)


def _sample_round(
    fns: Mapping[str, Callable[[], object]],
    clock: Clock,
    prepared: Mapping[str, _Prepared],
    samples: dict[str, list[float]],
    after_sample: Callable[[str], None] | None,
    reverse: bool = False,
) -> None:
    """Append one sample (seconds per call) to each variant's list, in `fns` order (or
    the reverse order)."""
    for name, fn in (reversed(fns.items()) if reverse else fns.items()):
        number = prepared[name].number
        with _attributed(name, "sampling"):
            samples[name].append(clock.time(fn, number) / number)
            if after_sample is not None:  # outside the clock
                after_sample(name)


class _StopRule:
    """Decides after each round which variants go on sampling, and why each stopped (see
    measure_interleaved and Precision).

    `active` lists the variants the next round samples; `stopped` says why each other
    one stopped; `widths` holds each variant's interval half-width at its last check
    (the reference: the widest of the cell)."""

    def __init__(self, names: Sequence[str], *, min_samples: int, max_samples: int,
                 target_rel_iqr: float, precision: Precision | None,
                 budget_spent: Callable[[], bool]) -> None:
        self.min_samples, self.max_samples = min_samples, max_samples
        self.target_rel_iqr, self.precision = target_rel_iqr, precision
        self.budget_spent = budget_spent
        self.reference = precision.reference_of(names) if precision else names[0]
        self.active = list(names)
        self.stopped: dict[str, StopReason] = {}
        self.widths: dict[str, float] = {}
        self.first_check = max(min_samples, precision.min_rounds) if precision else min_samples
        self.next_check = self.first_check

    def __call__(self, samples: Mapping[str, list[float]]) -> bool:
        """Whether sampling ends after the round just taken."""
        rounds = len(samples[self.reference])
        if rounds < self.min_samples:
            return False
        budget_spent = self.budget_spent()
        if self.precision is None:
            if _converged(samples, self.target_rel_iqr):
                return self._stop_all(StopReason.TARGET_REACHED)
        elif self.precision.target > 0 and (rounds >= self.next_check
                                            or rounds >= self.max_samples or budget_spent):
            self.next_check = rounds + max(1, rounds // 4)
            if self._settle(samples, ready=rounds >= self.first_check):
                return True
        if rounds >= self.max_samples:
            return self._stop_all(StopReason.MAX_SAMPLES)
        if budget_spent:
            return self._stop_all(StopReason.TIME_BUDGET)
        return False

    def _settle(self, samples: Mapping[str, list[float]], ready: bool) -> bool:
        """Check the open intervals; with `ready`, settle those within the target (all
        at once when paired). True when none is left open."""
        others = [n for n in self.active if n != self.reference]
        alone = not others  # one variant: its own median is the answer
        if alone:
            others = [self.reference]
        self.widths.update(self.precision.widths(samples, others))
        if not alone:
            self.widths[self.reference] = max(w for n, w in self.widths.items()
                                              if n != self.reference)
        if not ready:
            return False
        known = [n for n in others if self.widths[n] <= self.precision.target]
        if self.precision.paired and len(known) < len(others):
            return False
        for name in known:
            self.stopped[name] = StopReason.PRECISION_REACHED
            self.active.remove(name)
        if not alone and self.active == [self.reference]:  # every other one settled
            return self._stop_all(StopReason.PRECISION_REACHED)
        return not self.active

    def _stop_all(self, reason: StopReason) -> bool:
        for name in self.active:
            self.stopped[name] = reason
        self.active = []
        return True


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
    if min_sample_time is not None:
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
    precision: Precision | None = None,
    min_sample_time: float | None = 1e-3,
    warmup_budget_s: float = 0.1,
    after_sample: Callable[[str], None] | None = None,
    alternate: bool = False,
    now: Callable[[], float] = time.perf_counter,
) -> dict[str, Measurement]:
    """Time every variant in `fns` (name -> zero-argument callable), interleaved.

    Each variant in turn: its first call is timed alone, up to `warmup` more calls run
    (fewer once they have taken `warmup_budget_s`), and its calls per sample are
    calibrated to `min_sample_time`. Then rounds of one sample
    per variant, in `fns` order (A B C A B C ...), run until, after `min_samples` rounds,
    the answer is known (with a `precision`: every variant's time ratio to the reference
    within +-precision.target at 95%, each variant leaving the rounds as soon as its own
    is; without: every variant's IQR/median <= `target_rel_iqr`), or `max_samples`
    rounds are done, or `time_budget_s` seconds (read from `now`, counted from entry,
    warm-up and calibration included) are spent. `min_samples` rounds are always taken.

    `min_sample_time=None` takes one call per sample without calibrating, so that every
    variant makes the same calls in the same order (paired measurements of stateful
    work, e.g. training iterations). `after_sample(name)`, when given, runs after each
    sample of `name`, outside the clock (to read what that call did). `alternate` reverses
    the order every other round (A B, B A, ...), so that no variant always goes first.

    Returns name -> Measurement, keyed by `finding`, `case`, the clock's device and
    the torch thread count in effect; with a `precision`, each carries the interval
    half-width it reached (`precision_reached`). A raising variant stops everything
    with a `VariantError` naming it, chained `from` the original exception.
    """
    _check_sampling_args(
        fns, warmup, min_samples, max_samples, time_budget_s, target_rel_iqr, min_sample_time
    )
    started = now()
    prepared = {
        name: _prepare(name, fn, clock, warmup, min_sample_time, warmup_budget_s)
        for name, fn in fns.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in fns}
    rule = _StopRule(list(fns), min_samples=min_samples, max_samples=max_samples,
                     target_rel_iqr=target_rel_iqr, precision=precision,
                     budget_spent=lambda: now() - started >= time_budget_s)
    done = False
    while not done:
        rounds = len(samples[rule.reference])
        active = {name: fns[name] for name in rule.active}
        _sample_round(active, clock, prepared, samples, after_sample,
                      reverse=alternate and rounds % 2 == 1)
        done = rule(samples)
    threads = torch.get_num_threads()
    return {
        name: Measurement(
            key=MeasurementKey(finding, case, name, str(clock.device), threads),
            samples=tuple(samples[name]),
            number_per_sample=prepared[name].number,
            first_call_seconds=prepared[name].first_call_seconds,
            warmup_calls=prepared[name].warmup_calls,
            warmup_seconds=prepared[name].warmup_seconds,
            stopped_by=rule.stopped[name],
            precision_reached=rule.widths.get(name),
        )
        for name in fns
    }
