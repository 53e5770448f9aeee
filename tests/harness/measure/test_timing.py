"""Tests for harness.measure.timing, driven by a fake clock with known per-call costs.

Costs are powers of two so sums of them are exact in floating point and expected
samples can be compared with `==`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from harness.measure.decision import Looks, Word, decide
from harness.measure.estimate import rounds_estimate
from harness.measure import timing
from harness.measure.timing import (
    SETTLE_UNDER_S,
    CpuClock,
    CudaEventClock,
    CudaUnavailableError,
    Measurement,
    MeasurementKey,
    Sampling,
    StopReason,
    VariantError,
    calibrate,
    make_clock,
    measure_interleaved,
    pinned_threads,
    settling_calls,
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


def measure(fns, clock, reference=None, **sampling):
    """measure_interleaved on the fake clock's time, with `Sampling(**sampling)`."""
    sampling.setdefault("min_sample_time", MS)
    return measure_interleaved(fns, clock, finding="F1", case="small", reference=reference,
                               sampling=Sampling(**sampling), now=lambda: clock.now)


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


_BUILT_FOR = """
import re, sys, torch
from harness.measure.timing import pinned_threads
torch.set_num_threads(2)
if sys.argv[1] == "loaded":
    import torch._inductor.config
with pinned_threads(1, compile_for=2):
    assert torch.get_num_threads() == 1
    from torch._inductor.utils import run_and_get_code
    compiled = torch.compile(lambda x: (x * 2).sum(1))
    _, code = run_and_get_code(compiled, torch.randn(512, 4096))
print(sorted(set(re.findall(r"num_threads\\(\\d+\\)", "".join(code)))),
      torch._inductor.config.cpp.threads, torch.get_num_threads())
"""


@pytest.mark.slow  # two cold torch.compile runs: 10-20 s each
@pytest.mark.integration  # fresh interpreters: inductor not yet imported, and imported
@pytest.mark.parametrize("inductor", [pytest.param("loaded", marks=pytest.mark.long),
                                      "not yet imported"])
def test_kernels_compiled_while_threads_are_pinned_are_built_for_the_timing_threads(
        inductor, tmp_path):
    """Inductor writes the thread count in effect into the C++ it builds
    (`num_threads(k)`): a variant first called while processes shared the cores (one
    thread each) ran serial kernels when timed at two. Built for `compile_for` threads,
    whether torch._inductor was imported before the body or inside it; inductor's own
    setting is back to following torch's thread count after."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _BUILT_FOR, inductor], capture_output=True, text=True,
        timeout=300, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["['num_threads(2)']", "-1", "2"], result.stdout


_NESTED = """
import json, sys, torch
from harness.measure.timing import pinned_threads
seen = []
with pinned_threads(2):  # a worker's whole life
    with pinned_threads(1, compile_for=2):  # a cell's first calls
        import torch._inductor.config as config  # first imported here
        seen.append(config.cpp.threads)
    seen.append(config.cpp.threads)  # the outer body's again
    with pinned_threads(1):  # imported now: set and restored directly
        seen.append(config.cpp.threads)
    seen.append(config.cpp.threads)
seen.append(config.cpp.threads)  # inductor's default: follow torch's count
print(json.dumps({"seen": seen, "finders": [type(f).__name__ for f in sys.meta_path]}))
"""


@pytest.mark.integration  # a fresh interpreter: torch._inductor not imported yet
def test_inductor_threads_nest_when_inductor_is_imported_inside_the_inner_body():
    """A worker pins its threads for its whole life and again, for the first calls,
    around each cell: inductor imported inside both bodies takes the inner count, gets
    the outer's back when the inner body ends and its default after both; the import
    finder is gone after."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _NESTED], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said["seen"] == [2, 2, 1, 2, -1]
    assert "_AfterImport" not in said["finders"]


