"""`python -m harness.bisect`: the first commit where a finding's counters (or time) changed.

    python -m harness.bisect --good REV --bad REV --findings ID [ID ...]
                             [--counter NAME | --time] [--findings-module PKG.MODULE ...]
                             [--margin FRACTION] [--sessions N] [--seed S]

Every candidate commit is checked out into a temporary git worktree of its own and
measured in a fresh process on that commit's code (`harness.bisect.probe`). On counters
(every counter of the gate, or `--counter NAME`) one run per commit decides: the counts are
exact. On `--time` each commit is timed against the good commit by the gate's paired A/B
check, with a margin, and an inconclusive commit is measured once more before the search
goes on or says it cannot decide (`harness.bisect.timing`). A commit where the findings are
missing or do not import is skipped and named. The user's checkout, branch and files are
never touched; the worktrees are removed on every way out, Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import exits, options
from harness import findings as registry
from harness.bisect import commits as git_commits, timing
from harness.bisect.commits import Commit
from harness.bisect.probe import (
    CommitCounts, ProbeConfig, counter_changes, counter_decision, measure_commit, usable_cells,
)
from harness.bisect.search import Decision, Found, expected_steps, first_change
from harness.exits import UsageError
from harness.gate import ab as gate_ab
from harness.gate.counters import COUNTERS
from harness.gate.table import GateRow
from harness.measure.decision import DEFAULT_MARGIN
from harness.project import load_findings


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(
        prog="python -m harness.bisect", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=exits.epilog(
            "a first changed commit was found and named (hash, subject, the change and the "
            "lines of your code behind it)",
            "no commit was named: the bad commit does not differ from the good one, or "
            "skipped or inconclusive commits hide which one changed it (the output names "
            "the candidates)") + (
            "\n(an unknown revision, a good revision that is not an ancestor of the bad one, "
            "an unknown finding or counter, no git repository, or a good or bad commit "
            "where the findings cannot be measured is an input error, 2)\n"
            "Progress goes to standard error, the answer to standard output."))
    exits.add_version(p)
    p.add_argument("--good", required=True, metavar="REV",
                   help="a commit where the finding was as it should be (older)")
    p.add_argument("--bad", required=True, metavar="REV",
                   help="a later commit where it had changed (a descendant of --good)")
    p.add_argument("--findings", required=True, nargs="+", metavar="ID",
                   help="the findings whose quick cases are measured on each commit")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--counter", choices=COUNTERS,
                      help="the counter that changed (default: any of them)")
    what.add_argument("--time", action="store_true",
                      help="bisect on time: each commit timed against --good, paired (the "
                           "gate's A/B check), with --margin")
    p.add_argument("--findings-module", action="append", metavar="PKG.MODULE",
                   help="import this module for its harness.findings.register calls (your "
                        "own findings; repeatable), after those named in pyproject.toml")
    p.add_argument("--margin", type=options.fraction, metavar="FRACTION",
                   help=f"--time: a change smaller than this is no change (default "
                        f"{DEFAULT_MARGIN})")
    p.add_argument("--sessions", type=options.at_least(gate_ab.MIN_SESSIONS), metavar="N",
                   help=f"--time: A/B worker processes per commit (default "
                        f"{gate_ab.ABOptions.sessions}, at least 6)")
    p.add_argument("--seed", type=options.seed, default=0, metavar="S",
                   help="input seed (default 0)")
    return p


@dataclass(frozen=True)
class Setup:
    """Everything checked before anything is measured."""

    repo: Path
    good: Commit
    bad: Commit
    candidates: tuple[Commit, ...]
    """The commits after good up to bad, oldest first (bad last)."""
    probe: ProbeConfig
    counters: tuple[str, ...]
    ab: gate_ab.ABOptions | None
    """The A/B options of --time, else None."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _repository(ids: tuple[str, ...]) -> tuple[Path, tuple[str, ...], tuple[str, ...]]:
    """The repository whose commits are bisected, the findings modules that hold `ids` and
    the folders they are imported through."""
    origins = tuple(dict.fromkeys(registry.ORIGINS.get(i, "register()") for i in ids))
    for name in origins:
        file = Path(sys.modules[name].__file__).resolve()
        git_commits.repository(file.parent, f"{name} ({file})")
    try:
        repo, folders = gate_ab.user_trees(origins)
    except UsageError as err:
        raise UsageError(str(err).replace("--against: ", "bisect: ", 1)) from err
    return repo, origins, folders


