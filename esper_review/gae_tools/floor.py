"""`python -m esper_review.gae_tools.floor`: how far each GAE call is from its dispatch floor.

    python -m esper_review.gae_tools.floor [--rounds N | --quick] [--methods M,M] [--clock wall|cpu]

At small shapes a GAE call is mostly the call's own overhead: checking the inputs,
choosing a method, handing the tensors to a kernel, allocating the outputs. This command
measures, in one process and interleaved, on one torch thread (`torch.set_num_threads(1)`:
a small call gains nothing from more), at 4 x 25 and 64 x 128 (the B4-CR-03 inputs,
float32, random terminals, a resident int64 step-count tensor):

- the dispatch floor: a numba no-op called with the same eight tensors (rewards,
  values, dones, truncated, bootstrap values, step counts, and the two outputs,
  allocated as the numba method allocates them), handed over as the numba method hands
  them over, by address (`floor`). Also the floor of handing them over as NumPy views
  (`floor_numpy`: what the numba method did before, four aten ops a view);
- every `compute_gae` method but the per-env loop, as a multiple of `floor` (the median
  of the per-round ratios, with its 95% bootstrap interval over rounds);
- the input check (`check_gae_inputs`) against a call of a no-op function with the same
  arguments: the check's own time, a paired difference (the no-op call's own time is
  printed too: how fast this machine runs Python at the moment);
- `auto` against the method it picks: what choosing costs;
- `compiled` against eager `scan` at 4 x 25, with the aten ops each dispatches per call;

and checks the targets: the numba method within `NUMBA_FLOOR_FACTOR` x the floor at
4 x 25 (against `floor_numpy`, the floor the target was set for, and also printed against
`floor`), `auto` within `AUTO_LIMIT_S` of its pick and the input check under
`CHECK_LIMIT_S`, at both shapes. A target holds when its median does; the interval says
how sure that is.

Each round times every call once, in a random order, each sample a batch of
back-to-back calls of about `SAMPLE_S`: short enough that a busy machine rarely
preempts one, and a preempted round spoils one ratio, not the median. `--clock cpu`
reads the thread's CPU time instead of the wall clock (time the process spends waiting
for a core is then not counted; the calls run on this thread).

Exit status: 0 every target held, 1 one missed, 2 usage error, 3 internal error.
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from esper import gae
from harness import exits, options
from harness.exits import UsageError
from harness.findings import Case
from esper_review.findings.gae_methods import GAMMA, LAMBDA, build_gae_inputs, gae_args
from esper_review.gae_tools.crossovers import warm_up_methods
from harness.measure import stats
from harness.measure.counters import profile_call
from harness.measure.timing import pinned_threads

Shape = tuple[int, int]
"""(num_envs, max_steps)."""

SHAPES: tuple[Shape, ...] = ((4, 25), (64, 128))
#: where the numba target, and the compiled-vs-scan comparison, are read
SMALL: Shape = (4, 25)
NUMBA_FLOOR_FACTOR = 1.5
AUTO_LIMIT_S = 1e-6
#: every check kept: reading five tensors' metadata alone costs about 1 us on this CPU
#: (docs/gae.md), so the earlier 1 us target is withdrawn for 2 us
CHECK_LIMIT_S = 2e-6
#: seconds of back-to-back calls per sample
SAMPLE_S = 100e-6
DEFAULT_ROUNDS = 1000
QUICK_ROUNDS = 200
#: the names of the measured calls that are not `compute_gae` methods
FLOOR, FLOOR_NUMPY, CHECK, NO_OP = "floor", "floor_numpy", "check", "no_op_call"
CLOCKS: dict[str, Callable[[], int]] = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}


# ------------------------------------------------------------------------- the floors

@functools.cache
def _no_op_kernels():
    """(at_addresses, on_arrays): numba no-ops with the numba method's two kernel
    signatures, the present one (addresses) and the former one (NumPy arrays)."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def at_addresses(rewards, values, dones, truncated, bootstrap, step_counts, advantages,
                     returns, num_envs, max_steps, gamma, trace, double):
        return -1

    @numba.njit(cache=True, nogil=True)
    def on_arrays(rewards, values, dones, truncated, bootstrap, step_counts, advantages,
                  returns, gamma, trace):
        return -1

    return at_addresses, on_arrays


