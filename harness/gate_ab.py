"""Gate check c: paired A/B timing of the current tree against a git revision.

`--against REV` checks REV out into a temporary worktree, then runs short worker
processes (`harness/gate_worker.py`) alternately on the current tree and on REV:
A B A B ... Each process imports `esper` and `harness.findings` from its own tree (its
working directory and `PYTHONPATH`), both from the same interpreter and packages.

Per cell (finding x quick case x variant) each process reports its fastest sample,
and the time ratio current/REV is the ratio of the fastest of those on each side: on a
shared machine noise only ever adds time, whole processes can run 1.5-2x slow while
another job holds the core, and the floor over many alternating processes is what stays
put. Its 95% interval comes from a percentile bootstrap that resamples each side's
processes. A cell is a regression when the whole interval lies above 1 + threshold, an
improvement when it lies below 1 / (1 + threshold). (Ratios of per-pair medians, tried
first, let a few disturbed pairs swing the interval by +-50% on a busy 2-core machine.)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.gate_table import GateRow, Outcome, UsageError
from harness.gate_worker import WorkerConfig
from harness.stats import RatioCI, as_samples

WORKER_SOURCE = Path(__file__).with_name("gate_worker.py")
#: the root of the tree this module was imported from: "the current tree"
CURRENT_TREE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ABOptions:
    """How much to measure and what counts as a regression."""

    findings: tuple[str, ...] = ("B4-CR-03",)
    """Findings whose quick cases are timed."""
    pairs: int = 10
    """Processes per side, run alternately: current, REV, current, REV, ..."""
    threshold: float = 0.10
    """A cell regresses when its interval lies wholly above 1 + threshold."""
    min_samples: int = 5
    """Samples per variant and case in each process, at least."""
    variant_budget_s: float = 0.1
    """Seconds of sampling per variant and case in each process."""
    min_sample_time: float = 1e-3
    """Seconds one sample lasts at least."""
    threads: int = 1
    """torch threads in each worker process."""
    seed: int = 0
    """Input seed, and the bootstrap's."""

    def __post_init__(self) -> None:
        if not isinstance(self.pairs, int) or self.pairs < 3:
            raise UsageError(f"--pairs: expected an integer >= 3; got {self.pairs!r}")
        if not (math.isfinite(self.threshold) and 0.0 <= self.threshold < 10.0):
            raise UsageError(f"--threshold: expected a fraction in [0, 10), e.g. 0.1; "
                             f"got {self.threshold!r}")


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


