"""`python -m harness.run`: measure every reviewed variant into results/<run-id>/.

Then, unless --no-report, render reports/<run-id>/index.html and the reports index
(`harness.report`); with --pyspy, also record a py-spy flamegraph into the run folder.

Exit status: 0 every variant ran and agreed with its reference; 1 some variant failed
its correctness check or raised; 2 usage error; 130 interrupted (what was measured is kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from harness import findings as registry
from harness.measure.bandwidth import measure_copy_bandwidth
from harness.measure.flamegraph import record_flamegraph
from harness.measure.machine import describe
from harness.measure.timing import pinned_threads
from harness.report.cli import render
from harness.report.data import ReportError
from harness.report.summary import summary_table
from harness.results import DEFAULT_RESULTS_DIR, RunWriter
from harness.runner import RunOptions, run_finding


class UsageError(Exception):
    """Bad command-line input: one line, exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.run", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where to run (default auto: cuda when available)")
    p.add_argument("--quick", action="store_true", help="small cases and budgets (CI-sized)")
    p.add_argument("--findings", nargs="+", metavar="ID", help="only these finding ids")
    p.add_argument("--list", action="store_true", help="list the findings and exit")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="sampling seconds per finding x case (default 1.0, quick 0.3)")
    p.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR, metavar="DIR",
                   help="results folder (default results/)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiling pass and traces")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads, fixed for the run (default: torch's current count)")
    p.add_argument("--pyspy", action="store_true",
                   help="also record a py-spy flamegraph of a few esper.train iterations")
    p.add_argument("--no-report", action="store_true", help="do not render the HTML report")
    p.add_argument("--reports", type=Path, default=None, metavar="DIR",
                   help="report folder root (default: reports/ beside the results folder)")
    return p


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch.cuda.is_available() is False on this machine")
    return torch.device(name)


def list_findings(quick: bool) -> str:
    lines = []
    for f in registry.select(None):
        cases = f.cases(quick)
        lines.append(f"{f.id:16s} {f.title}\n{'':16s} variants: {', '.join(f.variants)} "
                     f"(baseline {f.baseline}); {len(cases)} cases")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.list:
            print(list_findings(args.quick))
            return 0
        device = resolve_device(args.device)
        selected = registry.select(args.findings)
        if args.time_budget is not None and not args.time_budget > 0:
            raise UsageError(f"--time-budget: expected seconds > 0; got {args.time_budget}")
        if args.threads is not None and args.threads <= 0:
            raise UsageError(f"--threads: expected a positive int; got {args.threads}")
    except (UsageError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    options = RunOptions(
        device=device, quick=args.quick, seed=args.seed,
        time_budget_s=args.time_budget or (0.3 if args.quick else 1.0),
        min_samples=5 if args.quick else 10, profile=not args.no_profile,
    )
    with pinned_threads(args.threads or torch.get_num_threads()):
        code, folder = _run(selected, options, args.out, args.pyspy)
    if not args.no_report and code != 130:
        _report(folder, args.reports or args.out.parent / "reports")
    return code


def _report(folder: Path, reports: Path) -> None:
    """Render reports/<run-id>/ and the index; a report problem never fails the run."""
    try:
        page = render(folder, out=reports / folder.name)
    except ReportError as err:
        print(f"report not written: {err}", file=sys.stderr)
        return
    print(f"report: {page}")


def _run(selected, options: RunOptions, out: Path, pyspy: bool) -> tuple[int, Path]:
    stamp = dt.datetime.now(dt.timezone.utc)
    run_id = f"{stamp:%Y%m%d-%H%M%S}-{options.device.type}"
    metadata = {"created": stamp.isoformat(timespec="seconds"), "quick": options.quick,
                "seed": options.seed, "time_budget_s": options.time_budget_s,
                "profile": options.profile, "findings": [f.id for f in selected],
                **describe(options.device)}
    if any(f.min_bytes is not None for f in selected):
        # once per run, before any finding, with the run's threads: the bandwidth floor
        bandwidth = measure_copy_bandwidth(options.device)
        options = dataclasses.replace(options, copy_bandwidth_bytes_per_s=bandwidth)
        metadata["copy_bandwidth_bytes_per_s"] = bandwidth
    writer = RunWriter(out, run_id, metadata)
    total = sum(len(f.cases(options.quick)) for f in selected)
    status = "complete"
    try:
        with tqdm(total=total, unit="case", file=sys.stderr) as bar:
            for finding in selected:
                bar.set_description(finding.id)
                trace_dir = writer.traces if options.profile else None
                summary, samples = run_finding(finding, options, trace_dir,
                                               on_case=lambda _: bar.update(1))
                writer.add(summary, samples)
    except KeyboardInterrupt:
        status = "interrupted"
    if pyspy and status == "complete":  # after the timing, so that it disturbs nothing
        writer.metadata["pyspy"] = record_flamegraph(writer.folder)
        print(f"py-spy: {writer.metadata['pyspy']['status']}: "
              f"{writer.metadata['pyspy']['detail']}", file=sys.stderr)
    writer.write(status=status)
    table = pd.DataFrame(writer.summary)
    print(summary_table(table))
    print(f"\nresults: {writer.folder}  ({status})")
    if status == "interrupted":
        return 130, writer.folder
    bad = table["status"].isin(["mismatch", "failed"]).any() if not table.empty else False
    return (1 if bad else 0), writer.folder


if __name__ == "__main__":
    sys.exit(main())