def floor_calls(args: Sequence[torch.Tensor]) -> dict[str, Callable[[], object]]:
    """The two floors for `compute_gae`'s first six arguments (float tensors, flags, an
    int64 count tensor): zero-argument calls that allocate the outputs as the numba
    method does and call a no-op kernel with the eight tensors, by address (`floor`) or
    as NumPy views (`floor_numpy`)."""
    rewards, values, dones, truncated, bootstrap, counts = args
    at_addresses, on_arrays = _no_op_kernels()
    trace = GAMMA * LAMBDA

    def floor():
        advantages = torch.empty_like(rewards)
        returns = torch.empty_like(rewards)
        num_envs, max_steps = rewards.shape
        at_addresses(rewards.data_ptr(), values.data_ptr(), dones.data_ptr(),
                     truncated.data_ptr(), bootstrap.data_ptr(), counts.data_ptr(),
                     advantages.data_ptr(), returns.data_ptr(), num_envs, max_steps,
                     GAMMA, trace, rewards.dtype is torch.float64)
        return advantages, returns

    def floor_numpy():
        advantages = torch.empty_like(rewards)
        returns = torch.empty_like(rewards)
        on_arrays(rewards.numpy(), values.numpy(), dones.numpy(), truncated.numpy(),
                  bootstrap.numpy(), counts.numpy(), advantages.numpy(), returns.numpy(),
                  GAMMA, trace)
        return advantages, returns

    return {FLOOR: floor, FLOOR_NUMPY: floor_numpy}


def _no_op(rewards, values, dones, truncated, bootstrap_values, step_counts, gamma, gae_lambda):
    """What calling `check_gae_inputs` costs before it checks anything."""


def shape_args(shape: Shape) -> tuple:
    """`compute_gae`'s first six arguments at `shape`: the B4-CR-03 inputs (float32,
    random terminals) with a resident int64 step-count tensor."""
    num_envs, max_steps = shape
    return gae_args(build_gae_inputs(
        Case.of(num_envs=num_envs, max_steps=max_steps, dones="random0.05"),
        torch.device("cpu"), seed=0))


def shape_calls(args: tuple, methods: Sequence[str]) -> dict[str, Callable[[], object]]:
    """Every call measured on `args` (`shape_args`): the floors, each method through
    `compute_gae`, the input check and the no-op call it is paired with."""
    calls = floor_calls(args)
    for method in methods:
        calls[method] = (lambda m=method: gae.compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA,
                                                          method=m))
    calls[CHECK] = lambda: gae.check_gae_inputs(*args, GAMMA, LAMBDA)
    calls[NO_OP] = lambda: _no_op(*args, GAMMA, LAMBDA)
    return calls


# ------------------------------------------------------------------------- sampling

def batch_sizes(calls: dict[str, Callable[[], object]], clock: Callable[[], int],
                sample_s: float = SAMPLE_S) -> dict[str, int]:
    """name -> back-to-back calls per sample: about `sample_s` seconds of each, at least 1
    (from the fastest of three timed single calls, after two untimed ones)."""
    sizes = {}
    for name, call in calls.items():
        call()
        call()
        best = math.inf
        for _ in range(3):
            start = clock()
            call()
            best = min(best, (clock() - start) * 1e-9)
        sizes[name] = max(1, int(sample_s / max(best, 1e-9)))
    return sizes


