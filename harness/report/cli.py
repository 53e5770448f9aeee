"""`python -m harness.report`: render a run (or two runs compared, or the history) as HTML.

    python -m harness.report                        # the latest run -> reports/<run-id>/
    python -m harness.report RUN --compare OLD_RUN  # RUN vs OLD_RUN -> reports/<RUN>-vs-<OLD>/
    python -m harness.report --history              # every run in results/ -> reports/history/
    python -m harness.report RUN --markdown [FILE]  # also a short markdown summary

RUN and OLD_RUN are run folders, run ids under --results, or `latest`. The report reads
the runs' files only. After writing, the index of the folder holding the report
(reports/index.html by default) is rewritten, if harness.report wrote it (else exit 2).
Every option and input is checked before anything is rendered.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness import exits, lock, options
from harness.exits import UsageError
from harness.measure.decision import DEFAULT_MARGIN
from harness.report.data import ReportError, open_run
from harness.report.folder import check_destination
from harness.report.history import build_history
from harness.report.markdown import compare_markdown, run_markdown
from harness.report.site import (
    check_index, render_compare, render_history, render_run, update_index,
)
from harness.results import DEFAULT_RESULTS_DIR, Run, atomic_write_text, check_results_folder

DEFAULT_REPORTS_DIR = Path("reports")
HISTORY_FOLDER = "history"
#: `--markdown` without a file: write to standard output
STDOUT = "-"


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(prog="python -m harness.report",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=exits.epilog("report written"))
    exits.add_version(p)
    p.add_argument("run", nargs="?", default="latest",
                   help="run folder, run id, or latest (default)")
    p.add_argument("--compare", metavar="OLD_RUN",
                   help="compare RUN (new) against OLD_RUN (old): per row, its ratio to "
                        "the reference, new / old")
    p.add_argument("--history", action="store_true",
                   help="plot each finding's headline ratio across every run in --results "
                        f"(default out: reports/{HISTORY_FOLDER}/)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="report folder (default reports/<run-id>/ or reports/<new>-vs-<old>/); "
                        "its parent's index.html is updated")
    p.add_argument("--results", type=options.path, default=None, metavar="DIR",
                   help="where run ids, latest and --history's runs are looked up "
                        f"(default {DEFAULT_RESULTS_DIR}/)")
    p.add_argument("--markdown", nargs="?", const=STDOUT, metavar="FILE",
                   help="also write a short markdown summary (one line per finding, a link to "
                        "the HTML) to FILE, or to standard output without one (put RUN "
                        "before --markdown)")
    p.add_argument("--force", action="store_true",
                   help="compare runs even if their machine fingerprints differ")
    p.add_argument("--margin", type=options.fraction, default=DEFAULT_MARGIN,
                   metavar="FRACTION",
                   help=f"compare: the margin of the words, as a fraction: new / old within "
                        f"1 + margin either way is 'same', wholly beyond it 'slower' or "
                        f"'faster' (default {DEFAULT_MARGIN}, as harness.run's --margin)")
    return p


def check_out(out: Path, protect: list[Path] | tuple[Path, ...] = ()) -> None:
    """UsageError unless `out` can be a report folder (`harness.report.folder`: never the
    current folder, home, a repository root or a folder holding the runs in `protect`;
    empty or an earlier report), writable, and its parent's index.html (rewritten after
    the report) is one harness.report wrote."""
    check_destination(out, protect)
    exits.check_writable(out / "index.html", "--out")
    exits.check_writable(out.parent / "index.html", "--out")
    check_index(out.parent)


def check_options(args: argparse.Namespace) -> Path:
    """Options that are wrong in themselves or together; returns the results folder."""
    if args.history and (args.compare or args.run != "latest" or args.markdown):
        given = [name for name, on in (("--compare", args.compare), ("RUN", args.run != "latest"),
                                       ("--markdown", args.markdown)) if on]
        raise UsageError(f"--history: expected on its own (with --results and --out); got it "
                         f"with {', '.join(given)}")
    if args.out is not None:  # named before RUN is looked up, as the other options are
        exits.check_fits(args.out, "--out")
    if args.results is not None:
        check_results_folder(args.results, "--results")
    if args.markdown not in (None, STDOUT):
        exits.check_writable(Path(args.markdown), "--markdown")
    return args.results if args.results is not None else DEFAULT_RESULTS_DIR


def _history(args: argparse.Namespace, results: Path) -> Path:
    if not results.is_dir():
        raise UsageError(f"--results: expected a folder of runs; got {results} (no such "
                         "folder); make a run with python -m harness.run")
    out = args.out or DEFAULT_REPORTS_DIR / HISTORY_FOLDER
    check_out(out, [results])
    history = build_history(results)
    if not history.runs:
        readable = f" readable: {'; '.join(history.skipped)}" if history.skipped else ""
        raise UsageError(f"--results: expected run folders (each with a run.json) in {results}; "
                         f"got none{readable}")
    with lock.hold(Path(os.path.abspath(out)).parent, f"--out {out}"):
        page = render_history(history, out, results)
        update_index(out.parent)
    return page


def _markdown_target(markdown: str, page: Path) -> tuple[Path | None, str]:
    """(file or None for stdout, the link to the HTML page as seen from there)."""
    if markdown == STDOUT:
        return None, page.as_posix()
    target = Path(markdown)
    return target, Path(os.path.relpath(page.resolve(), target.resolve().parent)).as_posix()


def render(run, *, compare=None, out: Path | None = None,
           results_dir: Path = DEFAULT_RESULTS_DIR, force: bool = False,
           margin: float = DEFAULT_MARGIN) -> Path:
    """Render a run's report (or RUN vs `compare`) and update the index; returns the page.

    Raises ReportError (a UsageError, exit 2) for a missing or corrupt run, an --out that
    cannot be written, or a parent index.html that harness.report did not write.
    """
    new = open_run(run, results_dir)
    old = open_run(compare, results_dir) if compare is not None else None
    return render_runs(new, old, out, force=force, margin=margin)


def render_runs(new: Run, old: Run | None, out: Path | None, *, force: bool = False,
                margin: float = DEFAULT_MARGIN) -> Path:
    """`render` for runs already read."""
    out = Path(out or DEFAULT_REPORTS_DIR / (
        new.run_id if old is None else f"{new.run_id}-vs-{old.run_id}"))
    try:
        check_out(out, [new.folder] + ([old.folder] if old is not None else []))
    except ReportError:
        raise
    except UsageError as err:  # as a ReportError, which harness.run reports without failing
        raise ReportError(str(err)) from err
    # one writer per reports folder: the report, its staging folder and the index live there
    with lock.hold(Path(os.path.abspath(out)).parent, f"--out {out}"):
        if old is None:
            page = render_run(new, out)
        else:
            page = render_compare(new, old, out, force=force, margin=margin)
        update_index(out.parent)
    return page


@exits.command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = check_options(args)
    if args.history:
        print(f"history: {_history(args, results)}")
        return exits.PASS
    new = open_run(args.run, results, "RUN")
    old = open_run(args.compare, results, "--compare") if args.compare is not None else None
    page = render_runs(new, old, args.out, force=args.force, margin=args.margin)
    if args.markdown is not None:
        target, link = _markdown_target(args.markdown, page)
        text = run_markdown(new, link) if old is None else compare_markdown(
            new, old, link, margin=args.margin, force=args.force)
        if target is None:
            print(text)
        else:
            atomic_write_text(target, text + "\n")
    where = sys.stderr if args.markdown == STDOUT else sys.stdout
    print(f"report: {page}", file=where)
    return exits.PASS


if __name__ == "__main__":
    sys.exit(main())
