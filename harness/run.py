"""`python -m harness.run`: measure every reviewed variant into results/<run-id>/.

Each cell (a finding at one case) is journaled the moment it is measured, so Ctrl-C,
SIGTERM or even SIGKILL lose at most the cell in progress; `--resume RUN` measures only
the cells a run is missing. Then, unless --no-report, render reports/<run-id>/index.html
and the reports index (`harness.report`); with --pyspy, also record a py-spy flamegraph
into the run folder.
"""

from __future__ import annotations

if __name__ == "__main__":  # `python -m harness.run`: this module again, under its own name,
    # so that Ctrl-C while its imports load (torch: seconds) is exit 130, not a traceback
    import sys

    from harness import spawn
    from harness.exits import run_module

    spawn.start_spare(sys.argv[1:])  # the first worker imports beside this process
    try:
        _status = run_module("harness.run")
    finally:
        spawn.discard_spare()
    _ranks = sys.modules.get("harness.ranks")  # absent when the imports were interrupted
    (_ranks.exit_process if _ranks else sys.exit)(_status)

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import importlib
import json
import shlex
import sys
import time
from pathlib import Path

#: when this run started (the plan counts the run's wall seconds from here): the process's
#: start, the imports below included (torch and pandas: seconds, which the user waits for
#: as for the rest), or the call's for a later run in one process (`_main`)
STARTED = time.perf_counter()

import pandas as pd
import torch

from harness import explain, findings as registry
from harness import lock, options, ranks, replica, spawn
from harness.exits import (
    UsageError, add_version, check_writable_folder, command, epilog, interruption, loading,
    signals_deferred, version,
)
from harness.isa_checks import IsaChecks, check_isas_lazily
from harness.measure.bandwidth import measure_copy_bandwidth
from harness.measure.flamegraph import record_flamegraph
from harness.measure.machine import (
    KERNEL_FIELDS, describe, fingerprint_changes, git_state, isolate_compile_cache,
)
from harness.measure.timing import pinned_threads
from harness.progress import Progress
from harness.project import load_findings
from harness.report.reliability import reliability
from harness.report.summary import (
    compiled_line, format_seconds, load_line, process_line, sampling_line, summary_table,
    time_line,
)
from harness.results import (
    DEFAULT_RESULTS_DIR, DiskFullError, RunFileError, RunWriter, atomic_write_text, load_run,
    read_cells, remove_orphan_temps, resolve_run_folder,
)
from harness.measure.decision import DEFAULT_MARGIN
from harness.combine import combine
from harness.plan import (
    BUDGET_LEFT_OUT, FLOOR_S, GUESS_FIXED_S, Plan, affordable, report_s
)
from harness.runner import PLACEBO_MODES, CaseRun, RunOptions

#: the fewest rounds a process takes of a cell whose share cannot pay the run's minimum
#: (the quick run's minimum)
FEWEST_ROUNDS = 5
#: the run's wall seconds by default, and with --quick (report included)
DEFAULT_BUDGET_S = 140.0
QUICK_BUDGET_S = 35.0
#: the most processes that time one cell
MAX_PROCESSES = 6

