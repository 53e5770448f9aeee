"""`python -m harness.gate`: the CI performance regression gate.

Three checks, one markdown table (check, finding, variant, case, baseline, current,
change, verdict) on stdout:

  --counters     a. op calls and host syncs of every quick case, exactly against the
                    counters baseline (--baseline), and allocations, allocated and peak
                    bytes where it holds them for this machine's CPU kernel path (elsewhere
                    a note names the counters not compared, why, and the command that
                    records them); a cell the baseline lacks fails unless --allow-new
  --invariants   b. speed ratios within one process (e.g. one variant >= 16x faster than
                    another at one case), against an invariants config (--config)
  --against REV  c. paired A/B timing of this tree against a git revision, both timed in
                    alternation in each of several processes; fails a cell that a
                    one-sided test, with Holm's correction over the cells, says is
                    slower (at most 5% false alarms per run) by more than --margin (5%);
                    alone, it does not count, and its notes say COUNTERS NOT CHECKED

With none of them: --counters --invariants. `--update-baseline` measures the counters of
the findings named (default: every gated one) and merges them into the baseline file, for
this machine's CPU kernel path, keeping the other kernel paths'. The counters count at one
torch thread; the timing checks (b, c) at harness.run's thread count unless --threads.

The table, its notes (what was not compared or checked, and why; the threads the timing
checks used) and its summary line are also appended to the file $GITHUB_STEP_SUMMARY
names, when it names one (a GitHub Actions job summary).

The findings: the modules your pyproject.toml names (`[tool.esper-bench]
findings-modules`, with `baseline` and `invariants` as the defaults of --baseline and
--config; `harness.project`), and `--findings-module PKG.MODULE` (repeatable). The checks
cover the gated findings of those modules; --against REV compares two revisions of the
repository that holds them; check b runs where an invariants config is given (--config,
pyproject.toml, or the findings modules' `harness.Defaults.invariants`).

Every input is checked before anything is measured. Exit status (also in `--help`):
0 pass; 1 a regression (or a variant that raises); 2 usage or input error, including a
missing, unreadable, outdated or incomplete baseline (the message gives the command that
fixes it); 3 internal error (a bug, with its traceback); 130/143 interrupted by SIGINT /
SIGTERM, after removing the A/B worktree and killing its workers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness import exits, lock, options
from harness import findings as registry
from harness.exits import UsageError
from harness.gate import ab as gate_ab, counters as gate_counters, invariants as gate_invariants
from harness.isa_checks import check_isas_lazily
from harness.measure.machine import isolate_compile_cache
from harness.gate.table import (
    STEP_SUMMARY_VARIABLE, GateRow, Outcome, append_step_summary, render_markdown, rows_document,
    step_summary_path, summary_line,
)
from harness.project import load_findings
from harness.ranks import Launch, Spread, exit_process
from harness.results import atomic_write_text


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(
        prog="python -m harness.gate", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=exits.epilog(
            "pass", "a regression, or a variant that raises on the current code") + (
            "\n(a counters baseline that is missing, unreadable, of another torch version or "
            "lacks measured cells is an input error, 2; the message gives the command that "
            "fixes it)\nThe table is also appended to the file $GITHUB_STEP_SUMMARY names, "
            "when it is set (a GitHub Actions job summary)."),
    )
    exits.add_version(p)
    checks = p.add_argument_group("checks (default: --counters --invariants)")
    checks.add_argument("--counters", action="store_true", help="a: exact counters vs the baseline")
    checks.add_argument("--invariants", action="store_true", help="b: in-process speed ratios")
    checks.add_argument("--against", metavar="REV",
                        help="c: paired A/B timing against a git revision (branch, tag, commit)")
    p.add_argument("--update-baseline", action="store_true",
                   help="measure the counters of --findings (default: every gated finding; "
                        "twice, to prove them deterministic) and merge them into the baseline "
                        "file, keeping the other findings' entries; then exit")
    p.add_argument("--allow-new", action="store_true",
                   help="counters: let cells the baseline has no entry for pass (reported as "
                        "'new (allowed)'), provided some other cell was compared")
    p.add_argument("--baseline", type=options.path, default=None, metavar="FILE",
                   help="counters baseline (default: baseline in [tool.esper-bench] of "
                        "pyproject.toml)")
    p.add_argument("--config", type=options.path, default=None, metavar="FILE",
                   help="invariants config (default: invariants in [tool.esper-bench] of "
                        "pyproject.toml, else the findings modules' harness.Defaults."
                        "invariants; with none, check b is off)")
    p.add_argument("--findings", nargs="+", metavar="ID",
                   help="gated findings for the counters and A/B checks (default: every "
                        "gated finding of the findings modules; A/B: their "
                        "harness.Defaults.ab_findings where they set some)")
    p.add_argument("--findings-module", action="append", metavar="PKG.MODULE",
                   help="import this module for its harness.findings.register calls (your "
                        "own findings; repeatable), after those named in pyproject.toml")
    p.add_argument("--json", type=options.path, metavar="FILE",
                   help="also write the rows, with their numbers, as JSON to FILE")
    p.add_argument("--sessions", type=options.at_least(gate_ab.MIN_SESSIONS), metavar="N",
                   help="A/B: worker processes, each timing both trees side by side "
                        f"(default {gate_ab.ABOptions.sessions}, at least "
                        f"{gate_ab.MIN_SESSIONS})")
    p.add_argument("--threads", type=options.positive_int, metavar="N",
                   help="A/B and invariants: torch threads while timing (default: those of "
                        "harness.run, torch's count, the cores shared out under torchrun; "
                        "the counters always count at one thread)")
    p.add_argument("--margin", type=options.fraction, metavar="FRACTION",
                   help=f"A/B: the margin, as a fraction: a cell fails when a one-sided "
                        f"test (Holm-corrected over the cells) says it is slower and it "
                        f"is slower by more than this (default {gate_ab.ABOptions.margin}, "
                        f"as harness.run's)")
    return p


def _with_project(args: argparse.Namespace) -> None:
    """Fill in what the nearest pyproject.toml names (`harness.project`) and import the
    findings modules: first, since the other options' defaults depend on them."""
    project, modules = load_findings(args.findings_module)
    args.findings_module = list(modules)
    if args.baseline is None:
        args.baseline = project.baseline
    if args.config is None:
        args.config = project.invariants or registry.defaults(modules).invariants


