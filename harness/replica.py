"""A replica: cells of a run measured again in a fresh process, for their ratios' sake.

Some ratios move from one fresh process to the next by more than rounds inside one
process can see (measured: a finding declares such cells in `Finding.between_runs`). The
run measures each of them in its own process and in `processes - 1` replicas, each a
fresh `python -m harness.replica` with the run's options, the cell's sampling budget
shared out between them; `harness.runner.CaseRun` then combines every process's paired
rounds (`harness.measure.estimate.paired_estimate`).

One replica measures every such cell of the run in one process (one torch start and one
set of first compilations), before the run measures its own share. Its output is kept
in the run folder (`replicas/`), written atomically as soon as it is measured, so a
resumed run measures only what is missing. A replica that fails costs its cells only
their extra processes: each row says so in `process_note`.

Input: one JSON argument (`ReplicaSpec`). Output: one JSON object on stdout,
`{"cells": [{"finding", "case", "samples": {variant: [seconds, ...]}, "failed":
{variant: error}}]}` (samples: one per round, in round order), or a cell with `"error"`;
the run keeps it with the replica's wall `"seconds"` added.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import findings as registry
from harness.exits import UsageError, command, run_group
from harness.measure.timing import pinned_threads
from harness.ranks import solo_environment
from harness.results import atomic_write_text
from harness.runner import CaseRun, RunOptions

#: the folder of a run that holds its replicas' output
FOLDER = "replicas"
#: the `RunOptions` fields a replica takes from the run as they are; of the others it
#: takes the device by name, and leaves profiling, sources and the bandwidth floor off
#: (its samples are all the run reads) and the process noise at its default (no option
#: changes it)
CARRIED_OPTIONS = ("quick", "seed", "time_budget_s", "min_samples", "max_samples", "margin",
                   "precision", "placebo", "processes")


@dataclass(frozen=True)
class ReplicaSpec:
    """What one replica process measures, and how (the run's own options)."""

    cells: tuple[tuple[str, str, bool], ...]
    """(finding id, case label, headline) of each cell, in the run's order."""
    findings_modules: tuple[str, ...] = ()
    device: str = "cpu"
    quick: bool = False
    seed: int = 0
    time_budget_s: float = 1.0
    min_samples: int = 8
    max_samples: int = 200
    margin: float = 0.05
    precision: float = 0.03
    placebo: str = "headline"
    processes: int | None = None
    threads: int = 1
    parent: int | None = None
    """The run's pid: the replica stops when that process is gone."""

    @classmethod
    def of(cls, cells: Sequence[tuple[str, str, bool]], options, threads: int,
           findings_modules: Sequence[str] | None) -> "ReplicaSpec":
        """The replica of `cells` under `options` (`harness.runner.RunOptions`)."""
        return cls(cells=tuple(tuple(c) for c in cells),
                   findings_modules=tuple(findings_modules or ()), device=str(options.device),
                   threads=threads, parent=os.getpid(),
                   **{name: getattr(options, name) for name in CARRIED_OPTIONS})


def _die_with_parent(parent: int | None) -> None:
    """No replica outlives the run that started it, even one killed outright: on Linux
    the kernel kills this process when its parent dies (PR_SET_PDEATHSIG). (The gate's
    worker does the same on its own: it runs as a script that imports nothing of the
    harness before it has set up the trees it compares.)"""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        sys.exit(f"the run that started this replica (pid {parent}) is gone")


def measure(spec: ReplicaSpec) -> dict:
    """In the replica process: each cell of `spec` measured as the run measures it, without
    the profiling pass. Returns the output document (module docstring)."""
    for module in spec.findings_modules:
        registry.load_findings_module(module)
    options = RunOptions(device=torch.device(spec.device), profile=False,
                         **{name: getattr(spec, name) for name in CARRIED_OPTIONS})
    cells = []
    with pinned_threads(spec.threads):
        for finding_id, label, headline in spec.cells:
            entry = {"finding": finding_id, "case": label}
            try:
                finding = registry.planned(registry.select([finding_id])[0], spec.quick)
                case = next((c for c in finding.cases(spec.quick) if c.label == label), None)
                if case is None:
                    raise ValueError(f"{finding_id} has no case {label!r} here")
                cell = CaseRun(finding, case, options, headline=headline).run()
            except Exception as err:  # one cell that cannot run is that cell's, said
                entry["error"] = f"{type(err).__name__}: {err}"
            else:
                entry["samples"] = {v: list(m.samples) for v, m in cell.measurements.items()}
                entry["failed"] = {v: row.get("error") or row.get("reason") or row["status"]
                                   for v, row in cell.cells.items()
                                   if v not in cell.measurements and row.get("status")}
            cells.append(entry)
    return {"cells": cells}


def run_replica(spec: ReplicaSpec, path: Path) -> dict[tuple[str, str], dict]:
    """Start one replica of `spec`, wait for it, and keep its output at `path` (atomic).
    Returns (finding id, case label) -> that cell's entry; where the replica itself failed,
    every cell's entry is `{"error": why}`."""
    started = time.perf_counter()
    done = run_group([sys.executable, "-m", "harness.replica",
                      json.dumps(dataclasses.asdict(spec))], env=solo_environment())
    seconds = time.perf_counter() - started
    try:
        if done.returncode != 0:
            raise ValueError(f"exited with {done.returncode}")
        document = json.loads(done.stdout)
        cells = document["cells"]
    except (ValueError, KeyError, TypeError) as err:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        why = f"the replica process failed ({err}: {tail[0]})"
        cells = [{"finding": f, "case": c, "error": why} for f, c, _ in spec.cells]
        document = {"cells": cells}
    document["seconds"] = seconds
    atomic_write_text(path, json.dumps(document))
    return {(c["finding"], c["case"]): c for c in cells}


def load_replica(path: Path) -> dict[tuple[str, str], dict]:
    """A replica's kept output, as `run_replica` returns it; {} where none is readable."""
    try:
        cells = json.loads(Path(path).read_text())["cells"]
        return {(c["finding"], c["case"]): c for c in cells}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def kept_seconds(folder: Path) -> list[float]:
    """The wall seconds of each replica a run's folder keeps (for the run's time line)."""
    seconds = []
    for path in sorted((Path(folder) / FOLDER).glob("*.json")):
        try:
            seconds.append(float(json.loads(path.read_text())["seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return seconds


def replicas_for(cells: Sequence[tuple[str, str, bool, int]], folder: Path, spec_of: Callable,
                 label: str = "", progress: Callable[[str], None] | None = None
                 ) -> dict[tuple[str, str], list[dict]]:
    """The replicas of a run's cells (finding id, case label, headline, processes): replica
    k (k = 1, 2, ...) measures the cells with more than k processes, unless `folder`
    already holds its output for all of them (a resumed run). `spec_of(cells)` is the
    spec of a replica of those cells; `label` tells ranks apart in file names. Returns
    (finding id, case label) -> each replica's entry for that cell, in replica order."""
    found: dict[tuple[str, str], list[dict]] = {(f, c): [] for f, c, _, _ in cells}
    rounds = max((p for *_, p in cells), default=1)
    for k in range(1, rounds):
        mine = [(f, c, h) for f, c, h, p in cells if p > k]
        path = Path(folder) / FOLDER / f"{label}replica{k}.json"
        kept = load_replica(path)
        if not all((f, c) in kept for f, c, _ in mine):
            if progress is not None:
                progress(f"replica {k} of {rounds - 1}: {len(mine)} cells in a fresh process")
            kept = run_replica(spec_of(mine), path)
        for f, c, _ in mine:
            found[(f, c)].append(kept.get((f, c), {"error": "not measured by the replica"}))
    return found


def _spec(argv: list[str]) -> ReplicaSpec:
    """The one argument, a `ReplicaSpec` as JSON; UsageError naming what is wrong."""
    if len(argv) != 1:
        raise UsageError(f"expected one argument, a replica spec as JSON (python -m "
                         f"harness.replica SPEC_JSON); got {len(argv)}")
    try:
        raw = json.loads(argv[0])
        return ReplicaSpec(**{**raw, "cells": tuple(tuple(c) for c in raw["cells"])})
    except (ValueError, TypeError, KeyError) as err:
        raise UsageError(f"SPEC_JSON: expected the fields of harness.replica.ReplicaSpec; "
                         f"got {argv[0][:200]!r} ({type(err).__name__}: {err})") from err


@command
def main(argv: list[str] | None = None) -> int:
    spec = _spec(sys.argv[1:] if argv is None else argv)
    _die_with_parent(spec.parent)
    try:
        document = measure(spec)
    except registry.FindingsModuleError as err:  # the run's own --findings-module, not importable here
        raise UsageError(str(err)) from err
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
