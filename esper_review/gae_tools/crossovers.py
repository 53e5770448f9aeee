"""`python -m esper_review.gae_tools.crossovers`: which GAE method is fastest at which shape, here.

    python -m esper_review.gae_tools.crossovers [--threads N] [--quick] [--device cpu|cuda]

Times every GAE method this machine runs on the device (not `auto`, which picks one of
them, nor `loop`, orders of magnitude slower) on a grid of [num_envs, max_steps] shapes
(the B4-CR-03 inputs with random terminals), interleaved by the harness's timing
(`harness.measure.timing.measure_interleaved`), on `--threads` torch threads (default 1).
Prints, in markdown:

1. median microseconds per method and shape, and the fastest method per shape;
2. the proposed `esper.gae.crossovers.CROSSOVERS` rows for the device (first match wins);
3. on the CPU, numba's kernel on one thread vs two per shape, and the proposed
   `esper.gae.numba_kernel.PARALLEL_MIN_ELEMENTS`.

One-off costs (numba's JIT, torch.compile's first call) are paid before the grid.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch

from esper import gae
from esper.gae.crossovers import UNBOUNDED, Crossover
from harness import exits, options
from harness.exits import UsageError
from harness.findings import Case
from esper_review.findings.gae_methods import GAMMA, LAMBDA, build_gae_inputs, gae_args
from harness.progress import Progress
from harness.measure.timing import Sampling, make_clock, measure_interleaved, pinned_threads

ENVS = (1, 4, 16, 64, 256, 1024)
STEPS = (25, 128, 256, 1024)
QUICK_ENVS = (4, 64, 1024)
QUICK_STEPS = (25, 256)
#: numba's parallel kernel is compared with its serial one on this many threads
PARALLEL_THREADS = 2

Shape = tuple[int, int]
"""(num_envs, max_steps)."""


@dataclass(frozen=True)
class Grid:
    """Median seconds per call: shape -> method -> seconds, shapes in (envs, steps) order."""

    medians: dict[Shape, dict[str, float]]

    def ranking(self, shape: Shape) -> tuple[str, ...]:
        """The methods at `shape`, fastest first."""
        return tuple(sorted(self.medians[shape], key=self.medians[shape].get))


def timed_methods(device: torch.device) -> list[str]:
    """The methods compared on `device`: every registered one that runs there, but
    `auto` (it picks one of the others) and `loop` (the slow original)."""
    return [m for m in gae.METHODS
            if m not in ("auto", "loop") and device.type in gae.DEVICE_TYPES[m]]


def _inputs(shape: Shape, device: torch.device) -> tuple:
    """The B4-CR-03 inputs [num_envs, max_steps] (random terminals), as compute_gae args."""
    num_envs, max_steps = shape
    return gae_args(build_gae_inputs(
        Case.of(num_envs=num_envs, max_steps=max_steps, dones="random0.05"), device, seed=0))


def _medians(calls: dict, device: torch.device, shape: Shape, budget_s: float) -> dict[str, float]:
    """name -> median seconds per call of each zero-argument call, timed interleaved."""
    measured = measure_interleaved(calls, make_clock(device), finding="gae-crossovers",
                                   case=f"{shape[0]}x{shape[1]}",
                                   sampling=Sampling(min_rounds=5, max_rounds=50,
                                                     time_budget_s=budget_s, sequential=False))
    return {name: m.median for name, m in measured.items()}


def measure_grid(device: torch.device, shapes: list[Shape], methods: list[str],
                 budget_s: float) -> Grid:
    """Median seconds per call of every method at every shape, a progress line (or bar)
    per shape on stderr."""
    medians = {}
    with Progress(len(shapes), "shape") as progress:
        for shape in shapes:
            progress.describe(f"{shape[0]} x {shape[1]}")
            args = _inputs(shape, device)
            calls = {m: (lambda m=m: gae.compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA,
                                                     method=m))
                     for m in methods}
            medians[shape] = _medians(calls, device, shape, budget_s)
            progress.step(f"{shape[0]} x {shape[1]}")
    return Grid(medians)


def propose_rows(device_type: str, grid: Grid, depth: int = 2) -> list[Crossover]:
    """CROSSOVERS rows that pick, at every measured shape, its fastest method, and its
    next fastest where the fastest is missing (the first `depth` of its ranking).

    Starts from one row per shape in (envs, steps) order, each bounded by its shape:
    the first match of any input is then the next measured shape up (envs first). Rows
    whose removal leaves the first `depth` choices at every measured shape unchanged are
    dropped, and a last catch-all row takes the ranking of the largest shape.
    """
    shapes = sorted(grid.medians)
    rows = [Crossover(device_type, e, t, grid.ranking((e, t)), True) for e, t in shapes]
    largest = grid.ranking(max(shapes, key=lambda s: s[0] * s[1]))
    catch_all = Crossover(device_type, UNBOUNDED, UNBOUNDED, largest, True)

    def first_choices(candidate: list[Crossover]) -> list[tuple[str, ...]]:
        table = [*candidate, catch_all]
        return [next(r for r in table if e <= r.max_envs and t <= r.max_steps).ranking[:depth]
                for e, t in shapes]

    wanted = first_choices(rows)
    index = 0
    while index < len(rows):
        fewer = rows[:index] + rows[index + 1:]
        if first_choices(fewer) == wanted:
            rows = fewer
        else:
            index += 1
    return [*rows, catch_all]


def markdown_table(grid: Grid, methods: list[str]) -> str:
    """| envs | steps | <method> us ... | fastest |, one line per shape."""
    lines = ["| envs | steps | " + " | ".join(f"{m} (us)" for m in methods) + " | fastest |",
             "|---:|---:|" + "---:|" * len(methods) + "---|"]
    for (e, t), medians in sorted(grid.medians.items()):
        cells = " | ".join(f"{medians[m] * 1e6:.1f}" for m in methods)
        lines.append(f"| {e} | {t} | {cells} | {grid.ranking((e, t))[0]} |")
    return "\n".join(lines)


def rows_source(rows: list[Crossover]) -> str:
    """The rows as the Python source of `esper.gae.crossovers.CROSSOVERS` entries."""
    def bound(n: int) -> str:
        return "UNBOUNDED" if n == UNBOUNDED else str(n)
    return "\n".join(f"    Crossover({r.device_type!r}, {bound(r.max_envs)}, {bound(r.max_steps)}, "
                     f"{r.ranking!r}, True)," for r in rows)


def measure_numba_threads(shapes: list[Shape], budget_s: float) -> dict[Shape, tuple[float, float]]:
    """shape -> (median s on one thread, on PARALLEL_THREADS threads) of numba's kernel."""
    from esper.gae.numba_kernel import gae_numba

    out = {}
    for shape in shapes:
        if shape[0] < PARALLEL_THREADS:
            continue  # one row: nothing to split
        args = _inputs(shape, torch.device("cpu"))
        calls = {f"{n}": (lambda n=n: gae_numba(*args, gamma=GAMMA, gae_lambda=LAMBDA, threads=n))
                 for n in (1, PARALLEL_THREADS)}
        medians = _medians(calls, torch.device("cpu"), shape, budget_s)
        out[shape] = (medians["1"], medians[str(PARALLEL_THREADS)])
    return out


