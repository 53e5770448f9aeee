"""History: each finding's headline ratio, and the median times behind it, across runs.

Reads every run folder under a results folder, orders the runs by the commit time of
the commit each measured (`git show`; the run's own date where git does not know the
commit, and between runs of one commit), and takes, per finding, the headline case of
the newest run that has it (`harness.report.headline`): every run that measured that
case gives one point per variant. Runs measured on different machines (their
fingerprints, `harness.measure.machine`) are never mixed: each machine is a series of
its own.

A step change is a point that differs from the previous point of its series by more
than the run's own noise:

- the headline ratio (variant / baseline time): the two runs' 95% intervals do not
  overlap and the ratio moved by more than STEP_FACTOR;
- a median time: the test of `--compare` between the two runs' samples (the bootstrap
  95% interval of new / old excludes 1 and the ratio passes STEP_FACTOR).
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from harness.measure.machine import FINGERPRINT_FIELDS, fingerprint
from harness.measure.stats import Verdict, bootstrap_ratio_ci, classify
from harness.report.compare import DEFAULT_FACTOR, samples_by_key
from harness.report.data import ReportError, finding_headline, open_run
from harness.report.verdicts import present
from harness.results import Run

#: the smallest change of a ratio or a median time that counts as a step
STEP_FACTOR = DEFAULT_FACTOR
COLUMNS = ["finding", "machine", "run_id", "order", "commit", "dirty", "when", "case", "where",
           "variant", "baseline", "median_s", "ratio", "ci_low", "ci_high", "verdict",
           "ratio_step", "time_step"]


@dataclass(frozen=True)
class Machine:
    """One machine fingerprint seen in the runs: a number in order of appearance."""

    number: int
    fields: tuple[tuple[str, object], ...]

    @property
    def label(self) -> str:
        """'machine 1: cpu (AMD EPYC 7B13), 2 threads, torch 2.5.1, Python 3.11.2'."""
        f = dict(self.fields)
        device = f.get("device_name") or "unknown device"
        parts = [device if f.get("cpu_model") in (None, "") or f["cpu_model"] in device
                 else f"{device}, CPU {f['cpu_model']}",
                 f"{f['threads']} threads" if f.get("threads") else None,
                 f"torch {f['torch']}" if f.get("torch") else None,
                 f"CUDA {f['cuda']}" if f.get("cuda") else None,
                 f"Python {f['python']}" if f.get("python") else None]
        return f"machine {self.number}: " + ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class History:
    """What the history page shows."""

    points: pd.DataFrame
    """One row per finding x run x variant at the finding's headline case (COLUMNS)."""
    runs: list[Run]
    """The runs read, in commit-time order."""
    machines: list[Machine]
    skipped: list[str]
    """Run folders left out, each with why ('folder: reason')."""
    headline_variants: dict[str, str]
    """finding -> the variant its summary row headlines."""


def find_runs(results_dir: Path) -> tuple[list[Run], list[str]]:
    """Every readable run under `results_dir`, and 'folder: why' for each unreadable one."""
    runs, skipped = [], []
    for folder in sorted(p for p in Path(results_dir).iterdir() if (p / "run.json").is_file()):
        try:
            runs.append(open_run(folder, results_dir))
        except ReportError as err:  # unreadable, corrupt or of another schema: named on the page
            skipped.append(f"{folder.name}: {err}")
    return runs, skipped


def commit_times(commits: set[str], repo: Path | None = None) -> dict[str, datetime]:
    """Committer time of each commit that git knows in `repo` (default: the current
    folder); commits it does not know are left out."""
    times = {}
    for commit in sorted(c for c in commits if c):
        try:
            done = subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=repo,
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return times  # no git here: every run falls back to its own date
        if done.returncode == 0 and done.stdout.strip():
            times[commit] = datetime.fromisoformat(done.stdout.strip())
    return times


