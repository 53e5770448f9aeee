"""`python -m esper_review.gae_tools.targets [RUN]`: our best GAE method against the peers, per target cell.

Reads the `B4-CR-03` rows of a run (default `latest`) and prints, for each cell of
num_envs x max_steps in the target grid (episode dones), our fastest method, the fastest
peer, how many times faster ours is, and the time over the bandwidth floor, then checks
the targets:

- our best method is faster than every peer in every cell of the grid;
- at 1024 x 256 it is within 3x of its memory-bandwidth floor (the bytes it must move at
  the speed of the memory that holds them: L3 there, `harness.measure.bandwidth`);
- at 4 x 25 it takes under 40 microseconds per call.

Exit status: 0 all targets met, 1 some target missed or a cell is missing, 2 usage or
input error, 3 internal error (also in `--help`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import pandas as pd

from harness import exits, options
from harness.exits import UsageError
from esper_review.findings import gae_methods
from esper_review.findings.peers import PEERS
from harness.results import DEFAULT_RESULTS_DIR, check_results_folder, load_run
from harness.report import sense
from harness.report.summary import format_seconds

FINDING = "B4-CR-03"
#: the grid B4-CR-03's default cases cover: its target cells and their T=25, 1024 neighbours
TARGET_ENVS = gae_methods.TARGET_ENVS
TARGET_STEPS = (min(gae_methods.STEPS), *gae_methods.TARGET_STEPS, max(gae_methods.STEPS))
FLOOR_CELL, FLOOR_FACTOR = (1024, 256), 3.0
LATENCY_CELL, LATENCY_LIMIT_S = (4, 25), 40e-6


@dataclass(frozen=True)
class Cell:
    """One target cell's best times (seconds per call); None where nothing was timed."""

    num_envs: int
    max_steps: int
    ours: str | None
    ours_s: float | None
    peer: str | None
    peer_s: float | None
    floor_s: float | None

    @property
    def beats_peers(self) -> bool:
        return self.ours_s is not None and (self.peer_s is None or self.ours_s < self.peer_s)


def _fastest(rows: pd.DataFrame) -> tuple[str | None, float | None]:
    timed = rows[rows["status"] == "ok"].dropna(subset=["median_s"])
    if timed.empty:
        return None, None
    best = timed.loc[timed["median_s"].idxmin()]
    return str(best["variant"]), float(best["median_s"])


def target_cells(summary: pd.DataFrame) -> list[Cell]:
    """The target grid's cells from a run's summary rows (episode dones only)."""
    rows = summary[(summary["finding"] == FINDING) & (summary["p_dones"] == "episode")]
    cells = []
    for envs in TARGET_ENVS:
        for steps in TARGET_STEPS:
            here = rows[(rows["p_num_envs"] == envs) & (rows["p_max_steps"] == steps)]
            is_peer = here["variant"].isin(PEERS)
            ours, ours_s = _fastest(here[~is_peer])
            peer, peer_s = _fastest(here[is_peer])
            floors = here["floor_s"].dropna() if "floor_s" in here else pd.Series(dtype=float)
            floor_s = float(floors.iloc[0]) if not floors.empty else None
            cells.append(Cell(envs, steps, ours, ours_s, peer, peer_s, floor_s))
    return cells


def _lookup(cells: list[Cell], shape: tuple[int, int]) -> Cell:
    return next(c for c in cells if (c.num_envs, c.max_steps) == shape)