_TRACED_AGAIN = """
import contextlib, json, sys, torch
import torch._dynamo.utils as dynamo
from harness.findings import Case, Finding, max_abs_difference
from harness.measure.timing import pinned_threads
from harness.runner import CaseRun, RunOptions

torch.set_num_threads(2)
doubled = torch.compile(lambda x: (x * 2).sum(1))
finding = Finding(
    id="TEST-compiled", title="t", claim="c", variants=("eager", "compiled"),
    baseline="eager", cases=[Case.of(n=256)],
    build=lambda case, device, seed: torch.randn(case["n"], 64),
    make_call=lambda variant, x: (lambda: (x * 2).sum(1)) if variant == "eager"
    else (lambda: doubled(x)),
    check=max_abs_difference, tolerance=1e-4)
frames = lambda: int(dynamo.counters["frames"]["total"])
cell = CaseRun(finding, Case.of(n=256), RunOptions(device=torch.device("cpu")))
with pinned_threads(1, compile_for=2):  # the cores shared while processes prepare
    cell.prepare()
prepared = frames()
# a worker process is pinned at its threads throughout; the run's own process is not
with pinned_threads(2) if sys.argv[1] == "pinned" else contextlib.nullcontext():
    cell.trace_at_timed_threads()
    traced = frames()
    cell._call("compiled")()  # the first timed call: nothing left to trace
print(json.dumps({"traced_at": cell.traced_at, "frames": [prepared, traced, frames()],
                  "cache": {k: v for k, v in dynamo.counters["inductor"].items()
                            if k.startswith("fxgraph_cache")}}))
"""


