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

A measured cell the baseline has no entry for fails (exit 2: the baseline is incomplete),
unless `--allow-new` lets it pass beside cells that were compared: an empty or partial
baseline never passes by accident. `--update-baseline [--findings ID ...]` merges: it
rewrites the entries of the findings it measured and keeps every other entry.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import explain, findings as registry
from harness.exits import read_json
from harness.measure.counters import profile_call
from harness.measure.numbers import is_whole
from harness.project import load_project_config
from harness.gate.table import GateRow, Outcome, UsageError
from harness.results import atomic_write_text
from harness.measure.timing import pinned_threads
from harness.progress import Progress

SCHEMA_VERSION = 1
COUNTERS = ("op_calls", "host_syncs", "allocations", "allocated_bytes", "peak_bytes")
THREADS = 1
UPDATE_COMMAND = "python -m harness.gate --update-baseline"


def gated_findings(modules: Sequence[str]) -> tuple[str, ...]:
    """The findings the gate checks by default: those of the findings modules `modules`
    (imported) whose counts are deterministic (`Finding.gated`)."""
    return tuple(i for i in registry.from_modules(modules) if registry.FINDINGS[i].gated)


def update_command(path: Path, findings: Sequence[str] = (), modules: Sequence[str] = ()) -> str:
    """The command that (re)creates the baseline at `path`, or adds `findings`' cells to it,
    with `--findings-module` for `modules` and the findings' own modules (those of yours
    that pyproject.toml does not name already)."""
    command = UPDATE_COMMAND
    project = load_project_config()
    if project.baseline is None or path.resolve() != project.baseline:
        command += f" --baseline {path}"
    origins = [*modules, *(registry.ORIGINS.get(i, "register()") for i in findings)]
    for module in dict.fromkeys(origins):
        if module != "register()" and not registry.within(module, project.findings_modules):
            command += f" --findings-module {module}"
    if findings:
        command += f" --findings {' '.join(findings)}"
    return command


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
    findings = [registry.planned(f, True)  # cases() failing: an error row
                for f in registry.select(list(finding_ids))]
    with pinned_threads(THREADS), \
            Progress(sum(len(f.cases(True)) for f in findings), "cell") as progress:
        for finding in findings:
            progress.describe(f"counters {finding.id}")
            for case in finding.cases(True):
                cells += _measure_case(finding, case, seed, 2 if repeat_check else 1)
                progress.step(f"counters {finding.id} {case.label}")
    return cells


# ---------------------------------------------------------------------------- baseline file

def _bad_baseline(path: Path, what: str, modules: Sequence[str] = ()) -> UsageError:
    return UsageError(f"{path}: {what}; recreate it with `{update_command(path, modules=modules)}`")


def _entry(entry: object, where: str, path: Path, modules: Sequence[str] = ()) -> CellCounts:
    """One `counters` entry, checked: its key as strings, counts and tolerances as ints >= 0."""
    if not isinstance(entry, dict):
        raise _bad_baseline(path, f"{where}: expected an object; got {type(entry).__name__}",
                            modules)
    missing = [k for k in ("finding", "case", "variant", *COUNTERS) if k not in entry]
    if missing:
        raise _bad_baseline(path, f"{where}: expected fields {', '.join(missing)}; "
                                  f"got {sorted(entry)}", modules)
    key = {k: entry[k] for k in ("finding", "case", "variant")}
    if not all(isinstance(v, str) for v in key.values()):
        raise _bad_baseline(path, f"{where}: expected finding, case and variant as strings; "
                                  f"got {key}", modules)
    values = {k: entry[k] for k in COUNTERS}
    tolerance = entry.get("tolerance", {})
    if not isinstance(tolerance, dict):
        raise _bad_baseline(path, f"{where}.tolerance: expected an object; "
                                  f"got {type(tolerance).__name__}", modules)
    bad = {k: v for k, v in {**values, **tolerance}.items()
           if not is_whole(v) or v < 0}
    unknown = sorted(set(tolerance) - set(COUNTERS))
    if bad or unknown:
        raise _bad_baseline(path, f"{where}: expected counts and tolerances as integers >= 0 "
                                  f"for {', '.join(COUNTERS)}; got {bad or unknown}", modules)
    return CellCounts(**key, counts=values, tolerance=dict(tolerance))