def _check(args: argparse.Namespace) -> Setup:
    """Every option, the findings, the repository and the revisions, before measuring."""
    if not args.time:
        for name, value in (("--margin", args.margin), ("--sessions", args.sessions)):
            if value is not None:
                raise UsageError(f"{name}: expected with --time (it sets the timing check); "
                                 f"got {name} {value} without --time")
    # the repository is left as it was found: its findings are imported from the working
    # tree, and Python would leave __pycache__ folders in it
    sys.dont_write_bytecode = True
    _, modules = load_findings(args.findings_module)
    ids = tuple(dict.fromkeys(args.findings))
    try:
        registry.select(list(ids), modules=modules)
    except ValueError as err:  # the registry names the unknown and the known ids
        raise UsageError(str(err)) from err
    ungated = [i for i in ids if not registry.FINDINGS[i].gated]
    if ungated and not args.time:
        raise UsageError(f"--findings: expected findings with deterministic counters "
                         f"(gated); got {', '.join(ungated)} (gated=False in its Finding); "
                         "bisect it with --time")
    repo, modules, folders = _repository(ids)
    good = git_commits.resolve(repo, args.good, "--good")
    bad = git_commits.resolve(repo, args.bad, "--bad")
    git_commits.check_order(repo, good, bad, (args.good, args.bad))
    candidates = tuple(git_commits.between(repo, good, bad))
    probe = ProbeConfig(findings=ids, findings_modules=modules, paths=folders, seed=args.seed)
    ab = None
    if args.time:
        margin = DEFAULT_MARGIN if args.margin is None else args.margin
        ab = gate_ab.ABOptions(
            findings=ids, margin=margin, seed=args.seed, findings_modules=modules,
            paths=folders,
            sessions=gate_ab.ABOptions.sessions if args.sessions is None else args.sessions)
    counters = (args.counter,) if args.counter else COUNTERS
    return Setup(repo, good, bad, candidates, probe, counters, ab)


@dataclass
class Progress:
    """How far a bisect got: what an interrupted one says."""

    total: int
    """Runs expected without skips or re-measurements (2 + log2 of the commits between)."""
    runs: int = 0
    last_good: Commit | None = None
    first_bad: Commit | None = None
    skipped: list[tuple[Commit, str]] = field(default_factory=list)

    def start(self, commit: Commit, role: str) -> None:
        self.runs += 1
        _say(f"step {self.runs}/{max(self.total, self.runs)}: testing {commit.text()}"
             f"{f' ({role})' if role else ''} ...")

    def where(self) -> str:
        if self.last_good is None or self.first_bad is None:
            return "before the good and bad commits were both measured"
        return (f"the first change lies after {self.last_good.short} and at or before "
                f"{self.first_bad.short}")


def _decider(setup: Setup, progress: Progress, measure: Callable[[Commit], tuple[Decision, str]]
             ) -> Callable[[int], Decision]:
    """`search.first_change`'s decide: measure candidate `index`, say it, keep the progress."""
    def decide(index: int) -> Decision:
        commit = setup.candidates[index]
        progress.start(commit, "")
        decision, why = measure(commit)
        _say(f"  {decision.value}: {why}")
        if decision is Decision.GOOD:
            progress.last_good = commit
        elif decision is Decision.BAD:
            progress.first_bad = commit
        elif decision is Decision.SKIP:
            progress.skipped.append((commit, why))
        return decision
    return decide


def _commit_at(setup: Setup, index: int) -> Commit:
    return setup.good if index < 0 else setup.candidates[index]