@pytest.mark.slow  # one cold torch.compile: 5-15 s
@pytest.mark.integration  # a fresh interpreter and an empty inductor cache
@pytest.mark.parametrize("threads", ["pinned", pytest.param("bare", marks=pytest.mark.long)])
def test_a_graph_traced_again_at_the_timing_threads_loads_its_code_and_is_traced_before_timing(
        tmp_path, threads):
    """Dynamo guards a graph on torch's thread count, so a variant first called while the
    processes share the cores (1 thread, compiled for 2) is traced again at the 2 it is
    timed at. That trace happens in `trace_at_timed_threads` (the cell's preparation,
    which the processes take at once), not in the first timed round (which they take in
    turn), and it loads what the first call compiled: one compile, one cache hit. So in
    the run's own process too, which no `pinned_threads` encloses ("bare"): there the
    trace compiled the graph again (inductor's cpp.threads is a key of its cache), 4 s of
    a cold run's first cell."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _TRACED_AGAIN, threads], capture_output=True, text=True,
        timeout=300, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said["traced_at"] == {"compiled": 1}
    prepared, traced, timed = said["frames"]
    assert traced == prepared + 1 and timed == traced
    assert said["cache"] == {"fxgraph_cache_miss": 1, "fxgraph_cache_hit": 1}


@pytest.mark.parametrize("n", [0, -2, 1.0])
def test_pinned_threads_rejects_bad_counts(n):
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match=r"n: expected an integer >= 1 threads; got"):
        with pinned_threads(n):
            pass
    assert torch.get_num_threads() == before


def test_pinned_threads_rejects_bad_compile_for():
    with pytest.raises(ValueError, match=r"compile_for: expected an integer >= 1 threads; got 0"):
        with pinned_threads(1, compile_for=0):
            pass


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
    result = measure(fns, clock, min_rounds=5, max_rounds=5, sequential=False)
    assert result["A"].samples == (MS / 4,) * 5
    assert result["A"].number_per_sample == 4
    assert result["B"].samples == (2 * MS,) * 5
    assert result["B"].number_per_sample == 1
    assert result["A"].key == MeasurementKey("F1", "small", "A", "cpu", torch.get_num_threads())


def rounds_of(log: list[str], prepared: int, numbers: dict[str, int]) -> list[list[str]]:
    """The order of the variants in each round, read from a clock's call log after the
    first `prepared` calls (each sample is `numbers[name]` calls in a row, after as many
    untimed calls of its own: these fake calls are all shorter than SETTLE_UNDER_S)."""
    order, rest = [], log[prepared:]
    while rest:
        name = rest[0]
        block = 2 * numbers[name]
        assert rest[:block] == [name] * block  # a sample and its settling calls are one block
        order.append(name)
        rest = rest[block:]
    size = len(numbers)
    return [order[i:i + size] for i in range(0, len(order), size)]


def test_rounds_time_every_variant_once_in_an_order_shuffled_from_the_seed():
    costs = {"A": MS / 2, "B": MS, "C": MS / 4}  # calibrates to 2, 1 and 4 calls
    logs = []
    for seed in (0, 0, 1):
        clock = FakeClock()
        fns = {name: clock.variant(name, constant(cost)) for name, cost in costs.items()}
        result = measure(fns, clock, warmup=1, min_rounds=12, max_rounds=12, sequential=False,
                         seed=seed)
        prepared = sum(1 + 1 + (2 * m.number_per_sample - 1 if m.number_per_sample > 1 else 0)
                       for m in result.values())
        rounds = rounds_of(clock.log, prepared, {n: m.number_per_sample for n, m in result.items()})
        assert len(rounds) == 12 and all(sorted(r) == ["A", "B", "C"] for r in rounds)
        for name, m in result.items():  # the recorded positions are the rounds' orders
            assert list(m.positions) == [r.index(name) for r in rounds]
        logs.append(rounds)
    assert logs[0] == logs[1]  # the same seed, the same orders
    assert logs[0] != logs[2]
    assert len({tuple(r) for r in logs[0]}) > 1  # the order changes from round to round
    assert {r[0] for r in logs[0]} == {"A", "B", "C"}  # no variant always goes first


def test_the_garbage_collector_is_off_inside_timed_samples_only():
    clock = FakeClock()
    seen = []

    def call():
        seen.append(gc.isenabled())
        clock.now += MS

    assert gc.isenabled()
    measure({"A": call}, clock, warmup=0, min_rounds=3, max_rounds=3, sequential=False)
    assert seen[0] is True  # the first call, timed alone, is not a sample
    assert seen[-6:] == [True, False] * 3  # each sample after its untimed settling call
    assert gc.isenabled()


class OverheadClock(FakeClock):
    """A fake clock whose loop costs `overhead` seconds per call, whatever the call."""

    def __init__(self, overhead: float) -> None:
        super().__init__()
        self.overhead = overhead

    def scale(self) -> float:
        """How many times its cost everything costs now."""
        return 1.0

    def time(self, fn, number):
        start = self.now
        for _ in range(number):
            self.now += self.overhead * self.scale()
            fn()
        return self.now - start


def test_the_loops_own_cost_is_measured_with_an_empty_call_and_removed():
    """A 40 ns loop step around calls of 60 and 100 ns: the samples are the calls' own
    costs, and the ratio is 0.6, not the 0.71 the loop's cost would bias it to."""
    loop = 2.0**-25  # ~30 ns, exact in binary
    clock = OverheadClock(loop)
    fns = {"slow": clock.variant("slow", constant(4 * loop)),
           "fast": clock.variant("fast", constant(2 * loop))}
    result = measure(fns, clock, min_rounds=4, max_rounds=4, sequential=False,
                     min_sample_time=2.0**-12)
    assert result["slow"].call_overhead_s == loop
    assert result["slow"].samples == (4 * loop,) * 4
    assert result["fast"].samples == (2 * loop,) * 4


class TransientClock(OverheadClock):
    """An `OverheadClock` where everything, the loop's own step included, costs twice as
    much for `window` seconds from the first timing of the empty call (measured on the
    2-core CPU: 30-ns calls ran at two speeds, switching within a second; an empty loop
    timed five times at a process's start read 74 ns a call where its median over the
    sampling was 35 ns)."""

    def __init__(self, overhead: float, window: float) -> None:
        super().__init__(overhead)
        self.window = window
        self.slow_from: float | None = None

    def scale(self) -> float:
        return 2.0 if self.slow_from is not None and \
            self.now < self.slow_from + self.window else 1.0

    def time(self, fn, number):
        if fn is timing._empty and self.slow_from is None:
            self.slow_from = self.now
        return super().time(fn, number)

    def variant(self, name, cost):
        def call() -> None:
            self.log.append(name)
            self.now += cost * self.scale()

        return call