def load_baseline(path: Path, *, same_machine_kind: bool = True,
                  modules: Sequence[str] = ()) -> dict[Key, CellCounts]:
    """Baseline entries by key, in file order; UsageError naming the file, what is wrong
    (missing, unreadable, not UTF-8, truncated, other schema or machine kind, a bad
    entry) and the command that fixes it.

    `same_machine_kind=False` skips the fingerprint check (to carry tolerances over);
    `modules`, your findings modules, are named in the command.
    """
    if not path.exists():
        raise UsageError(f"no counters baseline at {path}; create it with "
                         f"`{update_command(path, modules=modules)}`")
    document = read_json(path, fix=f"recreate it with `{update_command(path, modules=modules)}`")
    if not isinstance(document, dict):
        raise _bad_baseline(path, f"expected a JSON object; got {type(document).__name__}", modules)
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _bad_baseline(path, f"schema_version: expected {SCHEMA_VERSION}; got {version!r}",
                            modules)
    recorded, here = document.get("fingerprint"), fingerprint()
    if same_machine_kind and recorded != here:
        raise _bad_baseline(path, f"fingerprint: expected {here} (this machine); "
                                  f"got {recorded!r}", modules)
    listed = document.get("counters")
    if not isinstance(listed, list):
        raise _bad_baseline(path, f"counters: expected a list of entries; got "
                                  f"{'nothing' if listed is None else type(listed).__name__}",
                            modules)
    entries: dict[Key, CellCounts] = {}
    for index, raw in enumerate(listed):
        cell = _entry(raw, f"counters[{index}]", path, modules)
        if cell.key in entries:
            raise _bad_baseline(path, f"counters[{index}]: expected one entry per finding, "
                                      f"case and variant; got {cell.key} again", modules)
        entries[cell.key] = cell
    return entries


@dataclass(frozen=True)
class BaselineUpdate:
    """What `write_baseline` did to the file."""

    written: int
    """Entries measured now."""
    kept: dict[str, int]
    """Entries of findings not measured now, kept as they were: finding -> count."""
    kept_skipped: int
    """Entries of measured findings whose cell was skipped here, kept as they were."""
    dropped: tuple[Key, ...]
    """Entries of measured findings that no longer have such a cell."""
    replaced: str | None
    """Why the old file was replaced rather than merged into (stale or unreadable), or None."""


def _previous(path: Path, findings: set[str], replace_stale: bool, modules: Sequence[str] = ()
              ) -> tuple[dict[Key, CellCounts], str | None]:
    """The entries to merge with, and why the file is replaced instead (None: merged).

    A file of another schema, another machine kind or that cannot be read has nothing to
    merge with: it is replaced when `replace_stale`, or when it holds entries of the
    measured findings only; otherwise UsageError (the other findings' entries would be
    lost or mixed with counts of another torch version).
    """
    if not path.exists():
        return {}, None
    try:
        return load_baseline(path, modules=modules), None
    except UsageError as err:
        problem = str(err)
    try:  # a readable file of another machine kind: its tolerances carry over
        loose = load_baseline(path, same_machine_kind=False)
    except UsageError:
        loose = None
    others = None if loose is None else sorted({k[0] for k in loose} - findings)
    if not replace_stale and others != []:
        whose = "the entries of the other findings" if others is None else ", ".join(others)
        raise UsageError(f"baseline not updated, it would lose {whose}: {problem}")
    kept = {k: c for k, c in (loose or {}).items() if k[0] in findings}
    return kept, problem