#: options a resumed run keeps from the run it continues (dest -> flag)
MEASUREMENT_OPTIONS = {"device": "--device", "quick": "--quick", "findings": "--findings",
                       "findings_module": "--findings-module", "all": "--all",
                       "budget": "--budget", "precision": "--precision",
                       "margin": "--margin", "placebo": "--placebo",
                       "no_profile": "--no-profile", "sources": "--sources",
                       "seed": "--seed", "threads": "--threads",
                       "processes": "--processes", "every_cell": "--every-cell"}


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(
        prog="python -m harness.run", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog("every variant ran and agreed with its reference",
                      "some variant failed its correctness check or raised"),
    )
    add_version(p)
    p.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                   help="where to run (default auto: cuda when available)")
    p.add_argument("--quick", action="store_true", help="small cases and budgets (CI-sized)")
    p.add_argument("--findings", nargs="+", metavar="ID",
                   help="only these finding ids (default: every finding of the findings "
                        "modules; long findings run only when named, or with --all)")
    p.add_argument("--all", action="store_true",
                   help="every finding, the long ones too (learning runs; see --list)")
    p.add_argument("--findings-module", action="append", metavar="PKG.MODULE",
                   help="import this module for its harness.findings.register calls (your "
                        "own findings; repeatable; also read from [tool.esper-bench] "
                        "findings-modules in the nearest pyproject.toml)")
    p.add_argument("--list", action="store_true", help="list the findings and exit")
    p.add_argument("--budget", type=options.seconds, default=None, metavar="S",
                   help=f"the run's wall seconds, report included (default {DEFAULT_BUDGET_S:g}, "
                        f"quick {QUICK_BUDGET_S:g}): the plan shares its sampling out over the "
                        "cells (a finding of slow calls weighs its budget_factor) and their "
                        "processes as the run goes; a cell whose share cannot pay the "
                        f"minimum rounds takes fewer (at least {FEWEST_ROUNDS}); every "
                        "finding's headline cell comes first, and a profile or a further cell "
                        "the budget cannot pay is left out, said in its rows")
    p.add_argument("--every-cell", action="store_true",
                   help="measure every cell, however long it takes: the budget then shares "
                        "out sampling and profiles only (a small --budget samples each cell's "
                        "minimum rounds)")
    p.add_argument("--margin", type=options.fraction, default=DEFAULT_MARGIN, metavar="FRACTION",
                   help="the practical margin of the words: a ratio whose interval lies "
                        "within +-FRACTION is 'same', wholly beyond it 'faster' or 'slower', "
                        f"else 'inconclusive' (default {DEFAULT_MARGIN}; a finding may "
                        "declare its own)")
    p.add_argument("--precision", type=options.fraction_or_zero, default=0.03, metavar="FRACTION",
                   help="a variant stops sampling once its word is decided and its ratio's "
                        "interval is within +-FRACTION of it (default 0.03); 0: every "
                        "variant samples the whole budget")
    p.add_argument("--placebo", choices=PLACEBO_MODES, default="headline",
                   help="where the baseline is also timed against a second copy of itself, "
                        "the run's measured noise floor (default: each finding's headline "
                        "cell)")
    p.add_argument("--processes", type=options.integer_from(2, MAX_PROCESSES), default=2,
                   metavar="N",
                   help="fresh processes that time every cell, interleaved: the run's own "
                        "and N - 1 workers (default 2); a row whose processes disagree gets "
                        f"more, up to {MAX_PROCESSES}, where the budget allows")
    p.add_argument("--out", type=options.path, default=DEFAULT_RESULTS_DIR, metavar="DIR",
                   help="results folder (default results/)")
    p.add_argument("--resume", metavar="RUN",
                   help="continue RUN (a folder, a run id under --out, or latest): measure "
                        "only its missing cells, with its options, on the same machine")
    p.add_argument("--no-profile", action="store_true", help="skip the profiling pass and traces")
    p.add_argument("--sources", action="store_true",
                   help="also record where each profiled variant's ops, host syncs and "
                        "allocations come from, by line of your code (a second profiled "
                        "call per variant); report --compare and --markdown then name the "
                        "lines behind a counter that changed")
    p.add_argument("--seed", type=options.seed, default=0, help="input seed (default 0)")
    p.add_argument("--threads", type=options.positive_int, default=None,
                   help="torch CPU threads, fixed for the run (default: torch's current count, "
                        "one fewer for each core other processes keep busy at the start)")
    p.add_argument("--pyspy", action="store_true",
                   help="also record a py-spy flamegraph of the findings modules' short "
                        "program (harness.Defaults.flamegraph)")
    p.add_argument("--no-report", action="store_true", help="do not render the HTML report")
    p.add_argument("--reports", type=options.path, default=None, metavar="DIR",
                   help="report folder root (default: reports/ beside the results folder)")
    return p


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cpu`, `cuda`, `cuda:N` checked against
    this machine."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UsageError(f"--device: expected auto, cpu, cuda or cuda:N; got {name!r}") from err
    if device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index):
        raise UsageError(f"--device: expected auto, cpu, cuda or cuda:N; got {name!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: torch.cuda.is_available() is False on this machine")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise UsageError(f"--device: expected cuda:0 to cuda:{count - 1} on this machine "
                             f"({count} device(s)); got {name!r}")
    return device


def list_findings(quick: bool, modules: list[str]) -> str:
    """One entry per finding of the findings modules `modules` (loaded), long ones too."""
    lines = []
    for f in registry.select(None, include_long=True, modules=modules):
        try:
            cases = f"{len(f.cases(quick))} cases"
        except Exception as err:  # user code; a run records it as the finding's failed row
            cases = f"cases(quick={quick}) raised {type(err).__name__}: {err}"
        duration = ""
        if f.about.duration_s is not None:
            duration = (f"; about {format_seconds(f.about.duration_s[0])} quick, "
                        f"{format_seconds(f.about.duration_s[1])} default")
        kind = "long: runs when named or with --all" if f.long else "in the default run"
        lines.append(f"{f.id:16s} {f.title}\n{'':16s} variants: {', '.join(f.variants)} "
                     f"(baseline {f.baseline}); {cases}; {kind}{duration}; from "
                     f"{registry.ORIGINS.get(f.id, 'register()')}")
    return "\n".join(lines)


def _explicit(argv: list[str] | None) -> dict:
    """The options given on the command line (not defaults): dest -> value."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


def _recorded_args(args: argparse.Namespace, metadata: dict) -> argparse.Namespace:
    """`args` with the measurement options of the run being resumed."""
    recorded = metadata.get("options")
    if not isinstance(recorded, dict):
        raise UsageError(f"--resume {args.resume}: expected a run that recorded its options; "
                         "got one written before --resume existed; start a new run")
    return argparse.Namespace(**{**vars(args),
                                 **{k: recorded[k] for k in MEASUREMENT_OPTIONS if k in recorded}})


def _check_resumable(args, explicit: dict, metadata: dict, device: torch.device) -> None:
    """UsageError unless the run can be continued here, as it was started."""
    recorded = metadata["options"]
    if "device" in explicit:  # `auto` and `cuda` name the device the run resolved them to
        explicit = {**explicit, "device": str(resolve_device(explicit["device"]))}
    for dest, flag in MEASUREMENT_OPTIONS.items():
        if dest in explicit and explicit[dest] != recorded.get(dest):
            raise UsageError(
                f"--resume {args.resume}: {flag}: the run was measured with "
                f"{recorded.get(dest)!r}; got {explicit[dest]!r}. A resumed run keeps its "
                "options; start a new run to change them")
    different = fingerprint_changes(metadata, describe(device))
    if different:
        detail = "; ".join(f"{k}: run {a!r}, here {b!r}" for k, a, b in different)
        same = ("; this may be this machine, with other CPU kernels (ATEN_CPU_CAPABILITY, "
                "ONEDNN_MAX_CPU_ISA)" if all(k in KERNEL_FIELDS for k, _, _ in different) else "")
        raise UsageError(f"--resume {args.resume}: expected the machine and CPU kernel path "
                         f"the run was measured on; got another ({detail}){same}. Its "
                         "timings would not be comparable")
    here = code_state(args.findings_module).get("git_commit")
    if metadata.get("git_commit") != here:
        raise UsageError(f"--resume {args.resume}: expected the code the run measured "
                         f"(commit {metadata.get('git_commit')}); got commit {here}")


def _options(args: argparse.Namespace, device: torch.device) -> RunOptions:
    if getattr(args, "sources", False) and args.no_profile:
        raise UsageError("--sources: expected with the profiling pass (it splits the counters "
                         "the profiler counts); got it with --no-profile")
    return RunOptions(
        device=device, quick=args.quick, seed=args.seed,
        budget_s=args.budget or (QUICK_BUDGET_S if args.quick else DEFAULT_BUDGET_S),
        min_samples=FEWEST_ROUNDS if args.quick else 8, precision=args.precision, margin=args.margin,
        placebo=args.placebo, profile=not args.no_profile,
        sources=bool(getattr(args, "sources", False)),
        processes=getattr(args, "processes", None) or 2,
        every_cell=bool(getattr(args, "every_cell", False)),
    )


def _select(ids: list[str] | None, modules: list[str],
            include_long: bool = False) -> list[registry.Finding]:
    """The findings to measure, of the findings modules `modules` (loaded): `ids`, else
    every finding of theirs (long ones only with `include_long`, or where they have no
    other)."""
    if ids and include_long:
        raise UsageError(f"--all: expected without --findings (it names every finding); "
                         f"got --findings {' '.join(ids)}")
    own = registry.from_modules(modules)
    if not include_long:
        own = [i for i in own if not registry.FINDINGS[i].long] or own
    try:
        return registry.select(ids or own, include_long, modules=modules)
    except ValueError as err:  # names the unknown id, the nearest and the known ones
        raise UsageError(str(err)) from err


def _load_modules(args: argparse.Namespace, resumed: bool) -> None:
    """Import the findings modules into `args.findings_module`: a new run's are those the
    nearest pyproject.toml names, then --findings-module; a resumed run's exactly those it
    recorded with its options (the project's, for a run that recorded none)."""
    exact = resumed and bool(args.findings_module)
    with loading():  # findings modules load torch's compiler and numba: C++ extensions
        _, modules = load_findings(args.findings_module, with_project=not exact)
    args.findings_module = list(modules)


def _main(argv: list[str] | None = None) -> int:
    global STARTED, _COMMANDS
    if _COMMANDS:  # a later run in this process (a test's): its budget counts from now
        STARTED = time.perf_counter()
    _COMMANDS += 1
    with contextlib.ExitStack() as writing:  # a resumed run's folder lock, from the start
        return _run(argv, writing)


def _run(argv: list[str] | None, writing: contextlib.ExitStack) -> int:
    args = build_parser().parse_args(argv)
    isolate_compile_cache()
    check_isas_lazily()  # before any finding's module imports inductor
    if args.resume is None:  # a resumed run imports the modules it recorded, below
        _load_modules(args, resumed=False)
    if args.list:
        print(list_findings(args.quick, args.findings_module))
        return 0
    try:
        launch = ranks.Launch.from_environment()
        requested = launch.device(args.device)
    except ValueError as err:
        raise UsageError(str(err)) from err
    resumed = None
    if args.resume is not None:  # under torchrun every rank reads it: a shared file system
        folder = resolve_run_folder(args.resume, args.out, "--resume")
        if launch.leader:  # one writer per run: a second --resume stops here, changing nothing
            writing.enter_context(lock.hold(folder, f"--resume {args.resume}"))
        resumed = load_run(folder)
        args = _recorded_args(args, resumed.metadata)
        _load_modules(args, resumed=True)
        requested = launch.device(args.device) if launch.distributed else args.device
    device = resolve_device(requested)
    options = _options(args, device)
    # each finding's cases listed once; one whose cases() fails is one failed row
    selected = [registry.planned(f, options.quick)
                for f in _select(args.findings, args.findings_module, args.all)]
    # every input is checked on every rank before the first collective: a rank that
    # stopped alone would leave the others waiting
    check_writable_folder(resumed.folder if resumed else args.out, "--out")
    if launch.leader:  # what a killed run left half-written: found and removed, said
        remove_orphan_temps(args.out)
    reports = args.reports or args.out.parent / "reports"
    if not args.no_report:
        check_writable_folder(reports, "--reports")
    options = dataclasses.replace(options, report=not args.no_report, report_s=report_s(
        None if args.no_report else earlier_report(reports),
        0 if args.no_report else len(selected), options.budget_s))
    if resumed is not None:
        if resumed.metadata.get("status") == "running":
            raise UsageError(f"--resume {args.resume}: expected a run that has stopped; "
                             f"got one still running (pid {resumed.metadata.get('pid')})")
    # a resumed run keeps the count it ran with, even where it was torch's default then
    recorded_threads = resumed.metadata.get("threads") if resumed is not None else None
    threads = args.threads or recorded_threads
    if threads is None:
        threads = ranks.timing_threads(launch)
        if not launch.distributed:
            free = ranks.free_threads(threads, own=spawn.spare_pids())
            if free < threads:
                print(f"threads: {free}, not {threads}: other processes keep "
                      f"{threads - free} of the cores busy, and a torch thread more than the "
                      "free cores slows every parallel region (--threads N to choose)",
                      flush=True)
            threads = free
    group = ranks.start(launch, device)
    opened: list[RunWriter] = []  # the run once it exists, even if a signal comes right after
    try:
        with pinned_threads(threads):
            if resumed is not None:
                _check_resumable(args, _explicit(argv), resumed.metadata, device)
            writer = _open_run(args, options, selected, resumed, launch, group, opened)
            code = _measure(writer, selected, options, args.pyspy, launch, group)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM/SIGHUP (harness.exits.Terminated)
        if not opened:  # stopped before the run existed: nothing to keep
            raise
        return _interrupted(opened[0], launch, err)
    except Exception as err:
        stopped = interruption(err)  # an error a library raised as the signal unwound it
        if stopped is None or not opened:
            raise
        return _interrupted(opened[0], launch, stopped)
    finally:
        for opened_writer in opened:
            opened_writer.close()
        ranks.stop(launch)
    if launch.leader and not args.no_report and code not in (130, 143, 129):
        _report(writer.folder, reports, len(selected))
    return code


def _open_run(args, options: RunOptions, selected, resumed, launch: ranks.Launch,
              group, opened: list) -> RunWriter:
    """Rank 0 creates the run (or reopens the one resumed) and tells the others its folder.

    The writer is appended to `opened` in the same breath as it is created (signals held),
    so that an interruption from then on finds the run to mark interrupted."""
    message = None
    if launch.leader:
        try:
            with signals_deferred():
                opened.append(RunWriter.reopen(resumed.folder, f"--resume {args.resume}")
                              if resumed is not None
                              else _new_run(args, options, selected, launch))
            message = ("ok", str(opened[0].folder))
        except Exception as err:  # the other ranks must hear of it, not wait
            ranks.broadcast(("error", f"{type(err).__name__}: {err}"), group, launch)
            raise
    kind, value = ranks.broadcast(message, group, launch)
    if kind == "error":
        raise UsageError(f"rank 0 could not open the run: {value}")
    if not launch.leader:
        opened.append(RunWriter.attach(Path(value), launch.rank))
    return opened[0]


def _interrupted(writer: RunWriter, launch: ranks.Launch, err: KeyboardInterrupt) -> int:
    """Rank 0 marks the run interrupted (what was measured is in its journal) and says how
    to continue it; every rank returns 128 + the signal. No collective: the other ranks
    are being stopped too."""
    if launch.leader:
        done, total = len(writer.done_cells()), writer.metadata.get("cells_total")
        status = "complete" if total is not None and done >= total else "interrupted"
        with signals_deferred():  # a run that had measured every cell stays complete
            writer.finish(status)
        _print_result(writer, pd.DataFrame(writer.summary), status)
        if status == "interrupted":
            print(f"stopped after {done} of {total} cells; continue with: python -m harness.run "
                  f"--resume {shlex.quote(writer.folder.name)} --out "
                  f"{shlex.quote(str(writer.results_dir))}", file=sys.stderr)
    return 128 + getattr(err, "signum", 2)


def headline_label(finding: registry.Finding, options: RunOptions) -> str:
    """The label of `finding`'s headline case in this run: `Reading.headline_case` of its
    cases, or the first; a `headline_case` that raises or returns another object falls
    back to the first case, said on stderr."""
    cases = finding.cases(options.quick)
    if finding.reading.headline_case is None:
        return cases[0].label
    try:
        chosen = finding.reading.headline_case(list(cases))
    except Exception as err:  # user code: said, and the first case heads the finding
        print(f"{finding.id}: headline_case raised {type(err).__name__}: {err}; the first "
              "case heads it", file=sys.stderr)
        return cases[0].label
    if chosen not in cases:
        print(f"{finding.id}: headline_case: expected one of the run's cases; got {chosen!r}; "
              "the first case heads it", file=sys.stderr)
        return cases[0].label
    return chosen.label


def finding_info(finding: registry.Finding, options: RunOptions) -> dict:
    """What the report needs to know of `finding`, recorded when the run is made (so that
    it renders from the run's files alone)."""
    cases = finding.cases(options.quick)
    about = finding.about
    return {"title": finding.title, "claim": finding.claim, "ticket": about.ticket,
            "reviewed": about.reviewed, "fix": about.fix, "premise": about.premise,
            "ours": list(finding.ours),
            "notes": list(about.notes), "variants": list(finding.variants),
            "baseline": finding.baseline, "peers": list(finding.peers),
            "answer": list(finding.reading.answer), "claim_factor": finding.reading.claim_factor,
            "proposed": finding.proposed, "phases": list(finding.recording.phases),
            "per_iteration": finding.reading.per_iteration,
            "claim_tolerance": finding.reading.claim_tolerance,
            "margin": finding.margin_under(options.margin), "paired": finding.recording.paired,
            "cases": [c.label for c in cases], "headline_case": headline_label(finding, options),
            "origin": registry.ORIGINS.get(finding.id, "register()")}


def _new_run(args, options: RunOptions, selected, launch: ranks.Launch) -> RunWriter:
    stamp = dt.datetime.now(dt.timezone.utc)
    recorded = {dest: getattr(args, dest) for dest in MEASUREMENT_OPTIONS}
    recorded["device"] = args.device if launch.distributed else str(options.device)
    metadata = {"created": stamp.isoformat(timespec="seconds"), "quick": options.quick,
                "seed": options.seed, "budget_s": options.budget_s,
                "precision": options.precision, "margin": options.margin,
                "placebo": options.placebo, "processes": options.processes,
                "profile": options.profile, "findings": [f.id for f in selected],
                "finding_info": {f.id: finding_info(f, options) for f in selected},
                "options": recorded,
                "cells_total": sum(len(f.cases(options.quick)) for f in selected),
                "world_size": launch.world_size,
                **describe(options.device), **code_state(args.findings_module)}
    return RunWriter.create(args.out, f"{stamp:%Y%m%d-%H%M%S}-{options.device.type}", metadata)


def code_state(modules: list[str]) -> dict:
    """The code a run measured: `git_commit` and `git_dirty` of the git repository holding
    the findings modules (absent outside git), which history orders by, compare names and
    bisect walks; and the measuring tool itself, `tool_version` (and `tool_git_commit`
    where it runs from a git checkout)."""
    state: dict = {"tool_version": version()}
    tool_commit, _ = git_state(Path(__file__).resolve().parent)
    if tool_commit is not None:
        state["tool_git_commit"] = tool_commit
    module = sys.modules.get(modules[0]) if modules else None
    if getattr(module, "__file__", None):
        commit, dirty = git_state(Path(module.__file__).resolve().parent)
        if commit is not None:
            state.update(git_commit=commit, git_dirty=dirty)
    return state


#: what a run's report took, in its folder: the next run keeps that much of its budget
RENDER_FILE = "render.json"


@functools.cache
def load_report_modules() -> float:
    """Import the report's modules (matplotlib, jinja2: a second or more); returns the
    seconds that import took, wherever it happened (a cold run's warm step, while a core
    was idle, or the report): what a fresh process pays, for the next run's reserve. Its
    CPU seconds: its wall seconds beside a cold run's compiling processes were about four
    times what the import costs alone, which the next run kept of its budget for nothing."""
    started = time.thread_time()
    with loading():
        importlib.import_module("harness.report.cli")  # matplotlib and jinja2 load only now
    return time.thread_time() - started


def _report(folder: Path, reports: Path, findings: int) -> None:
    """Render reports/<run-id>/ and the index, and record the seconds it took
    (`RENDER_FILE`: its modules' import where it happened, for the next run's reserve); a
    report problem never fails the run."""
    later = f"render it with: python -m harness.report {shlex.quote(str(folder))}"
    try:
        import_s = load_report_modules()
        from harness.report.cli import render

        imported = time.perf_counter()
        page = render(folder, out=reports / folder.name)
    except UsageError as err:  # the report's input errors (ReportError is one)
        print(f"report not written: {err}; {later}", file=sys.stderr)
        return
    except ImportError as err:  # an environment that cannot load matplotlib or jinja2
        print(f"report not written: its modules did not load ({err}); {later}",
              file=sys.stderr)
        return
    except BaseException as err:
        if interruption(err) is not None:  # stopped while rendering: the run itself is kept
            print(f"report not written (interrupted); {later}", file=sys.stderr)
        raise
    print(f"report: {page}")
    try:
        atomic_write_text(page.parent / RENDER_FILE, json.dumps(
            {"import_s": import_s, "render_s": time.perf_counter() - imported,
             "findings": findings}))
    except OSError as err:  # it only costs the next run's estimate
        print(f"report time not recorded ({err}): the next run guesses it", file=sys.stderr)


def _plan(writer: RunWriter, selected, options: RunOptions, launch: ranks.Launch,
          group) -> list[tuple[int, int, int]]:
    """(finding index, case index, rank) of every cell the journal does not hold yet, as
    rank 0 assigned them (longest expected first; `harness.ranks.assign`)."""
    plan = None
    if launch.leader:
        done = writer.done_cells()
        todo = [(fi, ci, finding, case)
                for fi, finding in enumerate(selected)
                for ci, case in enumerate(finding.cases(options.quick))
                if (finding.id, case.label) not in done]
        if done:
            print(f"resuming {writer.folder.name}: {len(done)} cells measured, "
                  f"{len(todo)} to go", file=sys.stderr)
        expected = expected_seconds([(f, c) for _, _, f, c in todo], writer.results_dir, options)
        assigned = ranks.assign(expected, launch.world_size)
        plan = [(fi, ci, rank) for (fi, ci, _, _), rank in zip(todo, assigned)]
    return ranks.broadcast(plan, group, launch)


def earlier_costs(results_dir: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(finding, case) -> (fixed seconds, all seconds) of the cell in the newest earlier run
    of `results_dir` that journaled it (of its 5 newest): fixed is all but the sampling, in
    every process."""
    known: dict[tuple[str, str], tuple[float, float]] = {}
    runs = sorted((p for p in Path(results_dir).glob("*/cells") if p.is_dir()),
                  key=lambda p: p.stat().st_mtime)[-5:]
    for cells_dir in runs:  # oldest first: newer runs overwrite
        try:
            for cell in read_cells(cells_dir.parent):
                seconds = cell.get("seconds") or {}
                if seconds:
                    total = float(sum(seconds.values()))
                    sampling = float(seconds.get("time", 0.0) + seconds.get("worker_time", 0.0))
                    known[(cell["finding"], cell["case"])] = (total - sampling, total)
        except RunFileError:  # an unreadable earlier run only costs the estimate
            continue
    return known


def earlier_report(reports: Path) -> dict | None:
    """What the newest report in `reports` that recorded it took (`RENDER_FILE`: its
    `import_s`, `render_s` and `findings`); None where none did or none can be read (the
    plan then guesses)."""
    dated = []
    for path in Path(reports).glob(f"*/{RENDER_FILE}"):
        try:
            dated.append((path.stat().st_mtime, path))
        except OSError:  # removed meanwhile, by a run cleaning its reports
            continue
    for _, path in sorted(dated, reverse=True)[:5]:
        try:
            document = json.loads(path.read_text())
            recorded = {"import_s": float(document["import_s"]),
                        "render_s": float(document["render_s"]),
                        "findings": int(document["findings"])}
        except (OSError, ValueError, KeyError, TypeError):  # it only costs the estimate
            continue
        if recorded["import_s"] >= 0 and recorded["render_s"] >= 0 and recorded["findings"] > 0:
            return recorded
    return None


def expected_seconds(cells, results_dir: Path, options: RunOptions) -> list[float]:
    """How long each (finding, case) cell should take, to share the cells out over ranks:
    its seconds in the newest earlier run that journaled it, else a guess from its
    weight."""
    known = earlier_costs(results_dir)
    return [known.get((f.id, c.label), (0.0, (1 + len(f.variants)) * f.recording.budget_factor))[1]
            for f, c in cells]


def _measure(writer: RunWriter, selected, options: RunOptions, pyspy: bool,
             launch: ranks.Launch, group) -> int:
    """Measure this rank's share of the cells the run's journal does not hold yet; rank 0
    then gathers every rank's cells and outcome, and writes the result. Returns the exit
    status (the same on every rank)."""
    measured: list[dict] = []
    try:
        plan = _plan(writer, selected, options, launch, group)
        mine = [(fi, ci) for fi, ci, rank in plan if rank == launch.rank]
        label = f"rank {launch.rank}: " if launch.distributed else ""
        rank_info = ranks.describe_rank(launch, options.device)
        if any(f.recording.min_bytes is not None for f in selected):
            if "copy_bandwidth_bytes_per_s" not in writer.metadata:
                # once per run (per rank), before any cell, with its threads: the floor
                writer.metadata["copy_bandwidth_bytes_per_s"] = measure_copy_bandwidth(options.device)
            options = dataclasses.replace(
                options, copy_bandwidth_bytes_per_s=writer.metadata["copy_bandwidth_bytes_per_s"])
        rank_info["error"] = _measure_cells(writer, selected, options, mine, launch, label,
                                            rank_info, measured,
                                            sources=options.sources)
    except Exception:
        if launch.leader:  # say so in run.json, where the disk still lets it be written
            with signals_deferred(), contextlib.suppress(DiskFullError, RunFileError):
                writer.finish("crashed")
        raise
    outcomes = ranks.gather({"rank": rank_info, "cells": measured}, group, launch)
    code = _finish(writer, outcomes, pyspy) if launch.leader else None
    return ranks.broadcast(code, group, launch)


def measuring_order(cells: list[tuple], headlines: dict[str, str]) -> list[tuple]:
    """The cells `(finding, case, order)` in the order the run measures them: every
    finding's headline cell (`headlines`: finding id -> its headline case's label) first
    (its answer), then the others round by round, each finding's next case in turn: where
    the budget ends the run early, what it leaves out is spread thin over the findings
    rather than all of the last ones."""
    rank: dict[tuple, int] = {}
    seen: dict[str, int] = {}
    for finding, case, order in cells:
        if case.label == headlines[finding.id]:
            rank[order] = 0
        else:
            seen[finding.id] = seen.get(finding.id, 0) + 1
            rank[order] = seen[finding.id]
    return sorted(cells, key=lambda cell: (rank[cell[2]], cell[2]))


def _measure_cells(writer: RunWriter, selected, options: RunOptions, mine, launch,
                   label: str, rank_info: dict, measured: list[dict], *,
                   sources: bool = False) -> str | None:
    """Measure and journal the cells `mine`, each in this process and its workers,
    interleaved (`_measure_cell`), appending each journal entry to `measured` (with
    `sources`, each profiled variant's counters split by line: `_sources`); then the rows
    whose processes disagree in more processes, as the budget allows
    (`_more_processes`). Under torchrun an error outside any cell fails this rank's
    remaining cells (the other ranks' results are kept) and is returned; in one process
    it is raised."""
    fingerprint = ({k: rank_info[k] for k in ("rank", "host", "device_name")}
                   if launch.distributed else {})
    headlines = {selected[fi].id: headline_label(selected[fi], options) for fi, _ in mine}
    cells = measuring_order(
        [(selected[fi], selected[fi].cases(options.quick)[ci], (fi, ci)) for fi, ci in mine],
        headlines)
    known = earlier_costs(writer.results_dir)
    plan = Plan(options.budget_s,
                {(f.id, c.label): f.recording.budget_factor * len(f.variants) for f, c, _ in cells},
                options.processes, {k: v[0] for k, v in known.items()},
                {k: v[1] for k, v in known.items()}, started=STARTED, report_s=options.report_s)
    workers = _Workers(options, _worker_modules(writer, selected))
    try:
        with Progress(len(mine), "cell") as progress:
            progress.note(plan.describe())
            warmed = _warm_caches(cells, options, workers, progress)
            if warmed:
                writer.metadata["warmed_s"] = {**writer.metadata.get("warmed_s", {}), **warmed}
            for position, (finding, case, order) in enumerate(cells):
                progress.describe(f"{label}{finding.id}")
                key = (finding.id, case.label)
                if (not options.every_cell and case.label != headlines[finding.id]
                        and not plan.fits(key)):
                    plan.left_out(key)
                    skipped = CaseRun(finding, case, options).leave_out(
                        f"{BUDGET_LEFT_OUT} of {options.budget_s:g} s ({plan.left_s():.0f} s "
                        "left before its reserve); a larger --budget, --every-cell or "
                        f"--findings {finding.id} measures it")
                    with signals_deferred():
                        measured.append(writer.add_cell(finding.id, case.label, order,
                                                        _marked(skipped.summary, fingerprint), []))
                    progress.step(f"{label}{finding.id} {case.label}", "left out (budget)")
                    continue
                try:
                    cell, entry = _measure_cell(finding, case, options, plan, workers,
                                                position, writer)
                except Exception as err:
                    if not launch.distributed:
                        raise
                    for failed_finding, failed_case, failed_order in cells[position:]:
                        failed = CaseRun(failed_finding, failed_case, options).fail_all(
                            err, f"not run: rank {launch.rank} failed")
                        measured.append(writer.add_cell(
                            failed_finding.id, failed_case.label, failed_order,
                            _marked(failed.summary, fingerprint), [], **fingerprint))
                    return f"{type(err).__name__}: {err}"
                extra = {"sources": _sources(finding, cell, options)} if sources else {}
                with signals_deferred():  # a signal now must not cut the journal entry short
                    measured.append(writer.add_cell(
                        finding.id, case.label, order, _marked(cell.summary, fingerprint),
                        _marked(cell.samples + entry["samples"], fingerprint),
                        seconds=entry["seconds"], process_notes=entry["notes"],
                        **fingerprint, **extra))
                progress.step(f"{label}{finding.id} {case.label}", _cell_detail(cell.summary))
            _more_processes(writer, selected, options, workers, measured, progress)
            _at_one_thread(writer, selected, options, workers, measured, progress)
    finally:
        workers.close()
    return None


#: runs this process has started
_COMMANDS = 0


def _worker_modules(writer: RunWriter, selected) -> tuple[str, ...]:
    """The run's findings modules that registered its findings `selected`: all a worker
    imports."""
    return registry.owners([f.id for f in selected],
                           writer.metadata.get("options", {}).get("findings_module") or ())


class _Workers:
    """The run's worker processes (`harness.replica`), each started when first needed:
    `start` goes on while it loads (a cell's first worker loads while this process
    prepares the cell), `get` waits until it is ready."""

    def __init__(self, options: RunOptions, modules, threads: int | None = None) -> None:
        self.options, self.modules = options, modules
        self.threads = threads
        """torch threads of every worker (None: this process's)."""
        self.started: dict[int, replica.Worker | str] = {}
        """process index (2, 3, ...) -> its worker, or why it could not start."""

    def start(self, process: int) -> None:
        """Start worker `process` without waiting for it to load the findings modules."""
        if process not in self.started:
            threads = self.threads or torch.get_num_threads()
            self.started[process] = replica.Worker(replica.WorkerSpec.of(
                self.options, threads, self.modules, process))

    def get(self, process: int) -> replica.Worker | str:
        """Worker `process`, started if need be and ready, or why it could not start."""
        self.start(process)
        worker = self.started[process]
        if isinstance(worker, replica.Worker):
            try:
                worker.ready()
            except replica.WorkerError as err:
                self.started[process] = str(err)
        return self.started[process]

    def start_s(self) -> float:
        """Wall seconds the slowest of this run's ready workers took to start (a guess
        where none is ready): what one more fresh process costs before its first cell."""
        known = [w.startup_s for w in self.started.values()
                 if isinstance(w, replica.Worker) and w.startup_s is not None]
        return max(known) if known else GUESS_FIXED_S

    def close(self) -> None:
        for worker in self.started.values():
            if isinstance(worker, replica.Worker):
                worker.close()


def preparing_threads(processes: int) -> int:
    """torch threads of each of `processes` processes preparing a cell at once (inputs,
    first calls): they share the cores (more torch threads than cores made a training
    iteration's first calls take 40 s where they take 5). One formula for the cell's
    processes and the warm-up's, whose compiled code must be keyed as theirs."""
    return max(1, torch.get_num_threads() // processes)


def _warm_caches(cells: list[tuple], options: RunOptions, workers: _Workers,
                 progress: Progress) -> dict[str, float | str]:
    """Before anything is timed: each finding of `cells` whose compile caches its
    `Recording.caches_cold` says are cold has its first cell prepared (inputs, first calls,
    at the threads the cell's own processes will prepare it at) in processes of their own,
    which then end: one per group of `Recording.compile_groups` (one for every variant
    where it names none), as many at once as the run may use cores, the first group
    first; the run's workers start meanwhile. On the CPU this process runs inductor's
    vector-ISA checks (`IsaChecks`) from the start, and they hold a core: the process of
    the first batch's last group (the second of two) prepares once they have ended (a
    third process beside them had slowed the first group's compile, which waits for
    them). Once the first of two or more has ended, leaving a core idle, the
    workers run inductor's vector-ISA checks (on the CPU: `Worker.run_inductor_checks`)
    and this process imports the report's modules (`load_report_modules`). Returns
    finding id -> the seconds until its processes were done, or why one could not (its
    cell's processes then compile that themselves, as without it)."""
    firsts: dict[str, tuple] = {}
    for finding, case, _ in cells:
        firsts.setdefault(finding.id, (finding, case))
    cold = []
    for finding, case in firsts.values():
        probe = finding.recording.caches_cold
        try:
            if probe is not None and probe():
                cold.append((finding, case))
        except Exception as err:  # a probe that fails is said; the first calls compile
            progress.note(f"{finding.id}: recording.caches_cold raised {type(err).__name__}: "
                          f"{err}; its first calls compile in the processes that time it")
    if not cold:
        return {}
    jobs = [(finding, case, group) for finding, case in cold
            for group in (finding.recording.compile_groups or (None,))]
    progress.note(f"compile caches empty for {', '.join(f.id for f, _ in cold)}: "
                  f"{len(jobs)} process{'es' if len(jobs) > 1 else ''} of their own prepare "
                  f"{'its first cell' if len(cold) == 1 else 'their first cells'} before any "
                  "timing, so that the processes that time them load what they compiled")
    # the threads `_measure_cell` prepares a cell at, so that the cached code is theirs
    sharing = preparing_threads(options.processes)
    started = time.perf_counter()
    # inductor's CPU build checks overlap the warm-up processes' imports and tracing
    isa_checks = IsaChecks() if torch.device(options.device).type == "cpu" else None
    warmed: dict[str, float | str] = {}
    at_once = ranks.usable_cores()
    for first in range(0, len(jobs), at_once):
        batch = jobs[first:first + at_once]
        warmers = [replica.Worker(replica.WorkerSpec.of(options, torch.get_num_threads(),
                                                        workers.modules, process=0))
                   for _ in batch]
        if first == 0:
            for process in range(2, options.processes + 1):
                workers.start(process)  # they load the findings modules meanwhile
        try:
            for index, (warmer, (finding, case, group)) in enumerate(zip(warmers, batch)):
                if isa_checks is not None and at_once > 1 and index == at_once - 1:
                    # the checks hold a core until they end (at once in a later batch):
                    # the first group's compile waits for them, the longer the more
                    # processes share the cores
                    isa_checks.wait()
                warmer.ready()
                warmer.prepare(finding.id, case.label,
                               case.label == headline_label(finding, options), sharing,
                               variants=group)
            for ended, index in enumerate(replica.answering_order(warmers)):
                warmer, (finding, _, _) = warmers[index], batch[index]
                answer = warmer.prepared()
                if ended == 0 and first == 0 and len(batch) > 1:
                    # a core is free from now on: the workers load what compiled calls
                    # need, instead of in their first cell while this process waits, and
                    # this process the report's modules, instead of after the last cell
                    if isa_checks is not None:
                        for worker in workers.started.values():
                            if isinstance(worker, replica.Worker):
                                worker.run_inductor_checks()
                    if options.report:
                        try:
                            load_report_modules()
                        except ImportError as err:  # the report meets it again, and says so
                            progress.note(f"the report's modules did not load ({err}): "
                                          "the run goes on without its report")
                if "error" in answer:
                    warmed[finding.id] = answer["error"]
                    continue
                warmer.measure_prepared(0.0, [])  # nothing timed: the cell is released
                if not isinstance(warmed.get(finding.id), str):
                    warmed[finding.id] = time.perf_counter() - started
        except replica.WorkerError as err:
            warmed.update({f.id: str(err) for f, _, _ in batch
                           if not isinstance(warmed.get(f.id), str)})
        finally:
            for warmer in warmers:
                warmer.close()
    failed = isa_checks.wait() if isa_checks is not None else None
    if failed:
        progress.note(f"inductor's vector-ISA build checks failed in this process ({failed}): "
                      "a process that compiles runs them itself")
    progress.note("compile caches: " + "; ".join(
        f"{key} warmed in {value:.1f} s" if isinstance(value, float)
        else f"{key} not warmed ({value}): its processes compile it"
        for key, value in warmed.items()), done=True)
    return warmed


def _extra_deadline_s(options: RunOptions) -> float:
    """Seconds from the run's start by which its extra processes (more processes, one
    thread) end: the budget less what combining and reporting will take."""
    return options.budget_s - options.report_s


def fresh_costs(keys, entries: dict, options: RunOptions, share: float) -> dict:
    """Seconds one more fresh process is expected to take over each journalled cell of
    `keys` ((finding, case) -> its entry in `entries`), given `share` seconds of sampling:
    inputs and first calls as the run's workers took them for the costliest cell of the
    same finding (the mean over the workers: a worker's first cell of a finding pays its
    compiles and imports, seconds for a torch.compile, and a fresh process pays them
    again for whichever of its cells comes first: charged to each, never too little),
    then at least that share. A finding no worker measured (its cells left out, its
    workers failed) is a guess of GUESS_FIXED_S."""
    workers = max(options.processes - 1, 1)
    first_calls: dict[str, float] = {}
    for (finding, _), entry in entries.items():
        other = (entry.get("seconds") or {}).get("worker_other", 0.0) / workers
        if other > 0:  # 0: no worker's seconds (left out, or every worker failed)
            first_calls[finding] = max(first_calls.get(finding, 0.0), other)
    return {key: first_calls.get(key[0], GUESS_FIXED_S) + max(
        share, (entries[key].get("seconds") or {}).get("worker_time", 0.0) / workers)
        for key in keys}


def _measure_cell(finding, case, options: RunOptions, plan: Plan, workers: _Workers,
                  position: int, writer: RunWriter) -> tuple[CaseRun, dict]:
    """One cell: this process and each worker prepare it at once (inputs, first calls;
    this process checks each variant against the reference), then, once every worker is
    prepared, they time the variants that agreed here, one after the other (who goes
    first alternates from cell to cell), then this process profiles it. Returns the cell
    and the workers' entry: their sample rows, notes on any that failed, and the seconds
    of every stage (the workers' as `worker_time` and `worker_other`)."""
    key = (finding.id, case.label)
    headline = case.label == headline_label(finding, options)
    share = plan.share(key)
    trace = (writer.traces / f"{finding.id}.json.gz"
             if options.profile and case == finding.cases(options.quick)[0] else None)
    started = time.perf_counter()
    preparing = {}  # process -> its worker, preparing the cell while this process does
    for process in range(2, options.processes + 1):
        workers.start(process)
        if isinstance(workers.started[process], replica.Worker):
            preparing[process] = workers.started[process]
    sharing = preparing_threads(len(preparing) + 1)
    for worker in preparing.values():
        worker.prepare(finding.id, case.label, headline, sharing)
    with pinned_threads(sharing, compile_for=torch.get_num_threads()):
        cell = CaseRun(finding, case, options, headline=headline, sampling_s=share).prepare()
    cell.trace_at_timed_threads()
    cell.min_rounds = min_rounds(share, cell.round_s(), options.min_samples)
    timed = cell.timed_variants()
    least_s = cell.min_rounds * cell.round_s() * options.processes
    if timed and not headline and not options.every_cell and least_s > plan.left_s():
        # its first calls show what its least rounds cost: past the budget, left out
        cell.leave_out_timed(
            f"{BUDGET_LEFT_OUT} of {options.budget_s:g} s: its least sampling "
            f"({cell.min_rounds} rounds of {format_seconds(cell.round_s())} in "
            f"{options.processes} processes) would end {least_s - plan.left_s():.0f} s past "
            f"it; a larger --budget, --every-cell or --findings {finding.id} measures it")
        timed = []
    samples, notes, worker_seconds = [], [], {"worker_time": 0.0, "worker_other": 0.0}
    prepared = {}  # nothing is timed while a worker still prepares: it would share the CPU
    for process, worker in preparing.items():
        answer = worker.prepared()
        if "error" in answer:
            notes.append(f"process {process}: {answer['error']}")
            if worker.process.poll() is not None:  # gone: later cells are told why
                workers.started[process] = answer["error"]
        else:
            prepared[process] = worker
    notes += [f"process {p}: {w}" for p, w in workers.started.items()
              if isinstance(w, str) and p <= options.processes and p not in preparing]

    def in_workers() -> None:
        for process, worker in prepared.items():
            done = worker.measure_prepared(share, timed, cell.min_rounds)
            if "error" in done:
                notes.append(f"process {process}: {done['error']}")
                continue
            samples.extend(done["samples"])
            notes.extend(f"process {process}: {v}: {why}" for v, why in done["failed"].items())
            worker_seconds["worker_time"] += done["stages"].get("time", 0.0)
            worker_seconds["worker_other"] += done["seconds"] - done["stages"].get("time", 0.0)

    load = ranks.LoadWatch() if timed else None  # what another job runs while it is timed
    if timed and position % 2:  # the workers first in every other cell
        in_workers()
        cell.time()
    elif timed:
        cell.time()
        in_workers()
    else:
        in_workers()  # nothing to time: the prepared workers are released
    if load is not None:
        cell.load = load.seen(torch.get_num_threads())
    cell.finish(trace, profile_s=plan.spare_s(key))
    seconds = {**cell.seconds, **worker_seconds}
    sampling = seconds.get("time", 0.0) + worker_seconds["worker_time"]
    plan.measured(key, time.perf_counter() - started - sampling, sampling)
    return cell, {"samples": samples, "notes": notes, "seconds": seconds}


def min_rounds(share_s: float, round_s: float, wanted: int) -> int:
    """Rounds a process takes at least of a cell whose round takes `round_s` seconds, given
    `share_s` seconds of it: `wanted` (the run's minimum), or as many as the share pays
    where it cannot pay those, never fewer than FEWEST_ROUNDS (a slow cell that would
    otherwise spend the run's budget on its minimum)."""
    if round_s <= 0:
        return wanted
    return max(min(wanted, FEWEST_ROUNDS), min(wanted, int(share_s // round_s)))


def one_thread_costs(keys, entries: dict, options: RunOptions, share: float,
                     warmed: dict[str, float | str]) -> dict:
    """Seconds the two one-thread processes are expected to take over each headline cell
    of `keys` (`fresh_costs`, twice), and, for a finding this run warmed from empty caches
    (`warmed`: finding id -> seconds, `_warm_caches`), those seconds again: the warm-up
    built its compiled code for the run's threads, and a process at one thread compiles
    its own (inductor writes the thread count into its code)."""
    return {key: 2 * seconds + (warmed[key[0]] if isinstance(warmed.get(key[0]), float)
                                else 0.0)
            for key, seconds in fresh_costs(keys, entries, options, share).items()}


def _at_one_thread(writer: RunWriter, selected, options: RunOptions, workers: _Workers,
                   measured: list[dict], progress: Progress) -> None:
    """Each finding's headline cell timed again at one torch thread, in two fresh
    processes, where the run has more and the budget lasts: a word the thread count decides
    is said beside the run's (the rows' `one_thread_*`, `harness.combine`), and where other
    processes kept every core busy while one of them timed it, that too (`joined_load`)."""
    if torch.get_num_threads() == 1:
        return
    deadline = _extra_deadline_s(options)
    left = deadline - (time.perf_counter() - STARTED)
    if left <= 0:
        return
    cells = {(c["finding"], c["case"]): c for c in read_cells(writer.folder)}
    headlines = [(f, headline_label(f, options)) for f in selected
                 if (f.id, headline_label(f, options)) in cells]
    if not headlines:
        return
    share = max(FLOOR_S, left / 3 / len(headlines) / 2)
    costs = one_thread_costs([(f.id, label) for f, label in headlines], cells, options,
                             share, writer.metadata.get("warmed_s", {}))
    keys = affordable(costs, 2 * workers.start_s(), left)
    if not keys:  # two processes that would end past the budget are not started
        progress.note(f"at one thread: not timed: 2 fresh processes would pass the budget "
                      f"({left:.1f} s left; a larger --budget pays them)")
        return
    headlines = [(f, label) for f, label in headlines if (f.id, label) in keys]
    progress.note(f"at one thread: {len(headlines)} headline cells in 2 fresh processes")
    alone = _Workers(options, _worker_modules(writer, selected), threads=1)
    try:
        for finding, label in headlines:
            if time.perf_counter() - STARTED + costs[(finding.id, label)] > deadline:
                return
            entry = cells[(finding.id, label)]
            timed = sorted({r["variant"] for r in entry["samples"]})
            added, summary = [], entry["summary"]
            for process in (101, 102):  # two processes, as every row has
                worker = alone.get(process)
                if isinstance(worker, str):
                    progress.note(f"at one thread: {worker}")
                    return
                load = ranks.LoadWatch()  # what another job runs while it times the cell
                done = worker.measure(finding.id, label, True, share, timed)
                added += done.get("samples", [])
                summary = joined_load(summary, load.seen(1), one_thread=True)
            _rejournal(writer, measured, entry, entry["samples"] + added, summary)
    finally:
        alone.close()


def _more_processes(writer: RunWriter, selected, options: RunOptions, workers: _Workers,
                    measured: list[dict], progress: Progress) -> None:
    """The cells with a row whose word is still inconclusive and whose processes disagree
    with the run's spread or that more processes would decide (`Combined.undecided`),
    timed again in a fresh process (one more each round, up to `MAX_PROCESSES`) while the
    budget less what the report will take lasts: each one's rows join the cell's journal
    entry, with the load it was timed beside (`joined_load`)."""
    by_id = {f.id: f for f in selected}
    deadline = _extra_deadline_s(options)
    for process in range(options.processes + 1, MAX_PROCESSES + 1):
        cells = read_cells(writer.folder)
        combined = combine([r for c in cells for r in c["summary"]],
                           [r for c in cells for r in c["samples"]],
                           writer.metadata.get("finding_info", {}), options.margin,
                           writer.metadata.get("threads"))
        undecided = list(dict.fromkeys((f, c) for f, c, _ in combined.undecided(MAX_PROCESSES)))
        left = deadline - (time.perf_counter() - STARTED)
        if not undecided or left <= 0:
            return
        share = max(FLOOR_S, left / 2 / len(undecided))
        entries = {(c["finding"], c["case"]): c for c in cells}
        costs = fresh_costs(undecided, entries, options, share)
        wanted = affordable(costs, workers.start_s(), left)
        if not wanted:  # a process that would end past the budget is not started
            progress.note(f"process {process}: not started: {len(undecided)} undecided cells, "
                          f"but its start and first calls would pass the budget ({left:.1f} s "
                          "left; a larger --budget pays them)")
            return
        worker = workers.get(process)
        if isinstance(worker, str):
            progress.note(f"more processes: {worker}")
            return
        progress.note(f"process {process}: {len(wanted)} of {len(undecided)} undecided cells "
                      "that more processes may decide, as the budget allows")
        for finding_id, label in wanted:
            if time.perf_counter() - STARTED + costs[(finding_id, label)] > deadline:
                return
            entry = entries[(finding_id, label)]
            finding = by_id[finding_id]
            load = ranks.LoadWatch()  # what another job runs while it is timed
            done = worker.measure(finding_id, label, label == headline_label(finding, options),
                                  share, sorted({r["variant"] for r in entry["samples"]}))
            if "error" in done:
                continue
            _rejournal(writer, measured, entry, entry["samples"] + done["samples"],
                       joined_load(entry["summary"], load.seen(torch.get_num_threads())))


def joined_load(rows: list[dict], seen: dict, one_thread: bool = False) -> list[dict]:
    """A cell's summary `rows` with what a later timing of it ran beside
    (`ranks.LoadWatch.seen`) joined: for more processes at the run's threads, whose samples
    join its rows' words, the most cores other processes kept busy over its timings
    (`others_busy_cores`) and `timed_beside_load` where any of them was; for its
    one-thread processes `one_thread_beside_load`, since only the one-thread word is
    theirs. `rows` as they are where the watch could not say."""
    if not seen:
        return rows
    if one_thread:
        return [{**row, "one_thread_beside_load": bool(row.get("one_thread_beside_load"))
                 or seen["timed_beside_load"]} for row in rows]
    return [{**row, "others_busy_cores": max(row.get("others_busy_cores") or 0.0,
                                             seen["others_busy_cores"]),
             "timed_beside_load": bool(row.get("timed_beside_load"))
             or seen["timed_beside_load"]} for row in rows]


def _rejournal(writer: RunWriter, measured: list[dict], entry: dict, samples: list[dict],
               summary: list[dict]) -> None:
    """Journal cell `entry` (read back from the run's cells) again with `samples` and
    `summary`, and hand them to rank 0 in this rank's `measured` entry of the cell."""
    with signals_deferred():
        writer.add_cell(entry["finding"], entry["case"], tuple(entry["order"]), summary,
                        samples, **_entry_extra(entry))
    for item in measured:
        if (item["finding"], item["case"]) == (entry["finding"], entry["case"]):
            item.update(samples=samples, summary=summary)


def _entry_extra(entry: dict) -> dict:
    """A journal entry's fields beyond those `RunWriter.add_cell` takes by name."""
    return {k: v for k, v in entry.items() if k not in (
        "schema_version", "finding", "case", "order", "summary", "samples")}


def _sources(finding, cell: CaseRun, options: RunOptions) -> dict[str, list[dict] | str]:
    """Per variant the profiling pass counted: its counters split by line of the project's
    code (`harness.explain.variant_sources`), for report --compare and --markdown."""
    counted = [row["variant"] for row in cell.summary if row.get("op_calls") is not None]
    if not counted or cell.inputs is None:
        return {}
    return explain.variant_sources(finding, cell.inputs, counted, options.device)


def _marked(rows: list[dict], fingerprint: dict) -> list[dict]:
    """Rows carrying the rank, host and device that measured them (under torchrun)."""
    return [{**row, **fingerprint} for row in rows] if fingerprint else rows


def _finish(writer: RunWriter, outcomes: list[dict], pyspy: bool) -> int:
    """Rank 0: journal the cells other ranks could not write here, record the ranks,
    write the result; the exit status."""
    done = writer.done_cells()
    for outcome in outcomes:
        for cell in outcome["cells"]:
            if (cell["finding"], cell["case"]) not in done:  # a rank without this file system
                writer.add_cell(cell["finding"], cell["case"], tuple(cell["order"]),
                                cell["summary"], cell["samples"], **_entry_extra(cell))
    if len(outcomes) > 1:
        writer.metadata["ranks"] = [o["rank"] for o in outcomes]
    writer.metadata["seconds"] = time.perf_counter() - STARTED
    warned = row_warnings(writer.summary)
    if warned:
        writer.metadata["warnings"] = warned
    if pyspy:  # after the timing, so that it disturbs nothing
        writer.metadata["pyspy"] = record_flamegraph(writer.folder, registry.defaults(writer.metadata["options"]["findings_module"]).flamegraph)
        print(f"py-spy: {writer.metadata['pyspy']['status']}: "
              f"{writer.metadata['pyspy']['detail']}", file=sys.stderr)
    with signals_deferred():
        writer.finish("complete")
    table = pd.DataFrame(writer.summary)
    _print_result(writer, table, "complete")
    for outcome in outcomes:
        if outcome["rank"].get("error"):
            print(f"rank {outcome['rank']['rank']} failed: {outcome['rank']['error']}; its "
                  "remaining cells are marked failed", file=sys.stderr)
    bad = table["status"].isin(["mismatch", "failed"]).any() if not table.empty else False
    return 1 if bad else 0


def _print_result(writer: RunWriter, table: pd.DataFrame, status: str) -> None:
    """The summary table, how sampling went and where the results are."""
    print(summary_table(table))
    level = writer.metadata.get("process_level") or {}
    lines = [sampling_line(table, writer.metadata.get("precision", 0.0),
                           writer.metadata.get("margin") or DEFAULT_MARGIN),
             process_line(table, level), compiled_line(table), loaded := load_line(table),
             time_line(read_cells(writer.folder))]
    trust = reliability(table)
    lines += [trust.placebo_line(), trust.words_line()]
    for line in filter(None, lines):
        print(f"\n{line}")
    print(f"\nresults: {writer.folder}  ({status})")
    for warned in writer.metadata.get("warnings") or ():
        print(f"warning: {warned['finding']} {warned['case']} {warned['variant']}: "
              f"{warned['warning']}", file=sys.stderr)
    if trust.noisy:
        print(f"noisy run: a placebo read {', '.join(trust.placebo_decisive)}; its close "
              "words may not repeat (see the noise floor line above)", file=sys.stderr)
    if loaded is not None:
        print("loaded: cells were timed while other processes kept their cores busy "
              "(see the load line above)", file=sys.stderr)
    inflation = (level.get("calibration") or {}).get("inflation", 1.0)
    if inflation > 1.0:
        print(f"widened: more rows' processes disagreed than chance allows, so every "
              f"interval was widened x{inflation ** 0.5:.3g} (see the processes line above)",
              file=sys.stderr)


def row_warnings(summary: list[dict]) -> list[dict]:
    """The rows that carry a `warning` (a finding's `extra_metrics` may say that what it
    measured ran otherwise than meant, e.g. envs that shared a CUDA stream): recorded in
    the run's metadata and said at the end of the run."""
    return [{"finding": r["finding"], "case": r["case"], "variant": r["variant"],
             "warning": r["warning"]}
            for r in summary if isinstance(r.get("warning"), str) and r["warning"]]


def _cell_detail(summary: list[dict]) -> str:
    """`scan 0.084x` style: the fastest non-baseline ratio of a cell, or its problems."""
    bad = [r["variant"] for r in summary if r.get("status") in ("mismatch", "failed")]
    if bad:
        return f"FAILED: {', '.join(bad)}"
    timed = [r for r in summary if r.get("median_s") is not None]
    if timed:
        return f"{len(timed)} timed, fastest {format_seconds(min(r['median_s'] for r in timed))}"
    budget = any(str(r.get("reason") or "").startswith(BUDGET_LEFT_OUT) for r in summary)
    return "left out (budget)" if budget else "not timed"


main = command(_main)