def test_the_loops_own_cost_is_timed_in_each_round_beside_that_rounds_samples():
    """A slow spell that starts as the loop's cost is first timed: a cost timed once then,
    and taken from every later sample, would leave the 120 and 60 ns calls at 90 and 30 ns
    (a ratio of 0.33, not 0.5). Timed in every round and taken from that round's samples,
    a sample is its call's own cost at its round's speed: the rounds after the spell read
    exactly the calls' costs, and the medians do."""
    loop = 2.0**-25  # ~30 ns, exact in binary
    clock = TransientClock(loop, window=2e-3)  # a few rounds of about 0.4 ms
    fns = {"slow": clock.variant("slow", 4 * loop), "fast": clock.variant("fast", 2 * loop)}
    result = measure(fns, clock, min_rounds=20, max_rounds=20, sequential=False,
                     min_sample_time=2.0**-12)
    for name, cost in (("slow", 4 * loop), ("fast", 2 * loop)):
        samples = result[name].samples
        assert samples.count(cost) > len(samples) / 2, (name, samples)
        assert float(np.median(samples)) == cost
    assert result["slow"].call_overhead_s == loop  # the median over the rounds


class FadingSwitchClock(FakeClock):
    """A fake clock where the k-th call of a variant after another variant's call costs
    `penalty / k**2` more: what the other variant's code left in the caches, the allocator
    and the branch predictors is paid over several calls, not the first alone (measured
    on the 2-core CPU: a torch.compile'd GAE's calls after a switch at 4.7, 1.6, 1.3, 1.2,
    1.1 times a steady call)."""

    def __init__(self, penalty: float) -> None:
        super().__init__()
        self.penalty = penalty
        self.numbers: list[int] = []
        self.since_switch = 0

    def time(self, fn, number):
        if fn is not timing._empty:  # the loop's own cost, timed once a round, apart
            self.numbers.append(number)
        return super().time(fn, number)

    def variant(self, name, costs):
        def call() -> None:
            self.since_switch = (self.since_switch + 1
                                 if self.log and self.log[-1] == name else 1)
            self.now += self.penalty / self.since_switch**2
            self.log.append(name)
            self.now += next(costs)

        return call


def test_a_sample_is_not_billed_for_the_switch_from_another_variant():
    """Samples of 8 calls of 125 us, a switch costing 300 us spread over the calls after
    it: each sample follows as many untimed calls of its own variant, so it reads within
    2% of the steady cost (+1.7%) whichever variants share its cell (after one untimed
    call, as before, its 8 calls carried 162 us more: +16%). A 1-call sample of a 2 ms
    call follows one untimed call: the 300 us would be +15% of it; after one, 75 us."""
    eighth = MS / 8
    clock = FadingSwitchClock(penalty=2.4 * eighth)
    fns = {"slow": clock.variant("slow", constant(2 * MS)),
           "fast": clock.variant("fast", constant(eighth)),
           "other": clock.variant("other", constant(eighth))}
    result = measure(fns, clock, min_rounds=6, max_rounds=6, sequential=False)
    assert result["fast"].number_per_sample == 8 and result["slow"].number_per_sample == 1
    for name in ("fast", "other"):
        assert all(eighth < s < 1.02 * eighth for s in result[name].samples)
    # its sample is the call after its settling call (or later, where it also ended the
    # round before): at most a quarter of the switch's cost
    assert all(2 * MS < s <= (2 * MS + 2.4 * eighth / 4) * (1 + 1e-12)
               for s in result["slow"].samples)
    # the untimed calls go through the clock (a device's stream idles before the sample):
    # 6 rounds of (8, 8) twice and slow's (1, 1), every sample right after its settling
    rounds = clock.numbers[-6 * 6:]
    assert rounds.count(8) == 24 and rounds.count(1) == 12
    assert all(rounds[i] == rounds[i + 1] for i in range(0, len(rounds), 2))


