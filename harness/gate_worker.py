"""One process of the gate's paired A/B check: time the quick cases of some findings on one tree.

`harness.gate_ab` runs this file's source with `python -c`, the working directory and
`PYTHONPATH` set to the tree under test, so `esper` and `harness.findings` come from that
tree while the timing loop below is the same for both sides. It therefore imports nothing
else from `harness` and only the long-stable parts of the findings API (`select`,
`cases`, `build`, `make_call`, `skip`, `variants`; `peers` where the tree has it).

Input: one JSON argument (see `WorkerConfig`). Output: one JSON object on stdout,
`{"esper": <path of the esper package imported>, "cells": [...]}`, a cell per finding x
case x variant with its raw samples (seconds per call) or the error it raised.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker process measures."""

    tree: str
    """Root of the tree under test; `esper` must be imported from here."""
    findings: tuple[str, ...]
    """Finding ids whose quick cases are timed."""
    min_samples: int
    """Samples per variant and case, at least."""
    variant_budget_s: float
    """Seconds of sampling per variant and case, after `min_samples` are taken."""
    min_sample_time: float
    """Seconds one sample should last at least; calls per sample are doubled until it does."""
    threads: int
    """`torch.set_num_threads` for the whole process."""
    seed: int = 0
    """Input seed passed to each finding's `build`."""


def _calls_per_sample(fn, min_sample_time: float) -> int:
    """Double the number of back-to-back calls from 1 until they take `min_sample_time`."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - start >= min_sample_time or number >= 1 << 16:
            return number
        number *= 2


def _time_variant(fn, config: WorkerConfig) -> list[float]:
    """Seconds per call, one entry per sample, after a first call and calibration.

    Variants are timed one after another: each is compared with itself on the other
    tree, in another process, so interleaving them here would buy nothing.
    """
    fn()  # first call: lazy initialisation and compilation stay out of the samples
    number = _calls_per_sample(fn, config.min_sample_time)
    samples: list[float] = []
    started = time.perf_counter()
    while len(samples) < config.min_samples or time.perf_counter() - started < config.variant_budget_s:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return samples


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def measure_tree(config: WorkerConfig) -> dict:
    """Cells of raw samples for every quick case and variant of `config.findings`."""
    import torch

    import esper
    from harness import findings as registry

    tree = Path(config.tree).resolve()
    for module in (esper, registry):
        where = Path(module.__file__).resolve()
        if tree not in where.parents:
            raise RuntimeError(
                f"{module.__name__} was imported from {where}, not from the tree under test "
                f"{tree}; run with PYTHONPATH={tree}"
            )
    torch.set_num_threads(config.threads)
    device = torch.device("cpu")
    cells = []
    for finding in registry.select(list(config.findings)):
        for case in finding.cases(True):
            base = {"finding": finding.id, "case": case.label}
            # peers (other libraries' code) are comparators, not ours to gate; getattr:
            # a tree older than the `peers` field has none
            peers = getattr(finding, "peers", ())
            variants = [v for v in finding.variants
                        if v not in peers and finding.skip(v, case, device) is None]
            try:
                inputs = finding.build(case, device, config.seed)
            except Exception as err:  # the tree cannot run this case: rows, not a crash
                cells += [{**base, "variant": v, "error": _error(err)} for v in variants]
                continue
            for variant in variants:
                try:
                    samples = _time_variant(finding.make_call(variant, inputs), config)
                except Exception as err:  # this variant fails on this tree: a row
                    cells.append({**base, "variant": variant, "error": _error(err)})
                    continue
                cells.append({**base, "variant": variant, "samples": samples})
    return {"esper": str(Path(esper.__file__).resolve().parent), "cells": cells}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gate_worker.py CONFIG_JSON", file=sys.stderr)
        return 2
    raw = json.loads(argv[0])
    raw["findings"] = tuple(raw["findings"])
    print(json.dumps(measure_tree(WorkerConfig(**raw))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
