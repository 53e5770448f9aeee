"""Gate check a: deterministic counters against a committed baseline.

Op calls, host syncs, allocations and allocated bytes of one call of every finding x
variant x quick case (not the peers: other libraries' code is not gated), counted by
`harness.measure.counters.profile_call` on the CPU with one torch thread. They do not depend on
the machine's speed or load, so they are compared exactly: any count above its baseline
value (plus the entry's stated tolerance, 0 unless the file says otherwise) is a
regression; a count below it is an improvement that `--update-baseline` locks in.

Baseline file (JSON, written atomically)::

    {"schema_version": 1,
     "fingerprint": {"torch": "2.13", "device": "cpu", "threads": 1},
     "recorded_with": {"torch": "2.13.0+cpu", "python": "3.11.7"},
     "counters": [{"finding": ..., "case": ..., "variant": ...,
                   "op_calls": 228, "host_syncs": 0, "allocations": 49,
                   "allocated_bytes": 13480, "tolerance": {"allocations": 2}}, ...]}

`tolerance` is optional per entry (absolute counts per counter) and is kept when the
baseline is rewritten. Counts recorded under another torch minor version are not
compared (op decompositions change between releases).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import findings as registry
from harness.measure.counters import profile_call
from harness.gate.table import GateRow, Outcome, UsageError
from harness.results import atomic_write_text
from harness.measure.timing import pinned_threads

SCHEMA_VERSION = 1
DEFAULT_BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "counters.json"
#: the findings whose quick cases run on a CPU and count the same on every run. E2E-iteration
#: is left out: its work depends on the trainer's state (86,499 then 89,310 op calls in
#: iterations 2 and 3 of its quick case; the PPO update's KL early stop decides on float
#: values, which can round differently on another CPU), and its allocated bytes changed
#: with the torch thread count.
GATED_FINDINGS = ("B4-CR-03", "B4-DRL-03", "B4-PT-05")
COUNTERS = ("op_calls", "host_syncs", "allocations", "allocated_bytes")
THREADS = 1
UPDATE_COMMAND = "python -m harness.gate --update-baseline"


def update_command(path: Path) -> str:
    """The command that (re)creates the baseline at `path`."""
    if path.resolve() == DEFAULT_BASELINE:
        return UPDATE_COMMAND
    return f"{UPDATE_COMMAND} --baseline {path}"


Key = tuple[str, str, str]
"""(finding, case label, variant)."""


@dataclass(frozen=True)
class CellCounts:
    """The counters of one finding x case x variant, or why there are none."""

    finding: str
    case: str
    variant: str
    counts: dict[str, int] | None = None
    """COUNTERS -> value; None when skipped or failed."""
    skipped: str | None = None
    error: str | None = None
    tolerance: dict[str, int] = field(default_factory=dict)
    """Absolute slack per counter (baseline entries only)."""

    @property
    def key(self) -> Key:
        return self.finding, self.case, self.variant


def fingerprint() -> dict:
    """What must match for counts to be comparable: torch minor version, device, threads."""
    major, minor = torch.__version__.split(".")[:2]
    return {"torch": f"{major}.{minor}", "device": "cpu", "threads": THREADS}


def _profile(call, times: int) -> list[dict[str, int]]:
    """Counters of `times` profiled calls after one warm-up call (lazy init, compilation)."""
    call()
    return [{k: v for k, v in profile_call(call, "cpu").as_row().items() if k in COUNTERS}
            for _ in range(times)]


def own_variants(finding) -> list[str]:
    """The finding's variants without its peers: other libraries' code is not gated."""
    return [v for v in finding.variants if v not in finding.peers]


def _measure_case(finding, case, seed: int, times: int) -> list[CellCounts]:
    """The cells of one quick case: counts, or why a variant has none."""
    device = torch.device("cpu")
    base = dict(finding=finding.id, case=case.label)
    try:
        inputs = finding.build(case, device, seed)
    except Exception as err:  # every variant of the case is an error row
        return [CellCounts(**base, variant=v, error=f"building inputs: {err!r}")
                for v in own_variants(finding)]
    cells = []
    for variant in own_variants(finding):
        reason = finding.skip(variant, case, device)
        if reason:
            cells.append(CellCounts(**base, variant=variant, skipped=reason))
            continue
        try:
            runs = _profile(finding.make_call(variant, inputs), times)
        except Exception as err:  # a crashing variant is a row; the others go on
            cells.append(CellCounts(**base, variant=variant, error=repr(err)))
            continue
        if any(run != runs[0] for run in runs):
            cells.append(CellCounts(**base, variant=variant, error=(
                f"counts differ between two calls: {runs[0]} vs {runs[1]}")))
            continue
        cells.append(CellCounts(**base, variant=variant, counts=runs[0]))
    return cells


def measure(finding_ids: Sequence[str], *, seed: int = 0, repeat_check: bool = False) -> list[CellCounts]:
    """Counters of every quick case x variant of the findings, on the CPU with one thread.

    With `repeat_check`, each cell is profiled twice and a cell whose counts differ
    between the two becomes an error naming both (the baseline must be deterministic).
    """
    cells: list[CellCounts] = []
    with pinned_threads(THREADS):
        for finding in registry.select(list(finding_ids)):
            for case in finding.cases(True):
                cells += _measure_case(finding, case, seed, 2 if repeat_check else 1)
    return cells


# ---------------------------------------------------------------------------- baseline file

def _bad_baseline(path: Path, what: str) -> UsageError:
    return UsageError(f"{path}: {what}; recreate it with `{update_command(path)}`")


def load_baseline(path: Path, *, same_machine_kind: bool = True) -> dict[Key, CellCounts]:
    """Baseline entries by key; UsageError (missing, unreadable, other version) naming the fix.

    `same_machine_kind=False` skips the fingerprint check (to carry tolerances over).
    """
    if not path.exists():
        raise UsageError(f"no counters baseline at {path}; create it with `{update_command(path)}`")
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise _bad_baseline(path, f"not valid JSON ({err})") from err
    if not isinstance(document, dict):
        raise _bad_baseline(path, f"expected a JSON object; got {type(document).__name__}")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _bad_baseline(path, f"schema_version: expected {SCHEMA_VERSION}; got {version!r}")
    recorded, here = document.get("fingerprint"), fingerprint()
    if same_machine_kind and recorded != here:
        raise _bad_baseline(path, f"fingerprint: expected {here} (this machine); got {recorded!r}")
    entries: dict[Key, CellCounts] = {}
    for index, entry in enumerate(document.get("counters", [])):
        where = f"counters[{index}]"
        missing = [k for k in ("finding", "case", "variant", *COUNTERS) if k not in entry]
        if missing:
            raise _bad_baseline(path, f"{where}: expected fields {', '.join(missing)}; got {sorted(entry)}")
        values = {k: entry[k] for k in COUNTERS}
        tolerance = entry.get("tolerance", {})
        bad = {k: v for k, v in {**values, **tolerance}.items()
               if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        unknown = sorted(set(tolerance) - set(COUNTERS))
        if bad or unknown:
            raise _bad_baseline(path, f"{where}: expected counts and tolerances as integers >= 0 "
                                      f"for {', '.join(COUNTERS)}; got {bad or unknown}")
        cell = CellCounts(entry["finding"], entry["case"], entry["variant"], counts=values,
                          tolerance=dict(tolerance))
        entries[cell.key] = cell
    return entries


def write_baseline(path: Path, cells: Sequence[CellCounts]) -> None:
    """Write the measured counts; keeps the `tolerance` of entries already in the file.

    Raises UsageError when a cell raised or counted differently on two calls: such a
    cell cannot be gated exactly, and the file is left as it was.
    """
    broken = [c for c in cells if c.error]
    if broken:
        listing = "; ".join(f"{c.finding} {c.variant} [{c.case}]: {c.error}" for c in broken)
        raise UsageError(f"baseline not written, {len(broken)} cell(s) failed: {listing}")
    kept: dict[Key, dict[str, int]] = {}
    if path.exists():
        try:
            old = load_baseline(path, same_machine_kind=False)
        except UsageError:
            old = {}  # an unreadable or other-schema file is replaced; it has nothing to keep
        kept = {k: c.tolerance for k, c in old.items() if c.tolerance}
    entries = []
    for cell in cells:
        if cell.counts is None:
            continue  # skipped here: nothing to record
        entry = {"finding": cell.finding, "case": cell.case, "variant": cell.variant,
                 **cell.counts}
        if cell.key in kept:
            entry["tolerance"] = kept[cell.key]
        entries.append(entry)
    document = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": fingerprint(),
        "recorded_with": {"torch": torch.__version__, "python": platform.python_version()},
        "command": UPDATE_COMMAND,
        "counters": entries,
    }
    atomic_write_text(path, json.dumps(document, indent=1) + "\n")


# ------------------------------------------------------------------------------- comparison

def _counts_text(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={counts[k]}" for k in COUNTERS)


def _compare_cell(current: CellCounts, baseline: CellCounts) -> GateRow:
    same = current.counts == baseline.counts
    base = dict(check="counters", finding=current.finding, variant=current.variant,
                case=current.case, baseline=_counts_text(baseline.counts),
                current="same" if same else _counts_text(current.counts))
    changes, worse, better = [], False, False
    for name in COUNTERS:
        diff = current.counts[name] - baseline.counts[name]
        slack = baseline.tolerance.get(name, 0)
        if diff:
            changes.append(f"{name} {diff:+d}" + (f" (tolerance {slack})" if slack else ""))
        worse |= diff > slack
        better |= diff < -slack
    if worse:
        outcome = Outcome.REGRESSION
    elif better:
        outcome = Outcome.IMPROVED
    else:
        outcome = Outcome.PASS
    note = f"lock it in with `{UPDATE_COMMAND}`" if outcome is Outcome.IMPROVED else ""
    return GateRow(**base, change=", ".join(changes) or "=", outcome=outcome, note=note)


def compare(current: Sequence[CellCounts], baseline: dict[Key, CellCounts],
            finding_ids: Sequence[str]) -> list[GateRow]:
    """One row per measured cell, then one per baseline entry of these findings not measured."""
    rows = []
    seen = set()
    for cell in current:
        seen.add(cell.key)
        base = dict(check="counters", finding=cell.finding, variant=cell.variant, case=cell.case)
        if cell.error:
            rows.append(GateRow(**base, baseline="", current="", change="",
                                outcome=Outcome.ERROR, note=cell.error))
        elif cell.skipped:
            rows.append(GateRow(**base, baseline="", current="", change="",
                                outcome=Outcome.SKIPPED, note=cell.skipped))
        elif cell.key not in baseline:
            rows.append(GateRow(**base, baseline="", current=_counts_text(cell.counts),
                                change="", outcome=Outcome.NEW,
                                note=f"not in the baseline; add it with `{UPDATE_COMMAND}`"))
        else:
            rows.append(_compare_cell(cell, baseline[cell.key]))
    for key, entry in baseline.items():
        if key not in seen and entry.finding in finding_ids:
            rows.append(GateRow(check="counters", finding=entry.finding, variant=entry.variant,
                                case=entry.case, baseline=_counts_text(entry.counts), current="",
                                change="", outcome=Outcome.MISSING,
                                note="not measured here (variant or case not on this machine)"))
    return rows


def check_counters(baseline_path: Path, finding_ids: Sequence[str] = GATED_FINDINGS) -> list[GateRow]:
    """Check a: measure now and compare with the baseline file."""
    baseline = load_baseline(baseline_path)  # first, so a missing file fails fast
    return compare(measure(finding_ids), baseline, finding_ids)


def update_baseline(baseline_path: Path, finding_ids: Sequence[str] = GATED_FINDINGS) -> list[CellCounts]:
    """Measure every cell twice, refuse non-deterministic cells, and rewrite the baseline."""
    cells = measure(finding_ids, repeat_check=True)
    write_baseline(baseline_path, cells)
    return cells