@pytest.mark.parametrize("sampling, cost, settling", [
    ({"min_sample_time": None}, MS, 1),  # one call per sample, uncalibrated, short calls
    ({"min_sample_time": MS / 2}, MS, 1),  # a call long enough for a sample of its own
    ({"min_sample_time": MS / 2}, 2 * SETTLE_UNDER_S, 0),  # long enough to need no settling
    ({"min_sample_time": MS / 2, "paired": True}, MS / 4, 0),  # the calls advance state
])
def test_a_sample_of_one_call_settles_only_under_a_long_call_and_a_paired_cell_never(
        sampling, cost, settling):
    """Exactly the first call, the settling calls and the samples' calls."""
    clock = FakeClock()
    fns = {"A": clock.variant("A", constant(cost)), "B": clock.variant("B", constant(cost))}
    result = measure(fns, clock, warmup=0, min_rounds=3, max_rounds=3, sequential=False,
                     **sampling)
    for name in fns:
        number = result[name].number_per_sample
        calibrated = sampling["min_sample_time"] is not None
        calibration = 2 * number - 1 if calibrated else 0  # calibrate's doublings
        assert clock.log.count(name) == 1 + calibration + 3 * (number + settling)


def test_settling_calls():
    """As many as the sample's calls; one before a 1-call sample of a short call; none
    for a long call or a paired cell."""
    assert settling_calls(16, 60e-6, paired=False) == 16
    assert settling_calls(1, 2e-3, paired=False) == 1
    assert settling_calls(1, SETTLE_UNDER_S, paired=False) == 0
    assert settling_calls(16, 60e-6, paired=True) == 0
    assert settling_calls(1, 2e-3, paired=True) == 0


def test_first_call_and_warm_up_are_reported_apart_from_samples():
    clock = FakeClock()
    fns = {"A": clock.variant("A", constant(MS, first=0.5))}  # e.g. a compile on first call
    m = measure(fns, clock, warmup=3, min_rounds=4, max_rounds=4, sequential=False)["A"]
    assert m.first_call_seconds == 0.5
    assert (m.warmup_calls, m.warmup_seconds) == (3, 3 * MS)
    assert m.samples == (MS,) * 4


def test_the_budget_counts_sampling_seconds_only():
    """A 5 s first call (a compile) and a slow warm-up do not eat a 0.1 s budget; the
    samples' settling calls do (one untimed call before each 1-call sample)."""
    clock = FakeClock()
    fns = {"A": clock.variant("A", constant(MS, first=5.0)),
           "B": clock.variant("B", constant(MS))}
    result = measure(fns, clock, warmup=2, min_rounds=2, max_rounds=10_000,
                     time_budget_s=0.1, sequential=False)
    sampled = 2 * sum(sum(m.samples) * m.number_per_sample for m in result.values())
    assert result["A"].stopped_by is StopReason.TIME_BUDGET
    assert 0.1 <= sampled < 0.1 + 2 * 4 * MS  # the budget, and at most the round in progress


def test_stops_at_max_rounds_without_sequential_checks():
    clock = FakeClock()
    fns = {"A": clock.variant("A", lognormal(MS, 0.5, seed=1)),
           "B": clock.variant("B", lognormal(MS, 0.5, seed=2))}
    result = measure(fns, clock, min_rounds=5, max_rounds=40, time_budget_s=1e6,
                     sequential=False)
    assert {(m.n, m.stopped_by) for m in result.values()} == {(40, StopReason.MAX_SAMPLES)}
    assert result["B"].confidence == 0.95 and result["B"].looks == 1


