"""`python -m harness.gate.quality`: how often the gate cries wolf, and how often it catches a wolf.

Runs each check of `harness.gate` many times on unchanged code (every flagged run is a
false positive) and with a planted regression from `harness.gate.plant` (every run that
passes is a miss), then prints one markdown table of rates plus the numbers behind them.

  a. counters, unchanged, and with one extra allocation in the plant target: each run a
     fresh `python -m harness.gate --counters` process against the committed baseline;
  b. invariants, unchanged, with the plant target 1.25x slower, and 5x slower: each run a
     fresh `--invariants` process; also reports each invariant's measured speedups, from
     which the thresholds of the invariants config are set (median / 3);
  c. A/B against HEAD, the current side a worktree of HEAD (unchanged) or a copy of it
     whose target module slows the plant target (by 1.25x, or each of --ab-slowdowns);
     each run checks out HEAD afresh.

The plant target is the findings modules' `harness.Defaults.plant` (the findings modules
are those the nearest pyproject.toml names, then --findings-module, as for the gate).

Plants live only in throw-away processes or copies; the tree itself is never modified.
`--busy N` keeps N CPU-bound processes running beside every measurement, as another
job on a shared CI machine would. Nothing outlives the command: on Ctrl-C or SIGTERM the
busy processes, the gate processes and the A/B worktree are removed, and a busy process
whose parent was killed outright (SIGKILL) stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness import exits, options
from harness import findings as registry
from harness.findings import PlantTarget
from harness.exits import UsageError, run_group, signals_deferred
from harness.gate import ab as gate_ab, cli as gate_cli
from harness.gate.plant import plant_lines
from harness.gate.table import rows_document
from harness.project import load_findings
from harness.ranks import Launch, Spread, exit_process
from harness.results import atomic_write_text
from harness.spawn import solo_environment

SMALL_SLOWDOWN = 1.25
LARGE_SLOWDOWN = 5.0

#: a process that installs a plant, then runs the gate's CLI with the remaining arguments
_PLANTED_GATE = """
import sys
from harness.findings import PlantTarget
from harness.gate import cli as gate, plant as gate_plant
wrap = {wrap}
with gate_plant.planted(PlantTarget(*{target!r}), wrap):
    code = gate.main(sys.argv[1:])
sys.exit(code)
"""


@dataclass
class Scenario:
    """Runs of one check under one condition, and what each run reported."""

    check: str
    condition: str
    expect_flag: bool
    """True for a planted regression (a flagged run is a detection)."""
    exit_codes: list[int] = field(default_factory=list)
    rows: list[list[dict]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    """The torchrun rank that made each run (0 without torchrun)."""

    @property
    def flagged(self) -> int:
        return sum(code == 1 for code in self.exit_codes)



def _gate_process(args: list[str], wrap: str | None, target: PlantTarget
                  ) -> tuple[int, list[dict], float]:
    """Run the gate's CLI in a fresh process (with `target` planted when `wrap` is given)."""
    with tempfile.TemporaryDirectory(prefix="gate-quality-") as folder:
        out = Path(folder) / "rows.json"
        if wrap is None:
            command = [sys.executable, "-m", "harness.gate", *args, "--json", str(out)]
        else:
            source = _PLANTED_GATE.format(wrap=wrap, target=(target.module, target.attribute,
                                                             target.key))
            command = [sys.executable, "-c", source, *args, "--json", str(out)]
        started = time.perf_counter()
        done = run_group(command, cwd=Path.cwd(), env=solo_environment())
        seconds = time.perf_counter() - started
        if done.returncode == exits.USAGE:  # e.g. a missing or outdated baseline
            lines = done.stderr.strip().splitlines() or ["(no message)"]
            raise UsageError(f"the gate ({' '.join(args)}) cannot run here: {lines[-1]}")
        if done.returncode not in (exits.PASS, exits.FAILED):
            raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}: "
                               f"{done.stderr.strip()[-500:]}")
        rows = json.loads(out.read_text())["rows"]
    return done.returncode, rows, seconds