def _unpinned(setup: Setup, found: Found, progress: Progress) -> str:
    """Why no commit is named: the candidates and what hid them."""
    low, high = _commit_at(setup, found.last_good), _commit_at(setup, found.first_bad)
    if found.undecided is not None:
        return (f"cannot decide between {low.text()} and {high.text()}: "
                f"{setup.candidates[found.undecided].short} was inconclusive twice")
    why = dict((c.sha, w) for c, w in progress.skipped)
    options = [setup.candidates[i] for i in range(found.last_good + 1, found.first_bad + 1)]
    return (f"cannot decide between {low.text()} and {high.text()}: the first change is one "
            "of " + ", ".join(c.short for c in options) + " ("
            + "; ".join(f"{c.short} skipped: {why[c.sha]}" for c in options if c.sha in why) + ")")


def _runs_line(setup: Setup, progress: Progress) -> str:
    """'runs: 7 (the good and bad commits and 5 of the 10 between); skipped: ...'. On
    --time the good commit is the reference of every run, not a run of its own."""
    between = len(setup.candidates) - 1
    ends = "the bad commit" if setup.ab else "the good and bad commits"
    inside = progress.runs - (1 if setup.ab else 2)
    text = (f"runs: {progress.runs} ({ends} and {inside} of the {between} between)" if between
            else f"runs: {progress.runs} ({ends}; no commit between them)")
    if progress.skipped:
        text += "; skipped: " + "; ".join(f"{c.short} ({why})" for c, why in progress.skipped)
    return text


def _bisect_counters(setup: Setup, progress: Progress) -> int:
    progress.start(setup.good, "good")
    good = measure_commit(setup.repo, setup.good, setup.probe)
    if good.unusable is not None or not usable_cells(good):
        raise UsageError(f"--good {setup.good.short}: expected the findings measurable there; "
                         f"got {good.unusable or 'no cell counted: ' + _failures(good)}")
    _say(f"  {len(usable_cells(good))} cells counted")
    progress.last_good = setup.good
    measured: dict[str, CommitCounts] = {}

    def measure(commit: Commit) -> tuple[Decision, str]:
        measured[commit.sha] = measure_commit(setup.repo, commit, setup.probe, reference=good)
        return counter_decision(good, measured[commit.sha], setup.counters)

    progress.start(setup.bad, "bad")
    decision, why = measure(setup.bad)
    _say(f"  {decision.value}: {why}")
    if decision is Decision.SKIP:
        raise UsageError(f"--bad {setup.bad.short}: expected the findings measurable there; "
                         f"got {why}")
    if decision is Decision.GOOD:
        print(f"no change: the {', '.join(setup.counters)} of {', '.join(setup.probe.findings)} "
              f"are the same at {setup.bad.text()} as at {setup.good.text()}")
        return exits.FAILED
    progress.first_bad = setup.bad
    found = first_change(len(setup.candidates), _decider(setup, progress, measure))
    if not found.pinned:
        print(_unpinned(setup, found, progress))
        print(_runs_line(setup, progress))
        return exits.FAILED
    first = setup.candidates[found.first_bad]
    print(f"first changed commit: {first.text()}")
    for cell, text in counter_changes(good, measured[first.sha], setup.counters):
        print(f"  {cell.label()}: {text}")
    print(_runs_line(setup, progress))
    return exits.PASS


def _failures(counts: CommitCounts) -> str:
    return "; ".join(f"{c.label()}: {c.error or c.skipped}" for c in counts.cells.values()) or "none"