def sample_rounds(calls: dict[str, Callable[[], object]], batches: dict[str, int],
                  rounds: int, clock: Callable[[], int],
                  progress: Callable[[int], None] | None = None,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """name -> seconds per call in each round [rounds]. Each round times every call once
    (a batch of `batches[name]` back-to-back calls) in its own random order: a call's
    first run in a sample finds the caches as the call before it left them, so a fixed
    order (even rotated, which keeps who follows whom) would favour some calls over
    others. The garbage collector is off while sampling (a collection inside one sample
    would spoil it)."""
    names = list(calls)
    orders = np.random.default_rng(seed).permuted(np.tile(np.arange(len(names)), (rounds, 1)),
                                                  axis=1)
    seconds = {name: np.empty(rounds) for name in names}
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for k in range(rounds):
            for name in (names[i] for i in orders[k]):
                call, number = calls[name], batches[name]
                start = clock()
                for _ in range(number):
                    call()
                seconds[name][k] = (clock() - start) * 1e-9 / number
            if progress is not None:
                progress(k + 1)
    finally:
        if was_enabled:
            gc.enable()
    return seconds


# ------------------------------------------------------------------------- results

@dataclass(frozen=True)
class Paired:
    """A median over rounds of per-round ratios or differences, with a 95% interval."""

    value: float
    low: float
    high: float


def paired_ratio(samples: dict[str, np.ndarray], name: str, baseline: str) -> Paired:
    ci = stats.paired_ratio_ci(samples[name], samples[baseline])
    return Paired(ci.ratio, ci.low, ci.high)


def paired_difference(samples: dict[str, np.ndarray], name: str, baseline: str) -> Paired:
    return Paired(*stats.paired_difference_ci(samples[name], samples[baseline]))


@dataclass(frozen=True)
class ShapeResult:
    """One shape's samples (seconds per call per round) and the method `auto` picked."""

    shape: Shape
    samples: dict[str, np.ndarray]
    auto_pick: str | None

    def median_s(self, name: str) -> float:
        return float(np.median(self.samples[name]))

    def over_floor(self, name: str, floor: str = FLOOR) -> Paired:
        return paired_ratio(self.samples, name, floor)

    def check_s(self) -> Paired:
        return paired_difference(self.samples, CHECK, NO_OP)

    def auto_over_pick_s(self) -> Paired | None:
        if self.auto_pick is None or "auto" not in self.samples or self.auto_pick not in self.samples:
            return None
        return paired_difference(self.samples, "auto", self.auto_pick)


@dataclass(frozen=True)
class Target:
    name: str
    held: bool | None
    """None: not measured in this run (its method was left out)."""
    evidence: str


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}"


def _interval_us(p: Paired) -> str:
    return f"{_us(p.value)} us ({_us(p.low)} to {_us(p.high)})"


def _interval_x(p: Paired) -> str:
    return f"{p.value:.2f}x ({p.low:.2f}-{p.high:.2f})"


def check_targets(results: list[ShapeResult]) -> list[Target]:
    """Every target, held or not (or not measured), with the numbers behind it."""
    targets = []
    small = next((r for r in results if r.shape == SMALL), None)
    if small is not None:
        name = (f"numba within {NUMBA_FLOOR_FACTOR:g}x the floor at {SMALL[0]}x{SMALL[1]} "
                f"(the NumPy-view floor the target was set against)")
        if "numba" in small.samples:
            numpy_floor = small.over_floor("numba", FLOOR_NUMPY)
            addresses = small.over_floor("numba", FLOOR)
            targets.append(Target(name, numpy_floor.value <= NUMBA_FLOOR_FACTOR,
                                  f"{_interval_x(numpy_floor)}; {_interval_x(addresses)} "
                                  f"the address floor"))
        else:
            targets.append(Target(name, None, "numba not measured"))
    for result in results:
        where = f"{result.shape[0]}x{result.shape[1]}"
        over = result.auto_over_pick_s()
        name = f"auto within {_us(AUTO_LIMIT_S)} us of its pick at {where}"
        if over is None:
            targets.append(Target(name, None, "auto or its pick not measured"))
        else:
            targets.append(Target(name, over.value <= AUTO_LIMIT_S,
                                  f"+{_interval_us(over)} over {result.auto_pick}"))
        check = result.check_s()
        targets.append(Target(f"input check under {_us(CHECK_LIMIT_S)} us at {where}",
                              check.value < CHECK_LIMIT_S, _interval_us(check)))
    return targets


def markdown(results: list[ShapeResult], methods: Sequence[str]) -> str:
    """Per shape: | call | median us | x floor (95% CI) | x NumPy-view floor |."""
    lines = []
    for result in results:
        e, t = result.shape
        lines += [f"### {e} envs x {t} steps", "",
                  "| call | median (us) | x floor (95% CI) | x NumPy-view floor |",
                  "|---|---:|---:|---:|"]
        for name in (FLOOR, FLOOR_NUMPY, *methods):
            label = name + (f" (picks {result.auto_pick})" if name == "auto" and result.auto_pick else "")
            lines.append(f"| {label} | {_us(result.median_s(name))} | "
                         f"{_interval_x(result.over_floor(name))} | "
                         f"{result.over_floor(name, FLOOR_NUMPY).value:.2f}x |")
        lines += ["", f"- input check: {_interval_us(result.check_s())} (a no-op call with "
                      f"its arguments: {_us(result.median_s(NO_OP))} us)"]
        over = result.auto_over_pick_s()
        if over is not None:
            lines.append(f"- auto over its pick ({result.auto_pick}): +{_interval_us(over)}")
        lines.append("")
    return "\n".join(lines)