def _findings(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    """`--findings` (or the check's default): each a registered id the gate covers."""
    ids = tuple(dict.fromkeys(args.findings or default))
    if not ids:
        raise UsageError(f"--findings: expected gated findings in "
                         f"{', '.join(args.findings_module)}; got none (every finding they "
                         "register has gated=False)")
    try:
        registry.select(list(ids), modules=args.findings_module)
    except ValueError as err:  # the registry names the unknown and the known ids
        raise UsageError(str(err)) from err
    ungated = [i for i in ids if not registry.FINDINGS[i].gated]
    if ungated:
        covered = gate_counters.gated_findings(args.findings_module)
        raise UsageError(f"--findings: expected findings the gate covers "
                         f"({', '.join(covered)}); got {', '.join(ungated)}, "
                         "registered but not gated (gated=False in its Finding)")
    return ids


def ab_options(args: argparse.Namespace) -> tuple[gate_ab.ABOptions, Path]:
    """The A/B check's options and the repository whose revisions it compares: the one
    holding the findings modules. `args` come from `parse`."""
    defaults = gate_ab.ABOptions()
    ids = _findings(args, registry.defaults(args.findings_module).ab_findings
                    or gate_counters.gated_findings(args.findings_module))
    modules = tuple(dict.fromkeys(registry.ORIGINS.get(i, "register()") for i in ids))
    repo, folders = gate_ab.user_trees(modules)
    options = gate_ab.ABOptions(
        findings=ids,
        sessions=defaults.sessions if args.sessions is None else args.sessions,
        margin=defaults.margin if args.margin is None else args.margin,
        threads=defaults.threads if args.threads is None else args.threads,
        findings_modules=modules, paths=folders,
    )
    return options, repo


def _check_baseline_named(args: argparse.Namespace) -> None:
    """UsageError unless a counters baseline file is named (--baseline, or pyproject.toml)."""
    if args.baseline is None:
        raise UsageError("--baseline: expected the counters baseline file (--baseline FILE, "
                         "or baseline = \"FILE\" in [tool.esper-bench] of pyproject.toml; "
                         "create it with `python -m harness.gate --update-baseline --baseline "
                         "FILE`); got none")


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_options(args: argparse.Namespace) -> None:
    """Options that are wrong in themselves or together, before anything is measured
    (after the project's settings and findings modules are read: `_with_project`)."""
    _with_project(args)
    checks = [name for name, given in zip(("--counters", "--invariants", "--against"),
                                          (args.counters, args.invariants,
                                           args.against is not None)) if given]
    if args.update_baseline and (checks or args.json is not None):
        raise UsageError(f"--update-baseline: expected on its own, without a check or --json; "
                         f"got it with {', '.join(checks + ['--json'] * (args.json is not None))}")
    if args.against is not None and not args.against.strip():
        raise UsageError(f"--against: expected a git revision (a branch, tag or commit, "
                         f"e.g. origin/main); got {args.against!r}")
    counters, _, against = _runs(args)
    if args.allow_new and (args.update_baseline or not counters):
        raise UsageError("--allow-new: expected with the counters check (--counters, or no "
                         f"check named); got it with {', '.join(checks) or '--update-baseline'}")
    if args.findings and not (counters or against):
        raise UsageError("--findings: expected with --counters, --against or "
                         "--update-baseline (the invariants config names its own findings); "
                         "got it with --invariants only")
    if args.invariants and args.config is None:
        raise UsageError(f"--invariants: expected an invariants config for the findings of "
                         f"{', '.join(args.findings_module)} (--config FILE, or invariants = "
                         "\"FILE\" in [tool.esper-bench] of pyproject.toml); got none")
    if args.threads is not None and not (args.against is not None or _runs(args)[1]):
        raise UsageError(f"--threads: expected with --against REV or the invariants check "
                         f"(it sets their timing; the counters always count at one thread); "
                         f"got --threads {args.threads} without them")
    for name, value in (("--sessions", args.sessions), ("--margin", args.margin)):
        if value is not None and args.against is None:
            raise UsageError(f"{name}: expected with --against REV (it sets the A/B check); "
                             f"got {name} {value} without --against")
    if args.json is not None:
        exits.check_writable(args.json, "--json")
    if step_summary_path() is not None and not args.update_baseline:
        exits.check_writable(step_summary_path(), f"${STEP_SUMMARY_VARIABLE}")


def _update(args: argparse.Namespace) -> int:
    findings = _findings(args, gate_counters.gated_findings(args.findings_module))
    _check_baseline_named(args)
    exits.check_writable(args.baseline, "--baseline")
    with lock.hold(args.baseline.parent, f"--baseline {args.baseline}"):  # read, merge, write
        update = gate_counters.update_baseline(
            args.baseline, findings, replace_stale=args.findings is None,
            modules=args.findings_module)
    print(f"wrote {args.baseline}: {update.written} cells of {', '.join(findings)} "
          f"(each counted twice, identical) on CPU kernel path {update.kernel_path}")
    if update.other_kernel_paths:
        print(f"kept the allocation counts of {update.other_kernel_paths} other CPU kernel "
              f"path{'s' * (update.other_kernel_paths != 1)}")
    if update.stale:
        print(f"dropped the other kernel paths' allocation counts of {len(update.stale)} "
              "cells whose counts changed here (they were counted on other code; record "
              "them again on those machines): " + "; ".join(" ".join(k) for k in update.stale))
    if update.kept:
        print("kept the entries of the findings not measured: "
              + ", ".join(f"{n} of {f}" for f, n in update.kept.items()))
    if update.kept_skipped:
        print(f"kept {update.kept_skipped} entries of cells skipped here")
    if update.dropped:
        print(f"dropped {len(update.dropped)} entries no longer measured: "
              + "; ".join(" ".join(key) for key in update.dropped))
    if update.replaced:
        print(f"replaced the old file instead of merging: {update.replaced}")
    return exits.PASS


def _runs(args: argparse.Namespace) -> tuple[bool, bool, bool]:
    """Whether checks a, b and c run: those named, or a and b when none is (b only where
    there is an invariants config: your findings may have none)."""
    named = (args.counters, args.invariants, args.against is not None)
    return named if any(named) else (True, args.config is not None, False)


def run_checks(args: argparse.Namespace, spread: Spread | None = None
               ) -> tuple[list[GateRow], list[str]] | None:
    """The rows of every selected check, in the order a, b, c, and the notes for after the
    table (what was not compared, and why; the threads the timing checks used); every input
    is read and checked first, so that a bad one fails before minutes of measuring.

    Under torchrun (`spread`), rank 0 runs checks a and b and the A/B sessions are shared
    out over every rank; only rank 0 gets the rows (the others: None)."""
    counters, invariants, against = _runs(args)
    if spread is not None and not spread.launch.leader:
        counters = invariants = False
    if counters:
        counter_findings = _findings(args, gate_counters.gated_findings(args.findings_module))
        _check_baseline_named(args)
        baseline = gate_counters.load_baseline(args.baseline, modules=args.findings_module)
    if invariants:
        config = gate_invariants.load_config(args.config)
    if against:
        options, repo = ab_options(args)
        gate_ab.resolve_revision(repo, args.against)
    rows: list[GateRow] = []
    notes: list[str] = []
    if counters:
        started = time.perf_counter()
        cells = gate_counters.measure(counter_findings)
        match = gate_counters.KernelMatch.of(baseline)
        whole = baseline.schema_version < gate_counters.SCHEMA_VERSION  # rewrites all
        command = gate_counters.update_command(args.baseline, () if whole else
                                               args.findings or (), args.findings_module)
        counted = gate_counters.explain_changes(
            gate_counters.compare(cells, baseline, counter_findings, allow_new=args.allow_new,
                                  match=match), cells, baseline, match=match, command=command)
        rows += counted
        notes += filter(None, [gate_counters.not_compared_note(counted, match, args.baseline,
                                                               command)])
        _progress(f"counters: {time.perf_counter() - started:.1f} s")
    if invariants:
        started = time.perf_counter()
        threads = gate_invariants.timing_threads_of(config, args.threads)
        rows += gate_invariants.check_invariants(config, threads=threads)
        notes.append(f"invariants: timed at {threads} torch thread{'s' * (threads != 1)}"
                     + _threads_source(args.threads, config.sampling.threads))
        _progress(f"invariants: {time.perf_counter() - started:.1f} s")
    if against:
        started = time.perf_counter()
        ab_rows = gate_ab.check_against(args.against, options, repo=repo, current=repo,
                                        progress=_progress, spread=spread)
        if ab_rows is None:  # another rank's share: rank 0 reports
            return None
        rows += ab_rows
        notes.append(f"A/B: timed at {options.threads} torch thread"
                     f"{'s' * (options.threads != 1)}" + _threads_source(args.threads))
        if not counters:
            notes.append("COUNTERS NOT CHECKED: --against times the two trees only; op calls, "
                         "host syncs and allocations are checked by --counters (add it, or run "
                         "`python -m harness.gate` with no check named)")
        _progress(f"A/B: {time.perf_counter() - started:.1f} s")
    return rows, notes


def _threads_source(option: int | None, config: int | None = None) -> str:
    """Where a timing check's thread count came from, for its note."""
    if option:
        return " (--threads)"
    if config:
        return " (sampling.threads of the invariants config)"
    return ", harness.run's default (--threads sets another)"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked, with the project's settings and findings modules read
    (usage errors raise `UsageError`)."""
    args = build_parser().parse_args(argv)
    _check_options(args)
    return args


@exits.command
def main(argv: list[str] | None = None) -> int:
    isolate_compile_cache()
    check_isas_lazily()
    args = parse(argv)
    if args.update_baseline:
        return _update(args)
    if Launch.from_environment().distributed:  # torchrun: the A/B sessions over the ranks
        spread = Spread()
        try:
            result = run_checks(args, spread)
            try:
                code = _report(args, result)
            except UsageError as err:  # said by rank 0; every rank must still hear the status
                print(f"error: {err}", file=sys.stderr)
                code = exits.USAGE
            return spread.agree(code)
        finally:
            spread.close()
    return _report(args, run_checks(args))


def _report(args: argparse.Namespace, result: tuple[list[GateRow], list[str]] | None
            ) -> int | None:
    """Print the table and its notes (and write --json and the step summary); the exit
    status. None on a rank that only ran its share of the A/B sessions."""
    if result is None:
        return None
    rows, notes = result
    print(render_markdown(rows))
    print()
    for note in notes:
        print(f"note: {note}")
    print(summary_line(rows))
    if args.json is not None:
        with lock.hold(args.json.parent, f"--json {args.json}"):
            atomic_write_text(args.json, json.dumps(rows_document(rows, notes), indent=1) + "\n")
    if step_summary_path() is not None:
        append_step_summary(rows, step_summary_path(), notes)
    if any(row.outcome in (Outcome.REGRESSION, Outcome.ERROR) for row in rows):
        return exits.FAILED
    if _runs(args)[0]:
        gap = gate_counters.coverage_error(rows, args.baseline, args.allow_new)
        if gap is not None:
            raise UsageError(gap)
    return exits.PASS


if __name__ == "__main__":
    exit_process(main())