def _created(run: Run) -> datetime:
    try:
        stamp = datetime.fromisoformat(run.metadata.get("created") or "")
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def order_runs(runs: list[Run], repo: Path | None = None) -> list[Run]:
    """Runs by the commit time of their commit, then by their own date."""
    times = commit_times({r.metadata.get("git_commit") for r in runs}, repo)

    def key(run: Run) -> tuple[datetime, datetime]:
        created = _created(run)
        return times.get(run.metadata.get("git_commit"), created), created

    return sorted(runs, key=key)


def _ratio_step(previous: dict, current: dict) -> bool:
    """Disjoint 95% intervals and a ratio that moved by more than STEP_FACTOR."""
    keys = ("ratio", "ci_low", "ci_high")
    if not all(present(p.get(k)) for p in (previous, current) for k in keys):
        return False
    disjoint = current["ci_low"] > previous["ci_high"] or current["ci_high"] < previous["ci_low"]
    return disjoint and abs(math.log(current["ratio"] / previous["ratio"])) > math.log(STEP_FACTOR)


def _time_step(previous: list[float] | None, current: list[float] | None) -> bool:
    """The --compare test of two runs' samples of one cell."""
    if not previous or not current:
        return False
    verdict = classify(bootstrap_ratio_ci(current, previous), min_factor=STEP_FACTOR)
    return verdict in (Verdict.FASTER, Verdict.SLOWER)


def build_history(results_dir: Path, repo: Path | None = None) -> History:
    """Read and order the runs of `results_dir`; one point per finding x run x variant."""
    runs, skipped = find_runs(results_dir)
    runs = order_runs(runs, repo)
    machines: dict[tuple, Machine] = {}
    for run in runs:
        key = tuple(fingerprint(run.metadata).items())
        machines.setdefault(key, Machine(len(machines) + 1, key))
    # the headline case of each finding: the newest run's that has the finding
    headlines = {}
    for run in reversed(runs):
        if run.summary.empty:
            continue
        for finding in dict.fromkeys(run.summary["finding"]):
            if finding not in headlines:
                rows = run.summary[run.summary["finding"] == finding]
                headlines[finding] = finding_headline(finding, rows, run.metadata)
    points = []
    for order, run in enumerate(runs):
        if run.summary.empty:
            continue
        machine = machines[tuple(fingerprint(run.metadata).items())].number
        samples = samples_by_key(run.rows)
        for finding, head in headlines.items():
            at = run.summary[(run.summary["finding"] == finding)
                             & (run.summary["case"] == head.case)]
            for row in at.to_dict("records"):
                points.append({
                    "finding": finding, "machine": machine, "run_id": run.run_id,
                    "order": order, "commit": run.metadata.get("git_commit") or "",
                    "dirty": bool(run.metadata.get("git_dirty")),
                    "when": run.metadata.get("created") or "", "case": head.case,
                    "where": head.where, "variant": row["variant"],
                    "baseline": row["variant"] == head.baseline,
                    "median_s": row.get("median_s") if present(row.get("median_s")) else None,
                    **{k: (row.get(k) if present(row.get(k)) and row.get("compared_to")
                           in (None, head.baseline) else None)
                       for k in ("ratio", "ci_low", "ci_high")},
                    "verdict": row.get("verdict") or row.get("status"),
                    "_samples": samples.get((finding, head.case, row["variant"])),
                })
    table = pd.DataFrame(points, columns=[*COLUMNS[:-2], "_samples"])
    ratio_steps, time_steps = [], []
    previous: dict[tuple, dict] = {}
    for row in table.to_dict("records"):
        series = (row["finding"], row["machine"], row["variant"])
        before = previous.get(series)
        ratio_steps.append(before is not None and _ratio_step(before, row))
        time_steps.append(before is not None and _time_step(before["_samples"], row["_samples"]))
        previous[series] = row
    table["ratio_step"] = ratio_steps
    table["time_step"] = time_steps
    return History(points=table.drop(columns="_samples"), runs=runs,
                   machines=list(machines.values()), skipped=skipped,
                   headline_variants={f: h.variant for f, h in headlines.items() if h.variant})


#: the fingerprint fields, for the page's explanation of what separates machines
MACHINE_FIELDS = ", ".join(FINGERPRINT_FIELDS)