def write_baseline(path: Path, cells: Sequence[CellCounts], *,
                   replace_stale: bool = False) -> BaselineUpdate:
    """Merge the measured cells into the baseline at `path` and write it atomically.

    The entries of the cells' findings are rewritten from the measurement (a cell skipped
    here keeps its old entry; an entry whose cell no longer exists is dropped); every
    entry of any other finding is kept as it was, in place. Tolerances are kept.
    Raises UsageError, leaving the file as it was, when a cell raised or counted
    differently on two calls (such a cell cannot be gated exactly), or when the old file
    cannot be merged into (see `_previous`; `replace_stale` replaces it instead).
    """
    broken = [c for c in cells if c.error]
    if broken:
        listing = "; ".join(f"{c.finding} {c.variant} [{c.case}]: {c.error}" for c in broken)
        raise UsageError(f"baseline not written, {len(broken)} cell(s) failed: {listing}")
    findings = {c.finding for c in cells}
    old, replaced = _previous(path, findings, replace_stale)
    # the file's order of findings, then new ones; each measured finding in measured order
    groups: dict[str, list[CellCounts]] = {key[0]: [] for key in old}
    kept_skipped = 0
    for key, entry in old.items():
        if key[0] not in findings:
            groups[key[0]].append(entry)
    for cell in cells:
        if cell.counts is not None:
            tolerance = old[cell.key].tolerance if cell.key in old else {}
            groups.setdefault(cell.finding, []).append(CellCounts(
                cell.finding, cell.case, cell.variant, counts=cell.counts, tolerance=tolerance))
        elif cell.key in old and replaced is None:  # skipped here: the entry from where it ran
            groups[cell.finding].append(old[cell.key])
            kept_skipped += 1
    entries = []
    for cell in (c for group in groups.values() for c in group):
        entry = {"finding": cell.finding, "case": cell.case, "variant": cell.variant,
                 **cell.counts}
        if cell.tolerance:
            entry["tolerance"] = cell.tolerance
        entries.append(entry)
    document = {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": fingerprint(),
        "recorded_with": {"torch": torch.__version__, "python": platform.python_version()},
        "command": UPDATE_COMMAND,
        "counters": entries,
    }
    atomic_write_text(path, json.dumps(document, indent=1) + "\n")
    measured = {c.key for c in cells}
    return BaselineUpdate(
        written=sum(c.counts is not None for c in cells),
        kept={f: len(group) for f, group in groups.items() if f not in findings and group},
        kept_skipped=kept_skipped,
        dropped=tuple(k for k in old if k[0] in findings and k not in measured),
        replaced=replaced,
    )


# ------------------------------------------------------------------------------- comparison

