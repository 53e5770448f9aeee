"""LOADED-co-runner: a finding whose second case starts another job's busy process as its
inputs are built (a process outside the run's: it leaves the process that starts it, so
no process of the run is its parent), for the test of a run that sees load appear after
it chose its threads. The process spins one core until the file `LOADED_STOP` names
exists (or 120 s pass); the file `LOADED_STARTED` names is created as it starts, so that
the run's second process, building the same case, starts no second one.

With `LOADED_AFTER_CELLS` (the run's --out) and `LOADED_SPINNERS=N`, the first case
starts N such processes instead, and only once both cells are in the run's journal: in
the processes that time a cell again after every cell was timed (more processes, or its
headline at one thread)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from harness.findings import Case, Finding, max_abs_difference, register

#: the spinner: it detaches (its starter exits at once, so init adopts it), then spins
_SPINNER = """if True:
    import os, sys, time
    if os.fork():
        os._exit(0)
    os.setsid()
    stop, ends = sys.argv[1], time.monotonic() + 120
    while not os.path.exists(stop) and time.monotonic() < ends:
        for _ in range(100_000):
            pass
"""


def _build(case, device, seed) -> torch.Tensor:
    results = os.environ.get("LOADED_AFTER_CELLS")
    if results is None and case["n"] == 512:
        _start_spinners(1)
    elif results is not None and case["n"] == 256 \
            and len(list(Path(results).glob("*/cells/*.json"))) >= 2:
        _start_spinners(int(os.environ["LOADED_SPINNERS"]))
    return torch.arange(case["n"], dtype=torch.float64, device=device)


def _start_spinners(count: int) -> None:
    """`count` spinners, unless a process of the run started them already."""
    try:
        marker = os.open(os.environ["LOADED_STARTED"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:  # the run's other process started them
        return
    for _ in range(count):
        # none of the run's pipes: whoever reads the run's output sees it end with it
        starter = subprocess.Popen([sys.executable, "-c", _SPINNER, os.environ["LOADED_STOP"]],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        starter.wait()
    os.close(marker)


register(Finding(
    id="LOADED-co-runner",
    title="sum() vs the last entry of cumsum(), another job starting at the second case",
    claim="cumsum()[-1] is as fast as sum()",
    variants=("sum", "cumsum"),
    baseline="sum",
    cases=lambda quick: [Case.of(n=256), Case.of(n=512)],
    build=_build,
    make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum" else (
        lambda: x.cumsum(0)[-1]),
    check=max_abs_difference,
    tolerance=lambda case: 1e-6,
))