@contextlib.contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """A detached git worktree of `commit` in a temporary folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="gate-ab-"))
    tree = folder / "tree"
    added = _git(repo, "worktree", "add", "--detach", str(tree), commit)
    if added.returncode != 0:
        shutil.rmtree(folder)
        raise UsageError(f"--against: git worktree add failed: {added.stderr.strip()}")
    try:
        yield tree
    finally:
        _git(repo, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(folder, ignore_errors=True)  # already gone when git removed it
        _git(repo, "worktree", "prune")


# ------------------------------------------------------------------------------- workers

class WorkerFailed(RuntimeError):
    """A worker process exited with an error: the tree cannot be measured at all."""


def run_worker(tree: Path, options: ABOptions) -> dict:
    """One worker process on `tree`: its JSON output (see harness/gate_worker.py)."""
    config = WorkerConfig(
        tree=str(tree), findings=options.findings, min_samples=options.min_samples,
        variant_budget_s=options.variant_budget_s, min_sample_time=options.min_sample_time,
        threads=options.threads, seed=options.seed,
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER_SOURCE.read_text(), json.dumps(asdict(config))],
        cwd=tree, env=env, capture_output=True, text=True,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise WorkerFailed(f"the worker on {tree} exited with {done.returncode}: {tail[0]}")
    return json.loads(done.stdout)


def alternate(current: Path, against: Path, options: ABOptions,
              progress: Callable[[str], None] | None = None) -> tuple[list[dict], list[dict]]:
    """`options.pairs` worker runs per side, alternating current, against, current, ..."""
    runs: tuple[list[dict], list[dict]] = ([], [])
    for index in range(options.pairs):
        for side, tree in enumerate((current, against)):
            try:
                runs[side].append(run_worker(tree, options))
            except WorkerFailed as err:
                if side == 0:
                    raise
                raise UsageError(f"--against: the revision cannot be measured: {err}") from err
        if progress is not None:
            progress(f"A/B pair {index + 1}/{options.pairs}")
    return runs


# ----------------------------------------------------------------------------- statistics

def floor_ratio_ci(current: Sequence[float], against: Sequence[float], *,
                   n_boot: int = 4000, confidence: float = 0.95, seed: int = 0) -> RatioCI:
    """min(current) / min(against), with a percentile-bootstrap interval over processes.

    `current`, `against`: each process's fastest sample (seconds). Each side's
    processes are resampled with replacement, independently, `n_boot` times.
    """
    a = as_samples(current, "current")
    b = as_samples(against, "against")
    rng = np.random.default_rng(seed)
    floors_a = a[rng.integers(0, a.size, size=(n_boot, a.size))].min(axis=1)  # [n_boot]
    floors_b = b[rng.integers(0, b.size, size=(n_boot, b.size))].min(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(floors_a / floors_b, [tail, 1.0 - tail])
    return RatioCI(ratio=float(a.min() / b.min()), low=float(low), high=float(high))


def classify_ab(ci: RatioCI, threshold: float) -> Outcome:
    """REGRESSION above 1 + threshold, IMPROVED below 1 / (1 + threshold), by the whole interval."""
    if ci.low > 1.0 + threshold:
        return Outcome.REGRESSION
    if ci.high < 1.0 / (1.0 + threshold):
        return Outcome.IMPROVED
    if ci.low > 1.0 or ci.high < 1.0:
        return Outcome.WITHIN_THRESHOLD
    return Outcome.PASS


def _by_cell(runs: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    cells: dict[tuple[str, str, str], list[dict]] = {}
    for run in runs:
        for cell in run["cells"]:
            cells.setdefault((cell["finding"], cell["case"], cell["variant"]), []).append(cell)
    return cells


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} us"


def compare(current_runs: list[dict], against_runs: list[dict], options: ABOptions,
            label: str) -> list[GateRow]:
    """One row per cell seen on either side, in the order the current tree ran them."""
    current, against = _by_cell(current_runs), _by_cell(against_runs)
    keys = list(current) + [k for k in against if k not in current]
    rows = []
    for key in keys:
        finding, case, variant = key
        base = dict(check=f"A/B vs {label}", finding=finding, variant=variant, case=case)
        mine, theirs = current.get(key, []), against.get(key, [])
        errors = [c["error"] for c in mine if "error" in c]
        if errors:
            rows.append(GateRow(**base, baseline="", current="", change="",
                                outcome=Outcome.ERROR, note=errors[0]))
            continue
        their_errors = [c["error"] for c in theirs if "error" in c]
        if not theirs or their_errors or not mine:
            why = (f"fails on {label}: {their_errors[0]}" if their_errors
                   else f"only on {label}" if not mine else f"not on {label}")
            rows.append(GateRow(**base, baseline="", current="", change="",
                                outcome=Outcome.NOT_COMPARABLE, note=why))
            continue
        a = [min(c["samples"]) for c in mine]
        b = [min(c["samples"]) for c in theirs]
        ci = floor_ratio_ci(a, b, seed=options.seed)
        rows.append(GateRow(
            **base, baseline=_us(min(b)), current=_us(min(a)),
            change=f"{ci.ratio - 1:+.1%} [{ci.low - 1:+.1%}, {ci.high - 1:+.1%}]",
            outcome=classify_ab(ci, options.threshold), ci=ci,
            threshold=1.0 + options.threshold,
        ))
    return rows


def check_against(rev: str, options: ABOptions, *, repo: Path = CURRENT_TREE,
                  current: Path = CURRENT_TREE,
                  progress: Callable[[str], None] | None = None) -> list[GateRow]:
    """Check c: time the tree `current` against a worktree of `rev`, a revision of `repo`."""
    commit = resolve_revision(repo, rev)
    label = f"{rev} ({commit[:8]})" if not commit.startswith(rev) else commit[:8]
    with worktree(repo, commit) as tree:
        current_runs, against_runs = alternate(current, tree, options, progress)
    return compare(current_runs, against_runs, options, label)
