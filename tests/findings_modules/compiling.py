"""A finding whose variants "compile" on their first call into a disk cache (a file per
variant in the folder `COMPILES_CACHE` names), for the tests of a run's warm step
(`Recording.caches_cold`, `Recording.compile_groups`). Each first call appends `pid variant
compiled|loaded` to the file `COMPILES_LOG` names (with the wall clock before and after
it, and 1 or 0: whether the report's modules were imported then): compiled where the
cache held nothing yet, which takes 0.3 s. Where `COMPILES_MEET` names a folder, a
compiling call first leaves its variant's name there and waits (at most 30 s) until both
variants' names are there: processes that compile at once then overlap however long each
took to start, and processes that compile one after the other do not. This module registers
nothing: `compiles` and `compiles_grouped` each register one such finding, so that loading
either runs only its own."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from harness.findings import Case, Finding, Recording, max_abs_difference


def _cached(variant: str) -> Path:
    return Path(os.environ["COMPILES_CACHE"]) / variant


def _make_call(variant: str, x: torch.Tensor):
    cache = _cached(variant)
    began = time.time()
    state = "loaded" if cache.exists() else "compiled"
    if state == "compiled":
        if meet := os.environ.get("COMPILES_MEET"):
            (Path(meet) / variant).parent.mkdir(parents=True, exist_ok=True)
            (Path(meet) / variant).touch()
            deadline = time.monotonic() + 30
            while len(list(Path(meet).iterdir())) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        time.sleep(0.3)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.touch()
    with open(os.environ["COMPILES_LOG"], "a", encoding="utf-8") as log:
        report = int("harness.report.cli" in sys.modules)
        log.write(f"{os.getpid()} {variant} {state} {began} {time.time()} {report}\n")
    if variant == "sum":
        return lambda: x.sum()
    return lambda: x.cumsum(0)[-1]


def compiling_finding(finding_id: str, compile_groups=()) -> Finding:
    """sum() against the last entry of cumsum(), each compiled on its first call."""
    return Finding(
        id=finding_id,
        title="sum() vs the last entry of cumsum(), each compiled on its first call",
        claim="cumsum()[-1] is as fast as sum()",
        variants=("sum", "cumsum"),
        baseline="sum",
        cases=lambda quick: [Case.of(n=256), Case.of(n=512)],
        build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64,
                                                      device=device),
        make_call=_make_call,
        check=max_abs_difference,
        tolerance=lambda case: 1e-6,
        recording=Recording(caches_cold=lambda: not _cached("sum").exists(),
                            compile_groups=compile_groups),
    )