def check_targets(cells: list[Cell]) -> list[tuple[str, bool, str]]:
    """(target, met, evidence) for each of the three targets."""
    missing = [f"{c.num_envs}x{c.max_steps}" for c in cells if c.ours_s is None]
    losing = [f"{c.num_envs}x{c.max_steps}" for c in cells if c.ours_s is not None and not c.beats_peers]
    faster = ("missing cells: " + ", ".join(missing)) if missing else (
        "loses at " + ", ".join(losing) if losing else f"all {len(cells)} cells")
    floor_cell, latency_cell = _lookup(cells, FLOOR_CELL), _lookup(cells, LATENCY_CELL)
    if floor_cell.ours_s is None or floor_cell.floor_s is None:
        floor_met, floor_text = False, "not measured"
    else:
        over = floor_cell.ours_s / floor_cell.floor_s
        floor_met, floor_text = over <= FLOOR_FACTOR, f"{over:.2f}x the floor"
    if latency_cell.ours_s is None:
        latency_met, latency_text = False, "not measured"
    else:
        latency_met = latency_cell.ours_s < LATENCY_LIMIT_S
        latency_text = f"{format_seconds(latency_cell.ours_s)} ({latency_cell.ours})"
    return [
        ("faster than every peer in every cell", not missing and not losing, faster),
        (f"within {FLOOR_FACTOR:g}x of the bandwidth floor at {FLOOR_CELL[0]}x{FLOOR_CELL[1]}",
         floor_met, floor_text),
        (f"under {LATENCY_LIMIT_S * 1e6:.0f} us at {LATENCY_CELL[0]}x{LATENCY_CELL[1]}",
         latency_met, latency_text),
    ]


def _time(name: str | None, seconds: float | None) -> str:
    return "-" if seconds is None else f"{name} {format_seconds(seconds)}"


def versus(ours_s: float | None, peer_s: float | None) -> str:
    """'3.2x faster' or '7.5x slower': ours against the peer; '-' where either is missing."""
    if not ours_s or not peer_s:
        return "-"
    if ours_s <= peer_s:
        return f"{peer_s / ours_s:.2g}x faster"
    return f"{ours_s / peer_s:.2g}x slower"


def markdown(cells: list[Cell]) -> str:
    """The per-cell table and the targets, as markdown."""
    lines = ["| envs x steps | our best | best peer | ours vs peer | ours / floor |",
             "|---|---|---|---|---|"]
    for c in cells:
        floor = f"{c.ours_s / c.floor_s:.1f}x" if c.ours_s and c.floor_s else "-"
        lines.append(f"| {c.num_envs} x {c.max_steps} | {_time(c.ours, c.ours_s)} | "
                     f"{_time(c.peer, c.peer_s)} | {versus(c.ours_s, c.peer_s)} | {floor} |")
    lines += ["", "| target | met | evidence |", "|---|---|---|"]
    lines += [f"| {name} | {'yes' if met else 'NO'} | {text} |"
              for name, met, text in check_targets(cells)]
    return "\n".join(lines)


@exits.command
def main(argv: list[str] | None = None) -> int:
    p = options.Parser(prog="python -m esper_review.gae_tools.targets",
                       description=__doc__.split("\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=exits.epilog("every target met", "a target missed, or a target "
                                                               "cell missing from the run"))
    exits.add_version(p)
    p.add_argument("run", nargs="?", default="latest", help="run folder, run id, or latest")
    p.add_argument("--results", type=options.path, default=DEFAULT_RESULTS_DIR, metavar="DIR",
                   help="where run ids are looked up (default results/)")
    args = p.parse_args(argv)
    if args.results.exists():  # a file is named here; a missing folder where a run is looked up
        check_results_folder(args.results, "--results")
    run = load_run(args.run, args.results, "RUN")  # a RunFileError names the file: exit 2
    if FINDING not in set(run.summary.get("finding", [])):
        raise UsageError(f"run {run.run_id}: expected {FINDING} rows; it has none (measure "
                         f"them with `python -m harness.run --findings {FINDING}`)")
    found = sense.problems(run.summary[run.summary["finding"] == FINDING])
    if found:
        raise exits.Nonsense(f"targets of {run.run_id}", found)
    cells = target_cells(run.summary)
    print(f"run {run.run_id} ({run.metadata.get('cpu_model') or run.metadata.get('device_name')}, "
          f"torch threads: {run.metadata.get('threads')})\n")
    print(markdown(cells))
    return 0 if all(met for _, met, _ in check_targets(cells)) else 1


if __name__ == "__main__":
    sys.exit(main())
