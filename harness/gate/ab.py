"""Gate check c: paired A/B timing of the current tree against a git revision.

`--against REV` checks REV out into a temporary worktree, then runs `sessions` short
worker processes (`harness/gate/worker.py`), each of which imports both trees side by
side and times every cell (finding x quick case x variant) of the two in alternation,
round after round. A session's ratio for a cell is the median, over its rounds, of
current/REV of neighbouring samples: both sides ran on the same machine state, in the
same process, moments apart.

The verdict then rests on the sessions, independent processes: each session's rounds
give its own paired estimate of current / REV (the 20%-trimmed mean of the per-round log
ratios), and the sessions' estimates are averaged, with a variance moderated between
their own spread and the spread of every cell of the gate run at that call length, as
the sessions measured it (`harness.measure.estimate.pool_spread` and `row_estimate`:
nothing assumed of the machine). A cell regresses when a one-sided test says it is
slower at all, with Holm's correction over every cell of the gate run (so that the chance
of calling any unchanged cell slower in one gate run is at most `alpha`, 5%), and its
estimate lies beyond the margin (`margin`, default 5%: the size that matters); it
improved when the same holds the other way. (Testing "slower by more than the margin"
instead asks an interval to clear the margin after Holm's correction: a 7.5% slowdown
planted in the scan GAE, measured 1.07-1.08, passed such a gate.)

The two trees are the working folder of the repository holding the findings modules
(`ABOptions.findings_modules`) and a worktree of REV: from each, the worker imports the
findings modules and the code they import from the repository, through the folders of
`sys.path` that lie in it (`user_trees`); the harness doing the measuring is the
installed one, the same for both.

Each worker times at `ABOptions.threads` torch threads, by default those `harness.run`
times at (`harness.ranks.timing_threads`): the gate guards the regime the run reports.

Why so: on a shared 2-vCPU machine the speed changes at sub-second scales and each
process also keeps a speed of its own, so comparing separate processes of each tree,
even their fastest samples, cannot resolve 25% (tried first: 3 of 6 planted 1.25x
slowdowns caught). In one process, neighbour ratios of an unchanged tree stay within a
few percent (docs/gate.md).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from harness.exits import UsageError, run_group, signals_deferred
from harness.gate.table import GateRow, Outcome
from harness.gate.worker import WorkerConfig
from harness.measure.decision import DEFAULT_MARGIN
from harness.measure.estimate import RowProcesses, pool_spread, row_estimate
from harness.measure.numbers import is_whole
from harness.measure.stats import RatioCI
from harness.ranks import Spread, timing_threads
from harness.spawn import solo_environment

WORKER_SOURCE = Path(__file__).with_name("worker.py")
#: the fewest sessions: the spread of three processes' estimates can say they disagree
MIN_SESSIONS = 3


@dataclass(frozen=True)
class ABOptions:
    """How much to measure and what counts as a regression."""

    findings: tuple[str, ...] = ()
    """Findings whose quick cases are timed (the gate names them: `--findings`, else the
    findings modules' `Defaults.ab_findings`, else every gated finding)."""
    sessions: int = 6
    """Worker processes, each timing both trees; the estimate is over sessions."""
    margin: float = DEFAULT_MARGIN
    """The margin (harness.run's): a cell that is significantly slower than REV regresses
    when its estimate is more than this fraction slower."""
    confidence: float = 0.95
    """1 - alpha: the chance of no false alarm over all cells of one gate run."""
    min_rounds: int = 5
    """Rounds (a sample of each tree) per variant and case in each session, at least."""
    variant_budget_s: float = 0.1
    """Seconds of sampling per variant and case in each session."""
    min_sample_time: float = 1e-3
    """Seconds one sample lasts at least."""
    threads: int = field(default_factory=timing_threads)
    """torch threads in each worker process (default: `harness.run`'s,
    `harness.ranks.timing_threads`, so that the gate times the regime the run reports)."""
    seed: int = 0
    """Input seed."""
    findings_modules: tuple[str, ...] = ()
    """The findings modules, imported from each tree (`findings` are theirs)."""
    paths: tuple[str, ...] = (".",)
    """Folders of each tree, relative to its root, that the worker imports from."""

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1.0:
            raise UsageError(f"confidence: expected a fraction in [0.5, 1); got {self.confidence!r}")
        if not is_whole(self.sessions) or self.sessions < MIN_SESSIONS:
            raise UsageError(f"--sessions: expected an integer >= {MIN_SESSIONS} (processes "
                             f"whose spread the estimate needs); got {self.sessions!r}")
        if not is_whole(self.threads) or self.threads < 1:
            raise UsageError(f"--threads: expected an integer >= 1; got {self.threads!r}")
        if not (math.isfinite(self.margin) and 0.0 < self.margin < 10.0):
            raise UsageError(f"--margin: expected a fraction in (0, 10), e.g. 0.05; "
                             f"got {self.margin!r}")


# ------------------------------------------------------------------------------- git

def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def resolve_revision(repo: Path, rev: str) -> str:
    """The full commit id of `rev` in `repo`; UsageError when git does not know it."""
    done = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise UsageError(f"--against: expected a commit, branch or tag of {repo}; got {rev!r} "
                         "(in a shallow CI clone, fetch it first: git fetch origin <branch>)")
    return done.stdout.strip()


#: prefix of the temporary folder that holds a gate worktree (and its owner's pid)
WORKTREE_PREFIX = "gate-ab-"


def _remove_worktree(repo: Path, folder: Path) -> None:
    """Unregister and delete the worktree in `folder`/tree and the folder itself."""
    _git(repo, "worktree", "remove", "--force", str(folder / "tree"))
    shutil.rmtree(folder, ignore_errors=True)  # the pid file; the tree when git could not
    _git(repo, "worktree", "prune")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def remove_stale_worktrees(repo: Path) -> list[Path]:
    """Remove the worktrees of gates that were killed outright (SIGKILL: no cleanup ran).

    A gate worktree lives in `<tmp>/gate-ab-XXXX/tree`, beside a `pid` file naming the
    process that made it; one whose process is gone is removed. Returns their folders.
    """
    listed = _git(repo, "worktree", "list", "--porcelain").stdout.splitlines()
    removed = []
    for tree in (Path(line.split(" ", 1)[1]) for line in listed if line.startswith("worktree ")):
        folder = tree.parent
        pid_file = folder / "pid"
        if tree.name != "tree" or not folder.name.startswith(WORKTREE_PREFIX):
            continue
        owner = pid_file.read_text().strip() if pid_file.is_file() else ""
        if owner.isdigit() and not _alive(int(owner)):
            _remove_worktree(repo, folder)
            print(f"removed {folder}: the git worktree of a gate or bisect run (pid {owner}) "
                  f"that was killed", file=sys.stderr)
            removed.append(folder)
    _git(repo, "worktree", "prune")  # registrations whose folder was deleted
    return removed


@contextlib.contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached git worktree of `commit` in a temporary folder, removed afterwards.

    Removed on every way out, Ctrl-C and SIGTERM included (`harness.exits.command`
    raises those as exceptions): signals are held while it is created and removed, so
    neither is cut short. Worktrees of gates killed outright are removed first.
    """
    remove_stale_worktrees(repo)
    folder = None
    try:
        with signals_deferred():  # a signal meanwhile is raised on the way out, inside `try`
            folder = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX))
            (folder / "pid").write_text(f"{os.getpid()}\n")
            added = _git(repo, "worktree", "add", "--detach", str(folder / "tree"), commit)
        if added.returncode != 0:
            raise UsageError(f"--against: git worktree add failed: {added.stderr.strip()}")
        yield folder / "tree"
    finally:
        if folder is not None:
            with signals_deferred():
                _remove_worktree(repo, folder)


# ----------------------------------------------------------------------- your repository

def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def import_folders(repo: Path) -> tuple[str, ...]:
    """The folders of `sys.path` inside `repo` (the current folder for `''`), relative to
    it, except those of the Python installation (a virtual environment kept in the
    repository): where this process imports the repository's code from."""
    places = [sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    if sys.prefix != sys.base_prefix:  # a virtual environment: all of it
        places.append(sys.prefix)
    installation = {Path(place).resolve() for place in places}
    folders = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if (path.is_dir() and _inside(path, repo)
                and not any(_inside(path, place) for place in installation)):
            folders.append(path.relative_to(repo).as_posix() or ".")
    return tuple(dict.fromkeys(folders))


def user_trees(modules: Sequence[str]) -> tuple[Path, tuple[str, ...]]:
    """The git repository that holds your (imported) findings `modules`, and the folders
    of it that they are imported through (`import_folders`); UsageError when a module
    lies outside a repository or is imported other than through one of its folders."""
    files = []
    for name in modules:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file is None:
            raise UsageError(f"--against: expected {name} to be an imported module with a "
                             "file (named by --findings-module or [tool.esper-bench]); got "
                             f"{'no such module' if name not in sys.modules else 'no file'}")
        files.append(Path(file).resolve())
    found = _git(files[0].parent, "rev-parse", "--show-toplevel")
    if found.returncode != 0:
        raise UsageError(f"--against: expected {modules[0]} ({files[0]}) in a git repository, "
                         "whose revisions are compared; got a file outside any")
    repo = Path(found.stdout.strip()).resolve()
    folders = import_folders(repo)
    for name, file in zip(modules, files):
        if not any(_inside(file, repo / folder) for folder in folders):
            raise UsageError(
                f"--against: expected {name} ({file}) imported through a folder of "
                f"{repo} on sys.path, so that each revision's copy can be imported the same "
                f"way; got none of sys.path's folders holding it (run the gate from the "
                f"folder that imports it)")
    return repo, folders


# ------------------------------------------------------------------------------- workers

class WorkerFailed(RuntimeError):
    """A worker process exited with an error: the trees cannot be measured at all."""


def run_session(trees: Sequence[Path], options: ABOptions) -> dict:
    """One worker process timing `trees` side by side: its JSON output (harness/gate/worker.py)."""
    config = WorkerConfig(
        trees=tuple(str(t) for t in trees), findings=options.findings,
        min_rounds=options.min_rounds, variant_budget_s=options.variant_budget_s,
        min_sample_time=options.min_sample_time, threads=options.threads, seed=options.seed,
        parent=os.getpid(), findings_modules=options.findings_modules, paths=options.paths,
    )
    env = {k: v for k, v in solo_environment().items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="gate-ab-session-") as neutral:
        # its own process group, killed with anything it started on every way out
        done = run_group(
            [sys.executable, "-c", WORKER_SOURCE.read_text(), json.dumps(asdict(config))],
            cwd=neutral, env=env,
        )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise WorkerFailed(f"the worker on {', '.join(config.trees)} exited with "
                           f"{done.returncode}: {tail[0]}")
    return json.loads(done.stdout)


#: the fields of a worker's cell that hold one entry per tree
_PER_TREE = ("samples", "errors", "absent")


def run_sessions(current: Path, against: Path, options: ABOptions,
                 progress: Callable[[str], None] | None = None,
                 spread: Spread | None = None) -> list[dict] | None:
    """`options.sessions` worker runs, current tree first in every other one.

    Each returned session lists every cell's samples and errors current first. With a
    `spread` (under torchrun), the sessions are shared out over the ranks: rank 0 returns
    them all, in session order; the other ranks return None.
    """
    def one(index: int) -> dict:
        flipped = index % 2 == 1  # which tree is imported and sampled first alternates
        trees = (against, current) if flipped else (current, against)
        session = run_session(trees, options)
        if flipped:  # every per-tree list current first: the sources and each cell's
            session = {**{k: v[::-1] for k, v in session.items() if k != "cells"},
                       "cells": [{k: v[::-1] if k in _PER_TREE else v for k, v in c.items()}
                                 for c in session["cells"]]}
        if progress is not None:
            by = f" (rank {spread.launch.rank})" if spread and spread.launch.distributed else ""
            progress(f"A/B session {index + 1}/{options.sessions}{by}")
        return session

    if spread is None:
        try:
            return [one(index) for index in range(options.sessions)]
        except WorkerFailed as err:
            raise UsageError(f"--against: the trees cannot be measured: {err}") from err
    sessions = spread.run(options.sessions, one)
    if sessions is None:
        return None
    failed = [s["error"] for s in sessions if "error" in s]
    if failed:
        raise UsageError(f"--against: the trees cannot be measured: {failed[0]}")
    return sessions


# ----------------------------------------------------------------------------- statistics

def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise error `alpha`:
    sorted p_(i) against alpha / (m - i + 1), stopping at the first that fails.

    Written here, not taken from statsmodels' `multipletests(method="holm")`, which runs
    a full `gc.collect()` on every call (0.2 s in a process that has loaded torch; the
    test holds the two to the same answers)."""
    order = np.argsort(np.asarray(p_values, dtype=np.float64), kind="stable")
    rejected = [False] * len(order)
    for rank, index in enumerate(order):
        if not p_values[index] <= alpha / (len(order) - rank):
            break
        rejected[index] = True
    return rejected


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} us"


def _incomparable(cells: list[dict], label: str) -> tuple[Outcome, str] | None:
    """Why a cell has no ratio (ERROR: the current tree fails it), or None when it has one."""
    for cell in cells:
        absent = cell.get("absent", [False, False])
        if absent[0] or absent[1]:
            return Outcome.NOT_COMPARABLE, f"only on {label}" if absent[0] else f"not on {label}"
        errors = cell.get("errors", [None, None])
        if errors[0]:
            return Outcome.ERROR, errors[0]
        if errors[1]:
            return Outcome.NOT_COMPARABLE, f"fails on {label}: {errors[1]}"
    return None


def _pooled_median(cells: list[dict], side: int) -> float:
    """Median of one side's samples over every session (shown; the verdict uses the
    sessions' estimates)."""
    return float(np.median(np.concatenate([c["samples"][side] for c in cells])))


def compare(sessions: list[dict], options: ABOptions, label: str) -> list[GateRow]:
    """One row per cell, in the order the sessions ran them (module docstring)."""
    by_cell: dict[tuple[str, str, str], list[dict]] = {}
    for session in sessions:
        for cell in session["cells"]:
            by_cell.setdefault((cell["finding"], cell["case"], cell["variant"]), []).append(cell)
    alpha = 1.0 - options.confidence
    edge = math.log1p(options.margin)
    rows: list[GateRow | None] = []
    measured = []  # (row index, base fields, the sessions' rounds, medians)
    for (finding, case, variant), cells in by_cell.items():
        base = dict(check=f"A/B vs {label}", finding=finding, variant=variant, case=case)
        why = _incomparable(cells, label)
        if why is not None:
            rows.append(GateRow(**base, baseline="", current="", change="",
                                outcome=why[0], note=why[1]))
            continue
        medians = (_pooled_median(cells, 1), _pooled_median(cells, 0))
        sessions_rounds = RowProcesses.of([(c["samples"][0], c["samples"][1]) for c in cells])
        measured.append((len(rows), base, sessions_rounds, medians))
        rows.append(None)
    spread = pool_spread([m[2] for m in measured])
    tested = [(index, base, row_estimate(row, spread), medians)
              for index, base, row, medians in measured]
    slower = holm([e.p_above(0.0) for _, _, e, _ in tested], alpha)
    faster = holm([e.p_below(0.0) for _, _, e, _ in tested], alpha)
    for (index, base, estimate, medians), is_slower, is_faster in zip(tested, slower, faster):
        low, high = estimate.interval(0.95)
        ci = RatioCI(ratio=estimate.ratio, low=low, high=high)
        outcome = (Outcome.REGRESSION if is_slower and estimate.log_ratio > edge
                   else Outcome.IMPROVED if is_faster and estimate.log_ratio < -edge
                   else Outcome.PASS)
        rows[index] = GateRow(
            **base, baseline=_us(medians[0]), current=_us(medians[1]),
            change=f"{ci.ratio - 1:+.1%} [{ci.low - 1:+.1%}, {ci.high - 1:+.1%}]",
            outcome=outcome, ci=ci, threshold=1.0 + options.margin,
            note=f"p(slower) = {estimate.p_above(0.0):.2g}, Holm over {len(tested)} cells at "
                 f"{alpha:.0%}; a regression is significantly slower and more than "
                 f"+{options.margin:.0%}",
        )
    return rows


def check_against(rev: str, options: ABOptions, *, repo: Path, current: Path,
                  progress: Callable[[str], None] | None = None,
                  spread: Spread | None = None) -> list[GateRow] | None:
    """Check c: time the tree `current` against a worktree of `rev`, a revision of `repo`
    (each rank its own worktree, with a `spread`; only rank 0 gets the rows)."""
    commit = resolve_revision(repo, rev)
    label = f"{rev} ({commit[:8]})" if not commit.startswith(rev) else commit[:8]
    with worktree(repo, commit) as tree:
        sessions = run_sessions(current, tree, options, progress, spread)
    return None if sessions is None else compare(sessions, options, label)
