"""Timing: clocks, thread pinning, calibration, and interleaved sampling into Measurements.

A `Clock` times `number` back-to-back calls of a function and returns total seconds;
`make_clock` picks the device-correct one at run time (CUDA events on a GPU,
`time.perf_counter_ns` on the CPU). `measure_interleaved` warms each variant up,
calibrates how many calls make one sample, then samples the variants in rounds, one
sample of each per round in a shuffled order, so drift in the machine's state hits all
of them alike and round k of two variants pairs up (`harness.measure.estimate`); each
variant stops once its word is decided (`Sampling`). It returns one frozen
`Measurement` per variant; statistics are derived from its samples.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from harness.measure import stats
from harness.measure.decision import DEFAULT_MARGIN, Looks, check_fraction, decide
from harness.measure.estimate import PairedEstimate, rounds_estimate
from harness.measure.numbers import is_whole

__all__ = [
    "SETTLE_UNDER_S",
    "Clock",
    "CpuClock",
    "CudaEventClock",
    "CudaUnavailableError",
    "Measurement",
    "MeasurementKey",
    "Sampling",
    "StopReason",
    "VariantError",
    "calibrate",
    "make_clock",
    "measure_interleaved",
    "pinned_threads",
    "settling_calls",
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


class _AfterImport:
    """A `sys.meta_path` finder that calls `then(module)` once the module `name` has been
    imported for the first time (the import itself is the other finders')."""

    def __init__(self, name: str, then: Callable[[object], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                run, then = spec.loader.exec_module, self.then
                spec.loader.exec_module = lambda module: (run(module), then(module))
                return spec
        return None


_INDUCTOR_CONFIG = "torch._inductor.config"
#: the thread counts of the `_inductor_threads` bodies open while torch._inductor.config
#: is not imported yet, innermost last: the one its import takes
_WANTED_INDUCTOR_THREADS: list[int] = []


def _take_wanted_threads(config) -> None:
    if _WANTED_INDUCTOR_THREADS:
        config.cpp.threads = _WANTED_INDUCTOR_THREADS[-1]


#: one finder for every open body (two that each searched the others recursed forever)
_CONFIG_IMPORTED = _AfterImport(_INDUCTOR_CONFIG, _take_wanted_threads)


@contextlib.contextmanager
def _inductor_threads(n: int) -> Iterator[None]:
    """torch.compile's CPU kernels built inside the body are built for `n` threads
    (inductor's `cpp.threads`), whatever torch's thread count meanwhile: inductor writes
    the count in effect into its C++ (`num_threads(k)`), so a variant first called while
    the run's processes share the cores, one thread each, ran serial kernels when timed
    at two. Set, and restored after (to the enclosing body's count, else inductor's
    default), whether torch._inductor.config is imported before the body or inside it
    (not imported here: a second and a half); bodies nest."""
    config = sys.modules.get(_INDUCTOR_CONFIG)
    if config is not None:
        previous = config.cpp.threads
        config.cpp.threads = n
        try:
            yield
        finally:
            config.cpp.threads = previous
        return
    _WANTED_INDUCTOR_THREADS.append(n)
    if _CONFIG_IMPORTED not in sys.meta_path:
        sys.meta_path.insert(0, _CONFIG_IMPORTED)
    try:
        yield
    finally:
        _WANTED_INDUCTOR_THREADS.pop()
        if not _WANTED_INDUCTOR_THREADS and _CONFIG_IMPORTED in sys.meta_path:
            sys.meta_path.remove(_CONFIG_IMPORTED)
        config = sys.modules.get(_INDUCTOR_CONFIG)
        if config is not None and getattr(config, "cpp", None) is not None:
            config.cpp.threads = (_WANTED_INDUCTOR_THREADS[-1] if _WANTED_INDUCTOR_THREADS
                                  else -1)


@contextlib.contextmanager
def pinned_threads(n: int, compile_for: int | None = None) -> Iterator[int]:
    """Run the body with `torch.set_num_threads(n)` and torch.compile compiling in this
    process; restore both after. `compile_for`: the threads the calls will be timed at,
    where they differ from `n` (first calls made while processes share the cores): the
    kernels torch.compile builds in the body are built for those (`_inductor_threads`;
    without it, for `n`, set alike). Set either way, inductor's setting is one key of its
    disk cache: a graph first compiled at 1 thread for 2 and traced again at 2 (dynamo
    guards on the thread count) then loads that code, where it had compiled it again
    (4.4 s against 0.5 s for a scan graph of 4 x 25 steps here).

    Inductor otherwise compiles in a pool of worker processes that start (and import
    torch) in the background, taking a core from the timings of the next cases on a
    small machine. Yields the thread count in effect, to record with the measurements.
    """
    for name, value in (("n", n), ("compile_for", n if compile_for is None else compile_for)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1 threads; got {value!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with _compiling_in_process(), _inductor_threads(n if compile_for is None else compile_for):
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
    """Why sampling of a variant stopped."""

    DECIDED = "decided"
    """Its word against the baseline (faster, slower or same at the margin) was decided,
    and its interval is within `Sampling.precision`."""
    PRECISION_REACHED = "precision_reached"
    """Older runs only: the ratio's interval reached the precision target."""
    MAX_SAMPLES = "max_samples"
    """The round cap was reached first."""
    TIME_BUDGET = "time_budget"
    """The sampling budget was spent first."""


@dataclass(frozen=True)
class Sampling:
    """How the variants of one cell are sampled and when each one stops.

    Rounds, not samples: round k times every variant still sampling once, in an order
    shuffled per round from `seed` (recorded in each `Measurement.positions`), with the
    garbage collector off inside each timed sample. With `sequential`, each variant's
    ratio to the reference is checked at the rounds of `looks()` and the variant stops
    as soon as its word is decided there (`harness.measure.decision`) and its interval is
    within +-`precision`, each check at the level the looks' correction gives; without
    it, every variant runs to the budget or the round cap and is judged once.
    """

    time_budget_s: float = 10.0
    """Seconds of sampling per cell: the rounds only (first calls, warm-up and
    calibration are reported apart and bounded by `warmup_budget_s`)."""
    min_rounds: int = 8
    """Rounds always taken (and the first check)."""
    max_rounds: int = 200
    """The most rounds."""
    warmup: int = 2
    """Calls after the first and before calibration."""
    warmup_budget_s: float = 0.1
    """Warm-up stops after its first call once its calls have taken this long."""
    min_sample_time: float | None = 1e-3
    """Seconds one sample lasts at least (calls per sample are calibrated to it); None:
    one call per sample, uncalibrated."""
    sequential: bool = True
    """Stop each variant once its word is decided (False: sample the whole budget)."""
    margin: float = DEFAULT_MARGIN
    """The practical margin of the words (`harness.measure.decision`)."""
    precision: float = 0.03
    """A decided variant stops once its ratio's interval half-width is also at most this
    fraction of the ratio (a word alone can rest on an interval like [4x, 37x])."""
    seed: int = 0
    """Seeds the order of the variants in each round."""
    paired: bool = False
    """Round k of every variant does the same work (stateful calls, e.g. training
    iterations): the variants stop together, once every word is decided."""

    def __post_init__(self) -> None:
        if not (isinstance(self.time_budget_s, (int, float)) and math.isfinite(self.time_budget_s)
                and self.time_budget_s > 0):
            raise ValueError(f"Sampling.time_budget_s: expected finite seconds > 0; got "
                             f"{self.time_budget_s!r}")
        if not is_whole(self.min_rounds) or self.min_rounds < 2:
            raise ValueError(f"Sampling.min_rounds: expected an integer >= 2; got "
                             f"{self.min_rounds!r}")
        if not isinstance(self.max_rounds, int) or self.max_rounds < self.min_rounds:
            raise ValueError(f"Sampling.max_rounds: expected an integer >= min_rounds "
                             f"({self.min_rounds}); got {self.max_rounds!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"Sampling.warmup: expected an integer >= 0 calls; got "
                             f"{self.warmup!r}")
        if self.min_sample_time is not None:
            _check_min_sample_time(self.min_sample_time)
        check_fraction(self.margin, "Sampling.margin")
        if not (math.isfinite(self.precision) and 0.0 <= self.precision < 1.0):
            raise ValueError(f"Sampling.precision: expected a fraction in [0, 1); got "
                             f"{self.precision!r}")

    def looks(self) -> Looks:
        """Where the words are checked, and at which level."""
        return Looks(first=self.min_rounds, last=self.max_rounds, sequential=self.sequential)

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
    """Why sampling of this variant stopped (a variant whose word is decided stops
    before the others)."""
    precision_reached: float | None = None
    """The relative half-width of this variant's ratio interval at its last check
    (0.03 = +-3%; the reference: the widest of the cell's); None when never checked."""
    positions: tuple[int, ...] = ()
    """Where in each round's shuffled order this variant's sample was taken (0: first)."""
    call_overhead_s: float = 0.0
    """Seconds per call the timing loop itself costs: the median over the rounds of an
    empty function's timing, each already removed from its round's `samples`."""
    confidence: float = 0.95
    """The level of each check of the words (1 - 0.05 / looks)."""
    looks: int = 1
    """How many checks the sampling schedule held (`harness.measure.decision.Looks`)."""

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
    call_seconds: float
    """One call's seconds: the last warm-up call's, else the first call's."""


def _prepare(name: str, fn: Callable[[], object], clock: Clock, sampling: Sampling) -> _Prepared:
    """Time the first call apart, warm up, then calibrate.

    Warm-up runs `sampling.warmup` more calls, but stops after the first once they have
    taken `warmup_budget_s` (a call of seconds needs no second warm-up call). A warm-up
    call that alone lasts `min_sample_time` settles the calibration at one call per
    sample without another call. With `min_sample_time` None: one call per sample.
    """
    with _attributed(name, "first call"):
        first = clock.time(fn, 1)
    calls, warm, last = 0, 0.0, None
    with _attributed(name, "warm-up"):
        while calls < sampling.warmup and (calls == 0 or warm < sampling.warmup_budget_s):
            last = clock.time(fn, 1)
            warm, calls = warm + last, calls + 1
    number = 1
    target = sampling.min_sample_time
    if target is not None and (last is None or last < target):
        with _attributed(name, "calibration"):
            number = calibrate(fn, clock, min_sample_time=target)
    return _Prepared(first_call_seconds=first, warmup_calls=calls, warmup_seconds=warm,
                     number=number, call_seconds=first if last is None else last)


#: A sample of one call this long or longer follows no untimed call: what a switch leaves
#: to pay (measured on the 2-core CPU: 75-190 us more on the first call of 0.5-4 ms calls)
#: is then within about 2% of it, and an untimed call would double a long cell's seconds.
SETTLE_UNDER_S = 10e-3


def settling_calls(number: int, call_seconds: float, *, paired: bool) -> int:
    """Untimed calls of a variant right before each of its samples of `number` calls of
    about `call_seconds` each: as many as the sample has (what another variant's code
    left in the caches, the allocator and the branch predictors is paid over tens of
    calls, not by the first alone), one before a sample of one call shorter than
    SETTLE_UNDER_S, none for a paired cell (its calls advance state)."""
    if paired:
        return 0
    if number > 1:
        return number
    return int(call_seconds < SETTLE_UNDER_S)


def _empty() -> None:
    """The call whose cost is the timing loop's own (a loop step and a Python call)."""


#: a sample never drops below this share of its raw time when the loop's cost is removed
OVERHEAD_FLOOR = 0.05


def _timed(clock: Clock, fn: Callable[[], object], number: int) -> float:
    """Seconds per call of `number` calls of `fn`, the loop's own cost included, with the
    garbage collector off while they run (a collection belongs to no variant in
    particular)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return clock.time(fn, number) / number
    finally:
        if enabled:
            gc.enable()


def _net(raw: float, overhead: float) -> float:
    """A sample's seconds per call less the loop's own cost per call (`overhead`), never
    below OVERHEAD_FLOOR of it."""
    return max(raw - overhead, OVERHEAD_FLOOR * raw)


class _StopRule:
    """Decides after each round which variants go on sampling, and why each stopped.

    `active` lists the variants the next round samples; `stopped` says why each other
    one stopped; `widths` holds each variant's relative interval half-width at its last
    check (the reference: the widest of the cell)."""

    def __init__(self, names: Sequence[str], reference: str, sampling: Sampling,
                 budget_spent: Callable[[], bool]) -> None:
        self.sampling, self.looks = sampling, sampling.looks()
        self.budget_spent = budget_spent
        self.reference = reference
        self.active = list(names)
        self.stopped: dict[str, StopReason] = {}
        self.widths: dict[str, float] = {}
        self.checks = 0

    def __call__(self, samples: Mapping[str, list[float]]) -> bool:
        """Whether sampling ends after the round just taken."""
        rounds = len(samples[self.reference])
        if rounds < self.sampling.min_rounds:
            return False
        budget_spent = self.budget_spent()
        last = rounds >= self.sampling.max_rounds or budget_spent
        if self.sampling.sequential and (self.looks.due(rounds) or last):
            self.checks += 1
            if self._settle(samples):
                return True
        if rounds >= self.sampling.max_rounds:
            return self._stop_all(StopReason.MAX_SAMPLES)
        if budget_spent:
            return self._stop_all(StopReason.TIME_BUDGET)
        return False

    def estimate(self, samples: Mapping[str, Sequence[float]], name: str) -> PairedEstimate:
        """`name`'s ratio to the reference over the rounds `name` was sampled in."""
        own = samples[name]
        return rounds_estimate(own, samples[self.reference][:len(own)])

    def _settle(self, samples: Mapping[str, list[float]]) -> bool:
        """Check every open word; stop those decided (all at once when paired). True when
        none is left open."""
        others = [n for n in self.active if n != self.reference]
        if not others:  # one variant: nothing to decide, it samples its budget
            return False
        level, margin = self.looks.confidence, self.sampling.margin
        done = []
        for name in others:
            estimate = self.estimate(samples, name)
            low, high = estimate.interval(level)
            self.widths[name] = (high - low) / 2.0 / estimate.ratio
            if decide(low, high, margin).decisive and self.widths[name] <= self.sampling.precision:
                done.append((name, StopReason.DECIDED))
        self.widths[self.reference] = max(self.widths[n] for n in others)
        if self.sampling.paired and len(done) < len(others):
            return False
        for name, reason in done:
            self.stopped[name] = reason
            self.active.remove(name)
        if self.active == [self.reference]:  # every other one settled
            return self._stop_all(StopReason.DECIDED)
        return False

    def _stop_all(self, reason: StopReason) -> bool:
        for name in self.active:
            self.stopped[name] = reason
        self.active = []
        return True


def measure_interleaved(
    fns: Mapping[str, Callable[[], object]],
    clock: Clock,
    *,
    finding: str,
    case: str,
    sampling: Sampling = Sampling(),
    reference: str | None = None,
    after_sample: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.perf_counter,
) -> dict[str, Measurement]:
    """Time every variant in `fns` (name -> zero-argument callable) in shuffled rounds.

    Each variant in turn: its first call is timed alone, warm-up calls run, and its calls
    per sample are calibrated (`Sampling`). Then rounds of one
    sample per variant still sampling, in an order shuffled per round, until every
    variant has stopped (`Sampling`: decided, precise enough, the round cap or the
    budget, which counts sampling seconds, untimed calls included). Each round also times
    the loop's own cost (an empty function, at a place of its own in the shuffled order,
    at the most calls per sample of any variant) and takes it from that round's samples:
    a cost timed once, at the start, is taken from every sample at the machine's speed of
    that moment (on the 2-core CPU, calls of 30-130 ns ran at two speeds, switching within
    a second; five timings of the empty call at a process's start read 74 ns a call where
    their median over its rounds read 35 ns, and a 64-ns call's sample would have kept
    none of its own cost). Each sample follows
    untimed calls of its own variant (`settling_calls`: as many as it has; one before a
    sample of one call under SETTLE_UNDER_S; none in a paired cell, whose calls advance
    state): the calls after another variant's code pay for the caches, allocator and
    branch state it left, over tens of calls (on the 2-core CPU, a torch.compile'd GAE's
    calls after a switch took 4.7, 1.6, 1.3, 1.2 and 1.1 times a steady call, and after
    one untimed call its samples of 32 calls read 7-11% slower than
    `torch.utils.benchmark`'s back-to-back blocks), so a sample is the steady per-call
    cost, whichever variants share the cell. The untimed calls go through the clock, so
    that a device's stream is idle when the sample starts. Ratios are taken against
    `reference` (default: the first variant), which samples while any other does.

    `after_sample(name)`, when given, runs after each sample of `name`, outside the
    clock (to read what that call did). Returns name -> Measurement, keyed by `finding`,
    `case`, the clock's device and the torch thread count in effect. A raising variant
    stops everything with a `VariantError` naming it, chained `from` the original.
    """
    if not fns:
        raise ValueError("fns: expected at least one variant; got an empty mapping")
    names = list(fns)
    reference = reference if reference in fns else names[0]
    prepared = {name: _prepare(name, fn, clock, sampling) for name, fn in fns.items()}
    loop_number = max(p.number for p in prepared.values())
    overheads: list[float] = []  # the loop's cost per call, one per round
    settling = {name: settling_calls(p.number, p.call_seconds, paired=sampling.paired)
                for name, p in prepared.items()}
    samples: dict[str, list[float]] = {name: [] for name in names}
    positions: dict[str, list[int]] = {name: [] for name in names}
    order_rng = np.random.default_rng(sampling.seed)
    loop_rng = np.random.default_rng([sampling.seed, 1])  # the orders stay the seed's
    started = now()
    rule = _StopRule(names, reference, sampling,
                     budget_spent=lambda: now() - started >= sampling.time_budget_s)
    done = False
    while not done:
        order = [rule.active[i] for i in order_rng.permutation(len(rule.active))]
        loop_at = int(loop_rng.integers(len(order) + 1))
        raw: dict[str, float] = {}
        for position, name in enumerate([*order, None]):
            if position == loop_at:
                overheads.append(_timed(clock, _empty, loop_number))
            if name is None:
                break
            number = prepared[name].number
            with _attributed(name, "sampling"):
                if settling[name]:  # the switch is not billed to the sample
                    clock.time(fns[name], settling[name])  # through the clock: a device idles
                raw[name] = _timed(clock, fns[name], number)
                positions[name].append(position)
                if after_sample is not None:  # outside the clock
                    after_sample(name)
        for name, seconds in raw.items():
            samples[name].append(_net(seconds, overheads[-1]))
        done = rule(samples)
    threads = torch.get_num_threads()
    looks = rule.looks
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
            positions=tuple(positions[name]),
            call_overhead_s=float(np.median(overheads)),
            confidence=looks.confidence,
            looks=looks.count,
        )
        for name in names
    }