def _counts_text(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={counts[k]}" for k in COUNTERS)


def _compare_cell(current: CellCounts, baseline: CellCounts, path: Path) -> GateRow:
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
    note = (f"lock it in with `{update_command(path, [current.finding])}`"
            if outcome is Outcome.IMPROVED else "")
    return GateRow(**base, change=", ".join(changes) or "=", outcome=outcome, note=note)


#: outcomes of a measured cell held against its baseline entry
COMPARED = (Outcome.PASS, Outcome.IMPROVED, Outcome.REGRESSION)


def compare(current: Sequence[CellCounts], baseline: dict[Key, CellCounts],
            finding_ids: Sequence[str], *, path: Path, allow_new: bool = False) -> list[GateRow]:
    """One row per measured cell, then one per baseline entry of these findings not measured.

    A measured cell without a baseline entry is NEW (fails); with `allow_new` it is
    NEW_ALLOWED (passes), but only when some other cell was compared: a baseline with no
    entry for any measured cell never passes. `path` names the baseline in the notes'
    commands.
    """
    allowed = allow_new and any(c.counts is not None and c.key in baseline for c in current)
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
            rows.append(GateRow(
                **base, baseline="", current=_counts_text(cell.counts), change="",
                outcome=Outcome.NEW_ALLOWED if allowed else Outcome.NEW,
                note=f"not in the baseline; add it with `{update_command(path, [cell.finding])}`"))
        else:
            rows.append(_compare_cell(cell, baseline[cell.key], path))
    for key, entry in baseline.items():
        if key not in seen and entry.finding in finding_ids:
            rows.append(GateRow(check="counters", finding=entry.finding, variant=entry.variant,
                                case=entry.case, baseline=_counts_text(entry.counts), current="",
                                change="", outcome=Outcome.MISSING,
                                note="not measured here (variant or case not on this machine)"))
    return rows


def explain_changes(rows: Sequence[GateRow], current: Sequence[CellCounts],
                    baseline: dict[Key, CellCounts], *, seed: int = 0) -> list[GateRow]:
    """The rows, each regression or improvement with its changed counters explained in
    its note: the cell is profiled once more with its events split by the project's lines
    (`harness.explain`), e.g. `host syncs 0 -> 4: +4 aten::item at mylib/ops.py:3 in
    scale()`. A cell that cannot be attributed says why instead."""
    measured = {cell.key: cell for cell in current}
    out = []
    for row in rows:
        key = (row.finding, row.case, row.variant)
        if row.outcome not in (Outcome.REGRESSION, Outcome.IMPROVED) or key not in measured:
            out.append(row)
            continue
        before, after = baseline[key].counts, measured[key].counts
        finding = registry.planned(registry.FINDINGS[row.finding], True)
        case = next(c for c in finding.cases(True) if c.label == row.case)
        try:
            sources = explain.cell_sources(finding, case, row.variant, seed=seed)
            text = explain.against_counts(before, after, sources)
        except Exception as err:  # the row keeps its verdict; only the explanation is lost
            text = f"sources not found: {type(err).__name__}: {err}"
        out.append(dataclasses.replace(row, note="; ".join(t for t in (text, row.note) if t)))
    return out


def coverage_error(rows: Sequence[GateRow], path: Path, allow_new: bool = False) -> str | None:
    """Why the counters rows do not cover the code (the gate exits 2), or None when they do.

    The baseline lacks measured cells (NEW rows): the message counts them per finding and
    gives the command that adds exactly those findings' cells. Or nothing at all was
    compared (every cell skipped or missing here).
    """
    rows = [r for r in rows if r.check == "counters"]
    new = [r for r in rows if r.outcome is Outcome.NEW]
    if new:
        per_finding: dict[str, int] = {}
        for row in new:
            per_finding[row.finding] = per_finding.get(row.finding, 0) + 1
        counted = ", ".join(f"{n} of {f}" for f, n in per_finding.items())
        measured = sum(r.outcome is not Outcome.MISSING for r in rows)
        why = ("; --allow-new lets new cells pass only beside compared ones, and none was"
               if allow_new else "")
        return (f"{path}: expected an entry for every measured cell; {len(new)} of {measured} "
                f"have none ({counted}){why}; add them with "
                f"`{update_command(path, list(per_finding))}`")
    if not any(r.outcome in COMPARED for r in rows):
        findings = sorted({r.finding for r in rows}) or ["the findings named"]
        return (f"counters: nothing was compared: no cell of {', '.join(findings)} was both "
                f"measured here and in {path}")
    return None


def update_baseline(baseline_path: Path, finding_ids: Sequence[str], *,
                    replace_stale: bool = False, modules: Sequence[str] = ()) -> BaselineUpdate:
    """Measure every cell of `finding_ids` twice, refuse non-deterministic cells, and merge
    them into the baseline (`write_baseline`; `modules`, the findings modules, are named
    in the commands of its messages)."""
    _previous(baseline_path, set(finding_ids), replace_stale, modules)  # refuse before measuring
    cells = measure(finding_ids, repeat_check=True)
    return write_baseline(baseline_path, cells, replace_stale=replace_stale)