def test_a_clearly_faster_variant_stops_once_its_word_is_decided():
    """4x faster under 5% noise: decided (and within +-3%) at an early look, long before
    the budget, checked at the corrected level of the looks."""
    clock = FakeClock()
    fns = {"loop": clock.variant("loop", lognormal(4 * MS, 0.05, seed=1)),
           "scan": clock.variant("scan", lognormal(MS, 0.05, seed=2))}
    result = measure(fns, clock, reference="loop", min_rounds=8, max_rounds=200,
                     time_budget_s=1e6)
    m = result["scan"]
    assert m.stopped_by is StopReason.DECIDED
    assert m.n in Looks(first=8, last=200).schedule and m.n <= 64
    assert m.confidence == pytest.approx(1 - 0.05 / Looks(first=8, last=200).count)
    estimate = rounds_estimate(m.samples, result["loop"].samples[:m.n])
    low, high = estimate.interval(m.confidence)
    assert decide(low, high) is Word.FASTER
    assert m.precision_reached == pytest.approx((high - low) / 2 / estimate.ratio)
    assert m.precision_reached <= 0.03


def test_a_noisy_pair_on_the_margin_runs_to_its_budget():
    """1.05x under 30% noise sits on the margin's edge: no look decides it, so the budget
    is spent (no lucky streak ends sampling)."""
    clock = FakeClock()
    fns = {"a": clock.variant("a", lognormal(MS, 0.3, seed=3)),
           "b": clock.variant("b", lognormal(1.05 * MS, 0.3, seed=4))}
    result = measure(fns, clock, warmup=0, min_rounds=5, max_rounds=10_000,
                     time_budget_s=0.2)
    assert result["b"].stopped_by is StopReason.TIME_BUDGET
    assert result["a"].stopped_by is StopReason.TIME_BUDGET


def test_each_variant_settles_on_its_own_and_stops_being_called():
    """A decided variant leaves the rounds while a noisy one goes on: its calls stop (the
    log shows none after it settled) and the reference samples on with the open one."""
    clock = FakeClock()
    fns = {"loop": clock.variant("loop", lognormal(4 * MS, 0.02, seed=6)),
           "fast": clock.variant("fast", lognormal(MS, 0.02, seed=7)),
           "noisy": clock.variant("noisy", lognormal(4.2 * MS, 0.4, seed=8))}
    result = measure(fns, clock, reference="loop", warmup=0, min_rounds=5,
                     max_rounds=10_000, time_budget_s=0.5)
    loop, fast, noisy = result["loop"], result["fast"], result["noisy"]
    assert fast.stopped_by is StopReason.DECIDED
    assert noisy.stopped_by is StopReason.TIME_BUDGET
    assert loop.stopped_by is StopReason.TIME_BUDGET
    assert 5 <= fast.n < noisy.n == loop.n
    sampled_fast = [name for name in clock.log if name == "fast"]
    prepared_calls = 1 + fast.warmup_calls
    settled = fast.n * settling_calls(fast.number_per_sample, MS, paired=False)
    assert (len(sampled_fast)
            == prepared_calls + calibration_calls(fast) + fast.n * fast.number_per_sample + settled)
    assert loop.precision_reached == noisy.precision_reached  # the cell's widest


def test_paired_variants_stop_together():
    """Paired calls (iteration k of each) settle together: the decided one samples on
    until every word is decided or the budget is spent."""
    clock = FakeClock()
    fns = {"loop": clock.variant("loop", lognormal(4 * MS, 0.02, seed=6)),
           "fast": clock.variant("fast", lognormal(MS, 0.02, seed=7)),
           "noisy": clock.variant("noisy", lognormal(4.2 * MS, 0.4, seed=8))}
    result = measure(fns, clock, reference="loop", warmup=0, min_rounds=5,
                     max_rounds=10_000, time_budget_s=0.5, paired=True)
    assert len({m.n for m in result.values()}) == 1
    assert {m.stopped_by for m in result.values()} == {StopReason.TIME_BUDGET}


def calibration_calls(m) -> int:
    """Calls `calibrate` made for `m`: blocks of 1, 2, 4, ... up to its number."""
    return 2 * m.number_per_sample - 1