def compiled_vs_scan(result: ShapeResult, op_counts: dict[str, int]) -> str:
    """The compiled method's call against eager scan's: times, ratio, aten ops per call."""
    if not {"compiled", "scan"} <= set(result.samples):
        return "compiled vs scan: not measured (both methods are needed)"
    ratio = paired_ratio(result.samples, "compiled", "scan")
    e, t = result.shape
    ops = ", ".join(f"{m} {op_counts[m]}" for m in ("scan", "compiled") if m in op_counts)
    return (f"compiled vs scan at {e}x{t}: compiled {_us(result.median_s('compiled'))} us, "
            f"scan {_us(result.median_s('scan'))} us, compiled / scan {_interval_x(ratio)}; "
            f"aten ops per call: {ops}")


# ------------------------------------------------------------------------- command

def measure_shape(shape: Shape, methods: Sequence[str], rounds: int,
                  clock: Callable[[], int]) -> ShapeResult:
    args = shape_args(shape)
    calls = shape_calls(args, methods)
    batches = batch_sizes(calls, clock)
    step = max(1, rounds // 4)

    def progress(done: int) -> None:
        if done % step == 0 or done == rounds:
            print(f"  {shape[0]}x{shape[1]}: {done}/{rounds} rounds", file=sys.stderr, flush=True)

    samples = sample_rounds(calls, batches, rounds, clock, progress)
    pick = None
    if "auto" in methods:
        from esper.gae.methods import cached_choice

        rewards = args[0]
        pick = cached_choice(rewards.shape, rewards.dtype, rewards.device.type, False)
    return ShapeResult(shape, samples, pick)


def _parse_methods(text: str | None) -> list[str]:
    default = [m for m in gae.METHODS if m != "loop" and "cpu" in gae.DEVICE_TYPES[m]]
    if text is None:
        return default
    methods = [m for m in text.split(",") if m]
    unknown = [m for m in methods if m not in default]
    if not methods or unknown:
        raise UsageError(f"--methods: expected a comma-separated list of {', '.join(default)}; "
                         f"got {text!r}")
    return methods


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(prog="python -m esper_review.gae_tools.floor",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=exits.epilog("every target held", "a target missed"))
    exits.add_version(p)
    p.add_argument("--rounds", type=options.at_least(10), default=None,
                   help=f"rounds per shape (default {DEFAULT_ROUNDS}; {QUICK_ROUNDS} with --quick)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds per shape")
    p.add_argument("--methods", default=None, metavar="M,M",
                   help="the compute_gae methods to time (default: every CPU method but loop)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                   help="wall: perf_counter_ns (default); cpu: this thread's CPU time")
    return p


@exits.command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    if rounds < 10:
        raise UsageError(f"--rounds: expected an int >= 10 (an interval needs rounds); got {rounds}")
    if "numba" not in gae.METHODS:
        raise UsageError("numba: expected it installed (the floor is a numba no-op); it is "
                         "not (pip install -e '.[dev]')")
    methods = _parse_methods(args.methods)
    clock = CLOCKS[args.clock]
    started = time.perf_counter()
    with pinned_threads(1):
        print("warming up (numba JIT, torch.compile's first call) ...", file=sys.stderr, flush=True)
        notes = warm_up_methods(methods, torch.device("cpu"))
        results = []
        for shape in SHAPES:
            print(f"measuring {shape[0]}x{shape[1]} ({rounds} rounds) ...", file=sys.stderr,
                  flush=True)
            results.append(measure_shape(shape, methods, rounds, clock))
        small_calls = shape_calls(shape_args(SMALL), [m for m in ("scan", "compiled") if m in methods])
        op_counts = {m: profile_call(small_calls[m]).op_calls
                     for m in ("scan", "compiled") if m in small_calls}
    load = _load_average()
    print(f"# GAE calls against their dispatch floor (CPU, 1 torch thread, {args.clock} clock, "
          f"{rounds} rounds per shape, load average {load})\n")
    for line in notes:
        print(f"- {line}")
    print()
    print(markdown(results, methods))
    small = next(r for r in results if r.shape == SMALL)
    print(compiled_vs_scan(small, op_counts))
    print("\n| target | held | evidence (median, 95% interval) |\n|---|---|---|")
    targets = check_targets(results)
    for target in targets:
        held = {True: "yes", False: "NO", None: "not measured"}[target.held]
        print(f"| {target.name} | {held} | {target.evidence} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return exits.FAILED if any(t.held is False for t in targets) else exits.PASS


def _load_average() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    try:
        return "{:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    except OSError:  # not available on this platform
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
