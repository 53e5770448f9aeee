"""`python -m harness.report`: render a run (or two runs compared) as HTML with plots.

    python -m harness.report                        # the latest run -> reports/<run-id>/
    python -m harness.report RUN --compare OLD_RUN  # RUN vs OLD_RUN -> reports/<RUN>-vs-<OLD>/

RUN and OLD_RUN are run folders, run ids under --results, or `latest`. The report reads
the runs' files only. After writing, the index of the folder holding the report
(reports/index.html by default) is rewritten. Exit status: 0 written; 2 bad input (no
such run, another schema, runs from different machines without --force).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.report.compare import DEFAULT_FACTOR
from harness.report.data import ReportError, open_run
from harness.report.site import render_compare, render_run, update_index
from harness.results import DEFAULT_RESULTS_DIR

DEFAULT_REPORTS_DIR = Path("reports")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.report",
                                description=__doc__.split("\n")[0])
    p.add_argument("run", nargs="?", default="latest",
                   help="run folder, run id, or latest (default)")
    p.add_argument("--compare", metavar="OLD_RUN",
                   help="compare RUN (new) against OLD_RUN (old): ratio new / old per row")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="report folder (default reports/<run-id>/ or reports/<new>-vs-<old>/); "
                        "its parent's index.html is updated")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS_DIR, metavar="DIR",
                   help="where run ids are looked up (default results/)")
    p.add_argument("--force", action="store_true",
                   help="compare runs even if their machine fingerprints differ")
    p.add_argument("--factor", type=float, default=DEFAULT_FACTOR,
                   help=f"compare: smallest time ratio that counts as a change "
                        f"(default {DEFAULT_FACTOR})")
    return p


def render(run, *, compare=None, out: Path | None = None,
           results_dir: Path = DEFAULT_RESULTS_DIR, force: bool = False,
           factor: float = DEFAULT_FACTOR) -> Path:
    """Render a run's report (or RUN vs `compare`) and update the index; returns the page."""
    new = open_run(run, results_dir)
    if compare is None:
        out = out or DEFAULT_REPORTS_DIR / new.run_id
        page = render_run(new, out)
    else:
        old = open_run(compare, results_dir)
        out = out or DEFAULT_REPORTS_DIR / f"{new.run_id}-vs-{old.run_id}"
        page = render_compare(new, old, out, force=force, factor=factor)
    update_index(Path(out).parent)
    return page


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        page = render(args.run, compare=args.compare, out=args.out, results_dir=args.results,
                      force=args.force, factor=args.factor)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