def test_a_decided_word_waits_for_the_precision():
    """Decided faster at the first look, but +-3% needs more rounds: with a precision of
    0.5 it stops at the first look, with 0.01 later."""
    stops = {}
    for precision in (0.5, 0.01):
        clock = FakeClock()
        fns = {"loop": clock.variant("loop", lognormal(4 * MS, 0.1, seed=1)),
               "scan": clock.variant("scan", lognormal(MS, 0.1, seed=2))}
        m = measure(fns, clock, reference="loop", min_rounds=8, max_rounds=10_000,
                    time_budget_s=1e6, precision=precision)["scan"]
        assert m.stopped_by is StopReason.DECIDED
        stops[precision] = m.n
    assert stops[0.5] == 8 < stops[0.01]


def test_one_variant_alone_samples_its_budget():
    clock = FakeClock()
    fns = {"only": clock.variant("only", lognormal(MS, 0.05, seed=5))}
    m = measure(fns, clock, min_rounds=2, max_rounds=50, time_budget_s=1e6)["only"]
    assert (m.n, m.stopped_by) == (50, StopReason.MAX_SAMPLES)


def test_min_rounds_are_taken_even_past_the_budget():
    clock = FakeClock()
    fns = {"A": clock.variant("A", lognormal(MS, 0.5, seed=4))}
    m = measure(fns, clock, min_rounds=6, max_rounds=100, time_budget_s=1e-9)["A"]
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
        measure(fns, clock, warmup=2, min_rounds=50, max_rounds=50, sequential=False)
    assert (info.value.variant, info.value.phase) == ("B", phase)
    assert info.value.original is original and info.value.__cause__ is original
    assert str(info.value) == f"variant 'B' raised during {phase}: RuntimeError: shape mismatch"


def test_warm_up_of_a_slow_call_stops_at_its_budget_unless_calls_must_align():
    clock = FakeClock()
    slow = {"A": clock.variant("A", constant(0.2))}
    m = measure(slow, clock, warmup=3, min_rounds=2, max_rounds=2, warmup_budget_s=0.1)["A"]
    assert (m.warmup_calls, m.number_per_sample) == (1, 1)
    assert clock.log == ["A"] * (1 + 1 + 2)  # first, one warm-up, two samples: no calibration
    clock = FakeClock()
    slow = {"A": clock.variant("A", constant(0.2))}
    m = measure(slow, clock, warmup=3, min_rounds=2, max_rounds=2,
                warmup_budget_s=float("inf"), min_sample_time=None)["A"]
    assert m.warmup_calls == 3 and len(clock.log) == 1 + 3 + 2


def test_threads_in_effect_are_recorded_in_the_key():
    clock = FakeClock()
    with pinned_threads(1):
        m = measure({"A": clock.variant("A", constant(MS))}, clock, min_rounds=2, max_rounds=2)
    assert m["A"].key.threads == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warmup": -1}, r"Sampling.warmup: expected an integer >= 0 calls; got -1"),
        ({"min_rounds": 1}, r"Sampling.min_rounds: expected an integer >= 2; got 1"),
        ({"min_rounds": True}, r"Sampling.min_rounds: expected an integer >= 2; got True"),
        ({"min_rounds": 5, "max_rounds": 4},
         r"Sampling.max_rounds: expected an integer >= min_rounds \(5\); got 4"),
        ({"time_budget_s": 0.0}, r"Sampling.time_budget_s: expected finite seconds > 0; got 0.0"),
        ({"time_budget_s": float("inf")},
         r"Sampling.time_budget_s: expected finite seconds > 0; got inf"),
        ({"margin": 0.0}, r"Sampling.margin: expected a fraction in \(0, 1\), e.g. 0.05; got 0.0"),
        ({"margin": float("nan")}, r"Sampling.margin: expected a fraction in \(0, 1\)"),
        ({"precision": 1.5}, r"Sampling.precision: expected a fraction in \[0, 1\); got 1.5"),
        ({"min_sample_time": float("nan")},
         r"min_sample_time: expected finite seconds > 0; got nan"),
    ],
)
def test_sampling_rejects_bad_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


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