def _runs(scenario: Scenario, count: int, run: Callable[[int], tuple[int, list[dict], float]],
          spread: Spread | None) -> Scenario | None:
    """`count` runs of `scenario`, here or shared out over torchrun's ranks (`spread`):
    each gives (exit code, rows, seconds). Rank 0 gets the scenario with every run in
    run order, the other ranks None; a run that failed is an error on rank 0."""
    def job(index: int) -> dict:
        code, rows, seconds = run(index)
        return {"code": code, "rows": rows, "seconds": seconds,
                "rank": spread.launch.rank if spread else 0}

    results = [job(i) for i in range(count)] if spread is None else spread.run(count, job)
    if results is None:
        return None
    failed = [r["error"] for r in results if "error" in r]
    if failed:
        raise RuntimeError(f"{scenario.check} / {scenario.condition}: a run failed: {failed[0]}")
    for result in results:
        scenario.exit_codes.append(result["code"])
        scenario.rows.append(result["rows"])
        scenario.seconds.append(result["seconds"])
        scenario.ranks.append(result["rank"])
    return scenario


def run_cli_scenario(check: str, condition: str, args: list[str], wrap: str | None,
                     target: PlantTarget, runs: int, expect_flag: bool,
                     progress: Callable[[str], None],
                     spread: Spread | None = None) -> Scenario | None:
    def run(index: int) -> tuple[int, list[dict], float]:
        code, rows, seconds = _gate_process(args, wrap, target)
        progress(f"{check} / {condition}: run {index + 1}/{runs} exit {code} ({seconds:.0f} s)")
        return code, rows, seconds

    return _runs(Scenario(check, condition, expect_flag), runs, run, spread)


