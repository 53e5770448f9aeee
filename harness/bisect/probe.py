"""One commit measured on its own code: a temporary git worktree and a fresh process.

`measure_commit` checks the commit out into a detached worktree in a temporary folder
(`harness.gate.ab.worktree`, the gate's: removed on every way out, Ctrl-C and SIGTERM
included, and a killed run's worktree removed by the next), runs `child.py` there in a
process group of its own (`harness.exits.run_group`: killed with anything it started on
every way out) and reads back the counters of every quick cell of the findings
(`CommitCounts`). `counter_decision` holds one commit's counters against the good
commit's: one run per commit decides, since the counts are exact.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness import explain
from harness.bisect.commits import Commit
from harness.bisect.search import Decision
from harness.exits import run_group
from harness.gate.ab import worktree
from harness.measure.sources import Sources
from harness.spawn import solo_environment

CHILD_SOURCE = Path(__file__).with_name("child.py")
Key = tuple[str, str, str]
"""(finding, case label, variant)."""


@dataclass(frozen=True)
class ProbeConfig:
    """What each commit's probe measures."""

    findings: tuple[str, ...]
    """Finding ids whose quick cases are counted."""
    findings_modules: tuple[str, ...] = ()
    """The findings modules, imported from each commit's tree."""
    paths: tuple[str, ...] = (".",)
    """Folders of the tree, relative to its root, that your modules are imported through."""
    seed: int = 0
    """Input seed of every finding's `build`."""


@dataclass(frozen=True)
class CellResult:
    """One finding x quick case x variant on one commit: counts, or why there are none."""

    key: Key
    counts: dict[str, int] | None = None
    sources: Sources | None = None
    """Where the counts come from, where the probe attributed them."""
    error: str | None = None
    skipped: str | None = None

    def label(self) -> str:
        """'MY-scale mylib [n=64]'."""
        return f"{self.key[0]} {self.key[2]} [{self.key[1]}]"


@dataclass(frozen=True)
class CommitCounts:
    """One commit's probe: every cell, or why the findings could not be measured there."""

    commit: Commit
    cells: dict[Key, CellResult] = field(default_factory=dict)
    unusable: str | None = None
    """The findings are missing or do not import on this commit (it is skipped)."""


def _cells(document: dict) -> dict[Key, CellResult]:
    cells = {}
    for raw in document["cells"]:
        key = (raw["finding"], raw["case"], raw["variant"])
        sources = Sources.from_json(raw["sources"]) if raw.get("sources") is not None else None
        cells[key] = CellResult(key, raw.get("counts"), sources, raw.get("error"),
                                raw.get("skipped"))
    return cells


def measure_commit(repo: Path, commit: Commit, config: ProbeConfig, *,
                   reference: CommitCounts | None = None) -> CommitCounts:
    """The counters of `config.findings`' quick cells on `commit`'s code. Without a
    `reference` every cell's sources are attributed too (the good commit's: what a later
    change is explained against); with one, only the cells whose counts differ from it."""
    document = {
        "findings": list(config.findings), "findings_modules": list(config.findings_modules),
        "paths": list(config.paths), "seed": config.seed, "parent": os.getpid(),
        "attribute": "all" if reference is None else "changed",
        "reference": [] if reference is None else [
            {"key": list(c.key), "counts": c.counts} for c in reference.cells.values()
            if c.counts is not None],
    }
    env = {k: v for k, v in solo_environment().items() if k != "PYTHONPATH"}
    with worktree(repo, commit.sha) as tree:
        document["tree"] = str(tree)
        with tempfile.TemporaryDirectory(prefix="bisect-probe-") as neutral:
            done = run_group([sys.executable, "-c", CHILD_SOURCE.read_text(),
                              json.dumps(document)], cwd=neutral, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return CommitCounts(commit, unusable=f"the probe exited with {done.returncode}: {tail}")
    result = json.loads(done.stdout)
    if "unusable" in result:
        return CommitCounts(commit, unusable=result["unusable"])
    return CommitCounts(commit, _cells(result))


def usable_cells(counts: CommitCounts) -> dict[Key, CellResult]:
    """The cells that were counted (not skipped, not failed)."""
    return {k: c for k, c in counts.cells.items() if c.counts is not None}


def counter_decision(good: CommitCounts, at: CommitCounts, counters: tuple[str, ...]
                     ) -> tuple[Decision, str]:
    """Whether `at` changed `counters` of any cell counted on the good commit, and why in
    words: BAD (a counter differs), GOOD (none does) or SKIP (the findings are not there,
    or a cell of the good commit cannot be counted here)."""
    if at.unusable is not None:
        return Decision.SKIP, at.unusable
    for key, cell in usable_cells(good).items():
        here = at.cells.get(key)
        if here is None or here.counts is None:
            why = "not measured" if here is None else here.error or here.skipped
            return Decision.SKIP, f"{cell.label()}: {why}"
    differing = []
    for key, cell in usable_cells(good).items():
        here = at.cells[key].counts
        moved = [f"{c} {cell.counts.get(c)} -> {here.get(c)}" for c in counters
                 if here.get(c) != cell.counts.get(c)]
        if moved:
            differing.append(f"{cell.label()} {', '.join(moved)}")
    if differing:
        return Decision.BAD, "; ".join(differing)
    return Decision.GOOD, "unchanged"


def counter_changes(good: CommitCounts, at: CommitCounts, counters: tuple[str, ...]
                    ) -> list[tuple[CellResult, str]]:
    """Each cell of `at` whose `counters` differ from the good commit's, with the change in
    words and, where both sides were attributed, the ops and lines that differ."""
    out = []
    for key, cell in usable_cells(good).items():
        here = at.cells.get(key)
        if here is None or here.counts is None:
            continue
        before = {c: cell.counts.get(c) for c in counters}
        after = {c: here.counts.get(c) for c in counters}
        if before == after:
            continue
        old = cell.sources if here.sources is not None else None
        text = explain.between(before, after, old, here.sources or Sources(()))
        out.append((here, text))
    return out
