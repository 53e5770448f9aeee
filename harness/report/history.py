"""History: each finding's headline ratio, and the median times behind it, across runs.

Reads every run folder under a results folder, orders the runs by the commit time of
the commit each measured (`git show`; the run's own date where git does not know the
commit, and between runs of one commit), and takes, per finding, the headline case of
the newest run that has it (`harness.report.headline`): every run that measured that
case gives one point per variant. Runs measured on different machines, or with
different CPU kernel paths (their fingerprints, `harness.measure.machine`), are never
mixed: each is a series of its own.

Where a series changed level is found by a change-point method over the whole series
(`harness.report.changepoints`: PELT with a penalty scaled to the series' own noise),
not by comparing two neighbouring runs: the speed-up over the baseline and the median
time of each variant, per machine. Each change point (`LevelChange`) has its commit range
(the last run of the old level, the first of the new), its size with a 95% interval, and
the `python -m harness.bisect` command that would pin it to one commit (on the counter
that changed between those runs, where one did; else on time).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from harness.measure.machine import FINGERPRINT_FIELDS, KERNEL_FIELDS, fingerprint
from harness.report.changepoints import ChangePoint, change_points
from harness.report.data import ReportError, finding_headline, open_run
from harness.report.verdicts import present
from harness.results import Run

COLUMNS = ["finding", "machine", "run_id", "order", "commit", "dirty", "when", "case", "where",
           "variant", "baseline", "median_s", "ratio", "ci_low", "ci_high", "verdict",
           "ratio_step", "time_step"]
"""`ratio_step` / `time_step`: the point is the first run of a new level of the speed-up /
the median time (a change point starts there)."""
#: per-call counters compared between the two runs around a change point, in the order a
#: bisect on them is suggested
COUNTERS = ("host_syncs", "allocations", "allocated_bytes", "peak_bytes", "op_calls")


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
    changes: list["LevelChange"] = field(default_factory=list)
    """Every change point of every series, by finding, machine and variant."""


@dataclass(frozen=True)
class LevelChange:
    """A change point in one series: a variant's speed-up or median time on one machine."""

    finding: str
    machine: int
    variant: str
    measure: str
    """`speed-up` (over the baseline: higher is faster) or `median time`."""
    point: ChangePoint
    """Its size: new level / old level of the measure, with a 95% interval."""
    before: dict
    """The last run of the old level: run_id, commit, dirty."""
    after: dict
    """The first run of the new level."""
    command: str | None
    """The bisect command that would pin it to one commit, or None (`why_no_command`)."""
    why_no_command: str = ""

    def commits(self) -> str:
        """'1a2b3c4d..5e6f7a8b' (a '*' marks a run with uncommitted changes)."""
        return "..".join((r["commit"][:8] or "?") + ("*" if r["dirty"] else "")
                         for r in (self.before, self.after))


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


def run_commit(run: Run) -> tuple[str, bool]:
    """(commit, dirty) of the code a run measured: the repository of its findings modules."""
    return run.metadata.get("git_commit") or "", bool(run.metadata.get("git_dirty"))


def order_runs(runs: list[Run], repo: Path | None = None) -> list[Run]:
    """Runs by the commit time of their commit, then by their own date."""
    times = commit_times({run_commit(r)[0] for r in runs}, repo)

    def key(run: Run) -> tuple[datetime, datetime]:
        created = _created(run)
        return times.get(run_commit(run)[0], created), created

    return sorted(runs, key=key)


def bisect_command(finding: str, before: dict, after: dict, modules: list[str]
                   ) -> tuple[str | None, str]:
    """The `python -m harness.bisect` command for a change between two runs' points, or
    None and why there is none (no commits to bisect between)."""
    if not before["commit"] or not after["commit"]:
        return None, "a run without a recorded commit"
    if before["dirty"] or after["dirty"]:
        return None, "a run of uncommitted changes: its code is in no commit"
    if before["commit"] == after["commit"]:
        return None, "both runs measured one commit: the change is not in the code"
    differ = [c for c in COUNTERS if present(before["_counters"].get(c))
              and present(after["_counters"].get(c))
              and before["_counters"][c] != after["_counters"][c]]
    how = f"--counter {differ[0]}" if differ else "--time"
    extra = "".join(f" --findings-module {m}" for m in modules)
    return (f"python -m harness.bisect --good {before['commit'][:12]} --bad "
            f"{after['commit'][:12]} --findings {finding} {how}{extra}"), ""


def _series_changes(table: pd.DataFrame, modules: dict[str, list[str]]
                    ) -> tuple[pd.Series, pd.Series, list[LevelChange]]:
    """Change points of every series in `table`: the ratio_step and time_step columns and
    one LevelChange each."""
    ratio_step = pd.Series(False, index=table.index)
    time_step = pd.Series(False, index=table.index)
    changes = []
    for (finding, machine, variant), rows in table.groupby(
            ["finding", "machine", "variant"], sort=False):
        rows = rows.sort_values("order")
        timed = rows[rows["median_s"].notna() & (rows["median_s"] > 0)]
        compared = rows[rows["ratio"].notna() & (rows["ratio"] > 0)
                        & ~rows["baseline"].astype(bool)]
        for measure, points, values, marks in (
                ("speed-up", compared, 1.0 / compared["ratio"].to_numpy(float), ratio_step),
                ("median time", timed, timed["median_s"].to_numpy(float), time_step)):
            records = points.to_dict("records")
            for point in change_points(values):
                before, after = records[point.index - 1], records[point.index]
                marks[points.index[point.index]] = True
                command, why = bisect_command(finding, before, after,
                                              modules.get(after["run_id"], []))
                changes.append(LevelChange(
                    finding, int(machine), variant, measure, point,
                    *({k: r[k] for k in ("run_id", "commit", "dirty")} for r in (before, after)),
                    command, why))
    return ratio_step, time_step, changes


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
        for finding, head in headlines.items():
            at = run.summary[(run.summary["finding"] == finding)
                             & (run.summary["case"] == head.case)]
            for row in at.to_dict("records"):
                points.append({
                    "finding": finding, "machine": machine, "run_id": run.run_id,
                    "order": order, "commit": run_commit(run)[0], "dirty": run_commit(run)[1],
                    "when": run.metadata.get("created") or "", "case": head.case,
                    "where": head.where, "variant": row["variant"],
                    "baseline": row["variant"] == head.baseline,
                    "median_s": row.get("median_s") if present(row.get("median_s")) else None,
                    **{k: (row.get(k) if present(row.get(k)) and row.get("compared_to")
                           in (None, head.baseline) else None)
                       for k in ("ratio", "ci_low", "ci_high")},
                    "verdict": row.get("verdict") or row.get("status"),
                    "_counters": {c: row.get(c) for c in COUNTERS},
                })
    table = pd.DataFrame(points, columns=[*COLUMNS[:-2], "_counters"])
    modules = {run.run_id: list((run.metadata.get("options") or {}).get("findings_module") or [])
               for run in runs}
    table["ratio_step"], table["time_step"], changes = _series_changes(table, modules)
    return History(points=table.drop(columns="_counters"), runs=runs,
                   machines=list(machines.values()), skipped=skipped,
                   headline_variants={f: h.variant for f, h in headlines.items() if h.variant},
                   changes=changes)


#: the fingerprint fields, for the page's explanation of what separates machines (and
#: kernel paths: a run made before runs recorded theirs is a series of its own)
MACHINE_FIELDS = ", ".join((*FINGERPRINT_FIELDS, *KERNEL_FIELDS))