def _copy_tree(source: Path, destination: Path) -> None:
    """Copy the files git tracks (or would track) under `source` to `destination`."""
    listed = subprocess.run(["git", "-C", str(source), "ls-files", "-co", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for name in listed:
        target = destination / name
        if (source / name).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, target)


def plant_target(modules: list[str]) -> PlantTarget:
    """Where regressions are planted: the findings modules' `Defaults.plant`; UsageError
    when none names one."""
    target = registry.defaults(modules).plant
    if target is None:
        raise UsageError("harness.gate.quality: expected a plant target (harness.Defaults.plant "
                         "in a findings module); got none")
    return target


def ab_options(modules: list[str]) -> tuple[gate_ab.ABOptions, Path]:
    """Check c's options and repository as `python -m harness.gate --against HEAD` picks
    them for the findings modules `modules`, so that the rates measured are the gate's
    own."""
    return gate_cli.ab_options(gate_cli.parse(["--against", "HEAD", *_module_args(modules)]))


def _module_args(modules: list[str]) -> list[str]:
    """`--findings-module M` for each of `modules` (the gate also reads pyproject.toml's)."""
    return [arg for module in modules for arg in ("--findings-module", module)]


def planted_copy(tree: Path, destination: Path, factor: float, target: PlantTarget) -> Path:
    """A copy of `tree` whose `target`'s module slows the target by `factor` (with the
    installed `harness.gate.plant`, which the A/B worker shares between the trees)."""
    _copy_tree(tree, destination)
    with open(destination / target.file, "a") as handle:
        handle.write(plant_lines(target, factor))
    return destination


def run_ab_scenarios(runs: int, planted_runs: int, options: gate_ab.ABOptions, repo: Path,
                     target: PlantTarget, progress: Callable[[str], None],
                     spread: Spread | None = None,
                     slowdowns: tuple[float, ...] = (SMALL_SLOWDOWN,)) -> list[Scenario]:
    """Check c against HEAD of `repo`: current = a worktree of HEAD, then a copy of it
    planted with each of `slowdowns` in turn."""
    commit = gate_ab.resolve_revision(repo, "HEAD")
    scenarios = []
    with gate_ab.worktree(repo, commit) as unchanged, \
            tempfile.TemporaryDirectory(prefix="gate-quality-") as folder:
        conditions = [("unchanged", unchanged, runs, False)]
        for factor in slowdowns if planted_runs else ():
            tree = planted_copy(unchanged, Path(folder) / f"tree-{factor:g}", factor, target)
            conditions.append((f"{target.key} {factor:g}x slower", tree, planted_runs, True))
        for condition, tree, count, expect in conditions:
            if not count:
                continue

            def run(index: int, tree=tree, condition=condition, count=count):
                started = time.perf_counter()
                rows = gate_ab.check_against(commit, options, repo=repo, current=tree)
                fails = any(row.outcome.fails for row in rows)
                seconds = time.perf_counter() - started
                progress(f"A/B / {condition}: run {index + 1}/{count} "
                         f"{'flagged' if fails else 'passed'} ({seconds:.0f} s)")
                return (1 if fails else 0), rows_document(rows)["rows"], seconds

            scenario = _runs(Scenario("c A/B vs HEAD", condition, expect), count, run, spread)
            if scenario is not None:
                scenarios.append(scenario)
    return scenarios


#: a CPU-bound loop that stops once its parent (pid in argv[1]) is gone, killed outright
#: with no cleanup; given by pid, since the parent may die before this process starts
SPINNER = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(100_000):
        pass
"""


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[list[subprocess.Popen]]:
    """`count` processes spinning a CPU core each while inside; killed on every way out
    (an exception, Ctrl-C, SIGTERM), and stopping by themselves if this process dies."""
    spinners: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            spinners.append(subprocess.Popen([sys.executable, "-c", SPINNER, str(os.getpid())]))
        yield spinners
    finally:
        with signals_deferred():
            for spinner in spinners:
                spinner.kill()
                spinner.wait()


# ---------------------------------------------------------------------------------- report

def _rate(count: int, total: int) -> str:
    return f"{count}/{total} ({100 * count / total:.0f}%)" if total else "0 runs"


def scenario_table(scenarios: list[Scenario]) -> str:
    lines = ["| check | condition | runs | flagged (exit 1) | false positives | detected | "
             "seconds per run (median) |", "|---|---|---|---|---|---|---|"]
    for s in scenarios:
        runs = len(s.exit_codes)
        fp = "" if s.expect_flag else _rate(s.flagged, runs)
        detected = _rate(s.flagged, runs) if s.expect_flag else ""
        lines.append(f"| {s.check} | {s.condition} | {runs} | {s.flagged} | {fp} | {detected} | "
                     f"{statistics.median(s.seconds):.1f} |")
    return "\n".join(lines)


def timing_table(scenarios: list[Scenario]) -> str:
    """Per timing row (invariant or A/B cell) and condition: the ratio's spread over runs."""
    lines = ["| check | condition | variant | case | runs | ratio median (min - max) | "
             "lowest CI low | highest CI high | runs failing |", "|---|---|---|---|---|---|---|---|---|"]
    for s in scenarios:
        cells: dict[tuple[str, str, str], list[dict]] = {}
        for rows in s.rows:
            for row in rows:
                if row["ci"] is not None:
                    cells.setdefault((row["check"], row["variant"], row["case"]), []).append(row)
        for (check, variant, case), rows in cells.items():
            ci = [r["ci"] for r in rows]
            ratios = [c["ratio"] for c in ci]
            lines.append(
                f"| {check} | {s.condition} | {variant} | {case} | {len(rows)} | "
                f"{statistics.median(ratios):.3g} ({min(ratios):.3g} - {max(ratios):.3g}) | "
                f"{min(c['low'] for c in ci):.3g} | {max(c['high'] for c in ci):.3g} | "
                f"{sum(r['fails'] for r in rows)} |")
    return "\n".join(lines)


def _slowdowns(text: str) -> tuple[float, ...]:
    """argparse type: factors > 1 separated by commas."""
    try:
        factors = tuple(float(part) for part in text.split(","))
    except ValueError:
        factors = ()
    if not factors or not all(math.isfinite(f) and f > 1.0 for f in factors):
        raise argparse.ArgumentTypeError(f"expected factors > 1 separated by commas, e.g. "
                                         f"1.05,1.15; got {text!r}")
    return factors


def build_parser() -> argparse.ArgumentParser:
    p = options.Parser(prog="python -m harness.gate.quality",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=exits.epilog("every run done (the tables give the rates; "
                                                    "a flagged run is not a failure here)"))
    exits.add_version(p)
    p.add_argument("--counters-runs", type=options.count, default=10, metavar="N",
                   help="runs of check a per condition (default 10)")
    p.add_argument("--invariant-runs", type=options.count, default=20, metavar="N",
                   help="runs of check b per condition (default 20)")
    p.add_argument("--ab-runs", type=options.count, default=10, metavar="N",
                   help="runs of check c on unchanged code (default 10)")
    p.add_argument("--ab-planted-runs", type=options.count, default=20, metavar="N",
                   help="runs of check c with the planted slowdown (default 20)")
    p.add_argument("--ab-slowdowns", type=_slowdowns, default=(SMALL_SLOWDOWN,),
                   metavar="F,F,...",
                   help=f"check c: the planted slowdowns, each with --ab-planted-runs runs "
                        f"(default {SMALL_SLOWDOWN:g}; e.g. 1.05,1.10,1.15,1.25 for a power "
                        "curve)")
    p.add_argument("--busy", type=options.count, default=0, metavar="N",
                   help="CPU-bound processes kept running beside the measurements (default 0)")
    p.add_argument("--json", type=options.path, metavar="FILE", help="also write every run's rows here")
    p.add_argument("--findings-module", action="append", metavar="PKG.MODULE",
                   help="import this module for its harness.findings.register calls "
                        "(repeatable), after those named in pyproject.toml")
    return p


@exits.command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _, modules = load_findings(args.findings_module)
    args.findings_module = list(modules)
    if args.json is not None:
        exits.check_writable(args.json, "--json")
    spread = Spread() if Launch.from_environment().distributed else None
    try:
        leader = spread is None or spread.launch.leader
        with busy_processes(args.busy if leader else 0):
            scenarios = run_scenarios(args, spread)
        if not leader:  # its runs went to rank 0, which reports
            return spread.agree(None)
        print(scenario_table(scenarios))
        print()
        print(timing_table(scenarios))
        if args.json is not None:
            document = [{"check": s.check, "condition": s.condition,
                         "expect_flag": s.expect_flag, "exit_codes": s.exit_codes,
                         "seconds": s.seconds, "ranks": s.ranks, "rows": s.rows}
                        for s in scenarios]
            atomic_write_text(args.json, json.dumps(document, indent=1) + "\n")
        return 0 if spread is None else spread.agree(0)
    finally:
        if spread is not None:
            spread.close()


def run_scenarios(args: argparse.Namespace, spread: Spread | None = None) -> list[Scenario]:
    """Every scenario the run counts in `args` ask for, in order: a, b, c (under torchrun,
    each scenario's runs shared out over the ranks; the scenarios on rank 0 only)."""

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    modules = _module_args(args.findings_module)
    target = plant_target(args.findings_module)
    allocating = "gate_plant.allocating"
    slowed = "lambda fn: gate_plant.slowed(fn, {factor!r})"
    scenarios = []
    if args.counters_runs:
        scenarios += [
            run_cli_scenario("a counters", "unchanged", ["--counters", *modules], None, target,
                             args.counters_runs, False, progress, spread),
            run_cli_scenario("a counters", f"{target.key} +1 allocation",
                             ["--counters", *modules], allocating, target, args.counters_runs, True,
                             progress, spread),
        ]
    if args.invariant_runs:
        scenarios += [
            run_cli_scenario("b invariants", "unchanged", ["--invariants", *modules], None, target,
                             args.invariant_runs, False, progress, spread),
            run_cli_scenario("b invariants", f"{target.key} {SMALL_SLOWDOWN:g}x slower",
                             ["--invariants", *modules], slowed.format(factor=SMALL_SLOWDOWN),
                             target, args.invariant_runs, True, progress, spread),
            run_cli_scenario("b invariants", f"{target.key} {LARGE_SLOWDOWN:g}x slower",
                             ["--invariants", *modules], slowed.format(factor=LARGE_SLOWDOWN),
                             target, args.invariant_runs, True, progress, spread),
        ]
    if args.ab_runs or args.ab_planted_runs:
        ab, repo = ab_options(args.findings_module)
        scenarios += run_ab_scenarios(args.ab_runs, args.ab_planted_runs, ab, repo, target,
                                      progress, spread, args.ab_slowdowns)
    return [s for s in scenarios if s is not None]


if __name__ == "__main__":
    exit_process(main())