def propose_parallel_min(results: dict[Shape, tuple[float, float]]) -> int | None:
    """The smallest element count (envs x steps) from which the parallel kernel is
    faster at every measured shape at least that large; None if it never is."""
    by_size = sorted(results.items(), key=lambda item: item[0][0] * item[0][1])
    proposal = None
    for (e, t), (serial, parallel) in reversed(by_size):
        if parallel >= serial:
            break
        proposal = e * t
    return proposal


def numba_table(results: dict[Shape, tuple[float, float]]) -> str:
    """| envs | steps | elements | 1 thread | 2 threads | faster |, by element count."""
    lines = ["| envs | steps | elements | 1 thread (us) | "
             f"{PARALLEL_THREADS} threads (us) | faster |", "|---:|---:|---:|---:|---:|---|"]
    for (e, t), (serial, parallel) in sorted(results.items(), key=lambda i: i[0][0] * i[0][1]):
        faster = "1 thread" if serial <= parallel else f"{PARALLEL_THREADS} threads"
        lines.append(f"| {e} | {t} | {e * t} | {serial * 1e6:.1f} | {parallel * 1e6:.1f} | "
                     f"{faster} |")
    return "\n".join(lines)


def warm_up_methods(methods: list[str], device: torch.device) -> list[str]:
    """Pay the one-off JIT/compile costs before timing; lines saying what they took."""
    lines = []
    if "numba" in methods:
        from esper.gae.numba_kernel import warm_up
        lines.append(f"numba JIT (or disk-cache load): {warm_up():.1f} s")
    if "compiled" in methods:
        from esper.gae.compiled import compile_seconds
        lines.append(f"compiled first call (torch.compile): "
                     f"{compile_seconds(torch.float32, device):.1f} s")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(prog="python -m esper_review.gae_tools.crossovers",
                       description=__doc__.split("\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog("done (the tables are printed)"))
    exits.add_version(p)
    p.add_argument("--threads", type=options.positive_int, default=1,
                   help="torch threads (default 1)")
    p.add_argument("--quick", action="store_true", help="fewer shapes, shorter budgets")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default cpu")
    return p


@exits.command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: expected a CUDA device; torch.cuda.is_available() "
                         "is False here")
    device = torch.device(args.device)
    envs, steps = (QUICK_ENVS, QUICK_STEPS) if args.quick else (ENVS, STEPS)
    shapes = [(e, t) for e in envs for t in steps]
    budget = 0.3 if args.quick else 1.0
    methods = timed_methods(device)
    started = time.perf_counter()
    with pinned_threads(args.threads):
        print("warming up: numba's JIT and torch.compile's first call (seconds)...",
              file=sys.stderr, flush=True)
        notes = warm_up_methods(methods, device)
        grid = measure_grid(device, shapes, methods, budget)
    print(f"# GAE crossovers on {device.type}, {args.threads} torch thread(s), "
          f"{os.cpu_count()} CPU cores\n")
    for line in notes:
        print(f"- {line}")
    print(f"\nMedian us per call (gamma {GAMMA}, lambda {LAMBDA}, float32, random terminals):\n")
    print(markdown_table(grid, methods))
    print("\nProposed CROSSOVERS rows (esper/gae/crossovers.py; first match wins):\n")
    print("```python\n" + rows_source(propose_rows(device.type, grid)) + "\n```")
    if device.type == "cpu" and "numba" in methods and (os.cpu_count() or 1) >= PARALLEL_THREADS:
        results = measure_numba_threads(shapes, budget)
        print(f"\nnumba: the serial kernel vs the parallel one on {PARALLEL_THREADS} threads:\n")
        print(numba_table(results))
        proposal = propose_parallel_min(results)
        print(f"\nProposed PARALLEL_MIN_ELEMENTS (esper/gae/numba_kernel.py): "
              f"{'none: one thread won everywhere' if proposal is None else f'{proposal:_}'}")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