def _bisect_time(setup: Setup, progress: Progress) -> int:
    options, margin = setup.ab, setup.ab.margin
    label = f"{setup.good.short} (good)"

    def sessions(tree: Path) -> list[dict] | str:
        return timing.sessions_against(good_tree, tree, options, lambda line: _say(f"  {line}"))

    def timed(commit: Commit) -> tuple[list[GateRow] | None, str]:
        with gate_ab.worktree(setup.repo, commit.sha) as tree:
            first = sessions(tree)
            if isinstance(first, str):
                return None, first
            rows = gate_ab.compare(first, options, label)
            decision, why = timing.time_decision(rows, change, margin)
            if decision is not Decision.UNDECIDED:
                return rows, why
            _say(f"  {why}; measuring it once more")
            more = sessions(tree)
            if isinstance(more, str):
                return None, more
            return gate_ab.compare(first + more, options, label), why

    measured: dict[str, list[GateRow]] = {}

    def measure(commit: Commit) -> tuple[Decision, str]:
        rows, why = timed(commit)
        if rows is None:
            return Decision.SKIP, why
        measured[commit.sha] = rows
        return timing.time_decision(rows, change, margin)

    with gate_ab.worktree(setup.repo, setup.good.sha) as good_tree:
        progress.last_good = setup.good
        change: dict = {}
        progress.start(setup.bad, f"bad, against {setup.good.short}")
        rows, why = timed(setup.bad)
        measured[setup.bad.sha] = rows
        if rows is None:
            raise UsageError(f"--bad {setup.bad.short}: expected the findings timeable there and "
                             f"at --good {setup.good.short}; got {why}")
        change = timing.change_of(rows)
        if not change:
            print(f"no change: every cell of {', '.join(setup.probe.findings)} at "
                  f"{setup.bad.text()} is within {margin:.0%} of {setup.good.text()}, or "
                  "undecided: " + "; ".join(f"{r.variant} [{r.case}] {r.change}" for r in rows))
            return exits.FAILED
        _say("  bad: " + "; ".join(f"{k[0]} {k[2]} [{k[1]}] {v.value}" for k, v in change.items()))
        progress.first_bad = setup.bad
        found = first_change(len(setup.candidates), _decider(setup, progress, measure))
    if not found.pinned:
        print(_unpinned(setup, found, progress))
        print(_runs_line(setup, progress))
        return exits.FAILED
    first = setup.candidates[found.first_bad]
    print(f"first changed commit: {first.text()}")
    final = {k: r for k, r in timing.rows_by_cell(measured[first.sha]).items() if k in change}
    for (finding, case, variant), row in final.items():
        print(f"  {finding} {variant} [{case}]: time vs {setup.good.short} {row.change} "
              f"({row.outcome.value}, margin {margin:.0%})")
    print(_runs_line(setup, progress))
    _explain_counters(setup, first)
    return exits.PASS


def _explain_counters(setup: Setup, first: Commit) -> None:
    """After a time bisect: the counters that changed at the first changed commit as well,
    with their lines (two more probes: the good commit and that one)."""
    _say(f"counting {setup.good.short} and {first.short}, to name the lines behind the change")
    good = measure_commit(setup.repo, setup.good, setup.probe)
    if good.unusable is not None:
        return
    here = measure_commit(setup.repo, first, setup.probe, reference=good)
    changes = counter_changes(good, here, COUNTERS)
    print("counters that changed with it:" if changes else
          "counters that changed with it: none (the lines cannot be named from counts)")
    for cell, text in changes:
        print(f"  {cell.label()}: {text}")


@exits.command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup = _check(args)
    progress = Progress((1 if setup.ab else 2) + expected_steps(len(setup.candidates)))
    _say(f"bisect: {', '.join(setup.probe.findings)} "
         f"({'time, margin ' + format(setup.ab.margin, '.0%') if setup.ab else ', '.join(setup.counters)}) "
         f"over {len(setup.candidates)} commit{'s' if len(setup.candidates) != 1 else ''} "
         f"after {setup.good.short} up to {setup.bad.short}; "
         f"about {progress.total} runs")
    try:
        return (_bisect_time if setup.ab else _bisect_counters)(setup, progress)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the worktrees are gone; say how far it got
        _say(f"interrupted at step {progress.runs} of about {progress.total}: {progress.where()}"
             + (f"; skipped so far: {', '.join(c.short for c, _ in progress.skipped)}"
                if progress.skipped else ""))
        raise


if __name__ == "__main__":
    sys.exit(main())
