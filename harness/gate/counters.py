"""Gate check a: counters against a committed baseline, exact on every machine where they can be.

Op calls, host syncs, allocations, allocated bytes and peak bytes of one call of every
finding x variant x quick case (not the peers: other libraries' code is not gated), counted
by `harness.measure.counters.profile_call` on the CPU with one torch thread. They do not
depend on the machine's speed or load. Two kinds:

- `EXACT` (op calls, host syncs) do not depend on the machine at all, at one torch version:
  compared exactly on every machine.
- `KERNEL_DEPENDENT` (allocations, allocated bytes, peak bytes) change with the CPU kernel
  path: oneDNN's ISA (its AVX-512 and AVX2 matrix products allocate differently), ATen's
  CPU capability, the BLAS path. The baseline keeps them per kernel path
  (`harness.measure.machine.kernel_path`, taken at the gate's one thread) and compares
  them exactly where it holds this machine's. Where it does not, they are not compared:
  the row and one note after the table say which counters, which field of the kernel path
  differs from the nearest one recorded, and the command that records this machine's
  (`--update-baseline`, which keeps the other kernel paths' counts). A machine the
  baseline has not seen never reads as a regression; its exact counters still are compared.

Any compared count above its baseline value (plus the entry's stated tolerance, 0 unless
the file says otherwise) is a regression; below it, an improvement that `--update-baseline`
locks in. Each entry also keeps its counters split by the line of the project's code that
made them (`harness.measure.sources`), so that a changed count reads as per-line deltas,
`op calls 583 -> 584: +1 aten::clone at mylib/ops.py:42 in scale()`, as `report --compare
--sources` prints them.

Baseline file (JSON, written atomically)::

    {"schema_version": 2,
     "fingerprint": {"torch": "2.13", "device": "cpu", "threads": 1},
     "recorded_with": {"torch": "2.13.0+cpu", "python": "3.11.7"},
     "kernel_paths": {"5e0c9a51d2f4": {"cpu_model": "AMD EPYC", "cpu_flags": "avx2 ...",
                                       "aten_cpu_capability": "AVX512", ...}},
     "counters": [{"finding": ..., "case": ..., "variant": ...,
                   "op_calls": 228, "host_syncs": 0,
                   "sources": [["op_calls", "aten::add", "mylib/ops.py", 12, "scale", 4], ...],
                   "by_kernel_path": {"5e0c9a51d2f4": {"allocations": 49,
                       "allocated_bytes": 13480, "peak_bytes": 2836, "sources": [...]}},
                   "tolerance": {"allocations": 2}}, ...]}

`fingerprint` must match for any count to be compared (another torch minor version is an
input error: op decompositions change between releases). `tolerance` is optional per entry
(absolute counts per counter) and is kept when the baseline is rewritten. `sources` is
optional (a string says why a cell has none). Files of schema 1 (every counter in the
entry, no kernel path) still load: their exact counters are compared, their other counters
are not (the gate says why), and a full `--update-baseline` rewrites them as schema 2.

A measured cell the baseline has no entry for fails (exit 2: the baseline is incomplete),
unless `--allow-new` lets it pass beside cells that were compared: an empty or partial
baseline never passes by accident. `--update-baseline [--findings ID ...]` merges: it
rewrites the entries of the findings it measured for this kernel path and keeps every
other entry and every other kernel path's counts, except where this machine's counts of a
cell changed (the code changed: the other kernel paths' counts of it are dropped, and the
update says so).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import explain, findings as registry
from harness.exits import read_json
from harness.measure.counters import profile_call
from harness.measure.machine import fingerprint_changes, kernel_path
from harness.measure.numbers import is_whole
from harness.measure.sources import Sources, attribute_call
from harness.project import load_project_config
from harness.gate.table import GateRow, Outcome, UsageError
from harness.results import atomic_write_text
from harness.measure.timing import pinned_threads
from harness.progress import Progress

SCHEMA_VERSION = 2
#: the schemas `load_baseline` reads: 1 kept every counter without the kernel path
READABLE_VERSIONS = (1, 2)
#: counters that no machine changes at one torch version: compared on every machine
EXACT = ("op_calls", "host_syncs")
#: counters the CPU kernel path changes: compared where the baseline holds this machine's
KERNEL_DEPENDENT = ("allocations", "allocated_bytes", "peak_bytes")
COUNTERS = (*EXACT, *KERNEL_DEPENDENT)
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
    """The counters of one measured finding x case x variant, or why there are none."""

    finding: str
    case: str
    variant: str
    counts: dict[str, int] | None = None
    """COUNTERS -> value; None when skipped or failed."""
    skipped: str | None = None
    error: str | None = None
    sources: Sources | str | None = None
    """The counters split by line (`measure(..., attribute=True)`), or why they could not
    be; None where not attributed."""

    @property
    def key(self) -> Key:
        return self.finding, self.case, self.variant


def counting_fingerprint() -> dict:
    """What must match for any count to be comparable: torch minor version, device, threads."""
    major, minor = torch.__version__.split(".")[:2]
    return {"torch": f"{major}.{minor}", "device": "cpu", "threads": THREADS}


def gate_kernel_path() -> dict:
    """This process's CPU kernel path (`harness.measure.machine.kernel_path`) at the gate's
    thread count: what the KERNEL_DEPENDENT counters are recorded under."""
    with pinned_threads(THREADS):
        return kernel_path()


def kernel_path_id(path: Mapping) -> str:
    """A short stable name of a kernel path (the first 12 hex digits of the SHA-256 of its
    fields as sorted JSON): its key in a baseline."""
    text = json.dumps(dict(path), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _profile(call, times: int) -> list[dict[str, int]]:
    """Counters of `times` profiled calls after one warm-up call (lazy init, compilation)."""
    call()
    return [{k: v for k, v in profile_call(call, "cpu").as_row().items() if k in COUNTERS}
            for _ in range(times)]


def own_variants(finding) -> list[str]:
    """The finding's variants without its peers: other libraries' code is not gated."""
    return [v for v in finding.variants if v not in finding.peers]


def _attribute(finding, call, counts: dict[str, int]) -> Sources | str:
    """`call`'s counters split by line, or why not (their totals must be the counts)."""
    try:
        sources = attribute_call(call, explain.project_files(finding), "cpu")
    except Exception as err:  # the counts stand; only the lines behind them are missing
        return f"{type(err).__name__}: {err}"
    totals = sources.totals()
    differ = {k: (totals[k], counts[k]) for k in totals if k in counts and totals[k] != counts[k]}
    if differ:
        return f"the attribution counted other totals than the profile: {differ}"
    return sources


def _measure_case(finding, case, seed: int, times: int, attribute: bool) -> list[CellCounts]:
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
            call = finding.make_call(variant, inputs)
            runs = _profile(call, times)
        except Exception as err:  # a crashing variant is a row; the others go on
            cells.append(CellCounts(**base, variant=variant, error=repr(err)))
            continue
        if any(run != runs[0] for run in runs):
            cells.append(CellCounts(**base, variant=variant, error=(
                f"counts differ between two calls: {runs[0]} vs {runs[1]}")))
            continue
        sources = _attribute(finding, call, runs[0]) if attribute else None
        cells.append(CellCounts(**base, variant=variant, counts=runs[0], sources=sources))
    return cells


def measure(finding_ids: Sequence[str], *, seed: int = 0, repeat_check: bool = False,
            attribute: bool = False) -> list[CellCounts]:
    """Counters of every quick case x variant of the findings, on the CPU with one thread.

    With `repeat_check`, each cell is profiled twice and a cell whose counts differ
    between the two becomes an error naming both (the baseline must be deterministic).
    With `attribute`, each counted cell is also split by line (`CellCounts.sources`).
    """
    cells: list[CellCounts] = []
    findings = [registry.planned(f, True)  # cases() failing: an error row
                for f in registry.select(list(finding_ids))]
    with pinned_threads(THREADS), \
            Progress(sum(len(f.cases(True)) for f in findings), "cell") as progress:
        for finding in findings:
            progress.describe(f"counters {finding.id}")
            for case in finding.cases(True):
                cells += _measure_case(finding, case, seed, 2 if repeat_check else 1, attribute)
                progress.step(f"counters {finding.id} {case.label}")
    return cells


# ---------------------------------------------------------------------------- baseline file

@dataclass(frozen=True)
class KernelCounts:
    """An entry's KERNEL_DEPENDENT counts on one kernel path, with their lines."""

    counts: dict[str, int]
    sources: Sources | str | None = None


@dataclass(frozen=True)
class BaselineEntry:
    """One finding x case x variant of the baseline."""

    finding: str
    case: str
    variant: str
    exact: dict[str, int]
    """EXACT -> value."""
    by_kernel_path: dict[str, KernelCounts] = field(default_factory=dict)
    """Kernel path id -> the KERNEL_DEPENDENT counts recorded there."""
    tolerance: dict[str, int] = field(default_factory=dict)
    """Absolute slack per counter."""
    sources: Sources | str | None = None
    """The EXACT counters split by line, or why there are none."""

    @property
    def key(self) -> Key:
        return self.finding, self.case, self.variant


@dataclass(frozen=True)
class Baseline:
    """A counters baseline file, read and checked (`load_baseline`)."""

    path: Path
    schema_version: int
    """As the file says (1: recorded without kernel paths)."""
    kernel_paths: dict[str, dict]
    """Kernel path id -> its fields (`harness.measure.machine.kernel_path`)."""
    entries: dict[Key, BaselineEntry]


def _bad_baseline(path: Path, what: str, modules: Sequence[str] = ()) -> UsageError:
    return UsageError(f"{path}: {what}; recreate it with `{update_command(path, modules=modules)}`")


def _counts(raw: dict, names: Sequence[str], where: str, path: Path, modules: Sequence[str]
            ) -> dict[str, int]:
    """`names` of `raw`, each an integer >= 0; UsageError naming the field otherwise."""
    missing = [k for k in names if k not in raw]
    if missing:
        raise _bad_baseline(path, f"{where}: expected fields {', '.join(missing)}; "
                                  f"got {sorted(raw)}", modules)
    bad = {k: raw[k] for k in names if not is_whole(raw[k]) or raw[k] < 0}
    if bad:
        raise _bad_baseline(path, f"{where}: expected counts as integers >= 0 for "
                                  f"{', '.join(names)}; got {bad}", modules)
    return {k: raw[k] for k in names}


def _sources(raw: object, where: str, path: Path, modules: Sequence[str]) -> Sources | str | None:
    """A stored `sources` value: rows, a string saying why there are none, or absent."""
    if raw is None or isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise _bad_baseline(path, f"{where}.sources: expected a list of rows or a string; "
                                  f"got {type(raw).__name__}", modules)
    try:
        return Sources.from_rows(raw)
    except ValueError as err:
        raise _bad_baseline(path, f"{where}.{err}", modules) from err


def _entry(raw: object, where: str, version: int, kernel_paths: Mapping[str, dict], path: Path,
           modules: Sequence[str]) -> BaselineEntry:
    """One `counters` entry, checked: its key as strings, counts and tolerances as ints >= 0,
    kernel paths the file lists. A schema 1 entry keeps its EXACT counts only."""
    if not isinstance(raw, dict):
        raise _bad_baseline(path, f"{where}: expected an object; got {type(raw).__name__}",
                            modules)
    names = ("finding", "case", "variant")
    missing = [k for k in names if k not in raw]
    if missing:
        raise _bad_baseline(path, f"{where}: expected fields {', '.join(missing)}; "
                                  f"got {sorted(raw)}", modules)
    key = {k: raw[k] for k in names}
    if not all(isinstance(v, str) for v in key.values()):
        raise _bad_baseline(path, f"{where}: expected finding, case and variant as strings; "
                                  f"got {key}", modules)
    exact = _counts(raw, COUNTERS if version == 1 else EXACT, where, path, modules)
    tolerance = raw.get("tolerance", {})
    if not isinstance(tolerance, dict):
        raise _bad_baseline(path, f"{where}.tolerance: expected an object; "
                                  f"got {type(tolerance).__name__}", modules)
    unknown = sorted(set(tolerance) - set(COUNTERS))
    bad = {k: v for k, v in tolerance.items() if not is_whole(v) or v < 0}
    if bad or unknown:
        raise _bad_baseline(path, f"{where}.tolerance: expected integers >= 0 for counters "
                                  f"of {', '.join(COUNTERS)}; got {bad or unknown}", modules)
    by_kernel_path = {}
    recorded = raw.get("by_kernel_path", {}) if version >= 2 else {}
    if not isinstance(recorded, dict):
        raise _bad_baseline(path, f"{where}.by_kernel_path: expected an object; "
                                  f"got {type(recorded).__name__}", modules)
    for name, counts in recorded.items():
        here = f"{where}.by_kernel_path.{name}"
        if name not in kernel_paths:
            raise _bad_baseline(path, f"{here}: expected a kernel path listed in kernel_paths "
                                      f"({', '.join(kernel_paths) or 'none'}); got {name!r}",
                                modules)
        if not isinstance(counts, dict):
            raise _bad_baseline(path, f"{here}: expected an object; got "
                                      f"{type(counts).__name__}", modules)
        by_kernel_path[name] = KernelCounts(
            _counts(counts, KERNEL_DEPENDENT, here, path, modules),
            _sources(counts.get("sources"), here, path, modules))
    return BaselineEntry(**key, exact={k: exact[k] for k in EXACT},
                         by_kernel_path=by_kernel_path, tolerance=dict(tolerance),
                         sources=_sources(raw.get("sources"), where, path, modules)
                         if version >= 2 else None)


def load_baseline(path: Path, *, check_fingerprint: bool = True,
                  modules: Sequence[str] = ()) -> Baseline:
    """The baseline at `path`, checked; UsageError naming the file, what is wrong
    (missing, unreadable, not UTF-8, truncated, another schema or torch version, a bad
    entry) and the command that fixes it. Schema 1 files load (module docstring).

    `check_fingerprint=False` reads a file of another torch version too (to carry its
    tolerances over); `modules`, your findings modules, are named in the command.
    """
    if not path.exists():
        raise UsageError(f"no counters baseline at {path}; create it with "
                         f"`{update_command(path, modules=modules)}`")
    document = read_json(path, fix=f"recreate it with `{update_command(path, modules=modules)}`")
    if not isinstance(document, dict):
        raise _bad_baseline(path, f"expected a JSON object; got {type(document).__name__}", modules)
    version = document.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise _bad_baseline(path, f"schema_version: expected one of "
                                  f"{', '.join(map(str, READABLE_VERSIONS))}; got {version!r}",
                            modules)
    recorded, here = document.get("fingerprint"), counting_fingerprint()
    if check_fingerprint and recorded != here:
        raise _bad_baseline(path, f"fingerprint: expected {here} (this machine); "
                                  f"got {recorded!r}", modules)
    kernel_paths = document.get("kernel_paths", {}) if version >= 2 else {}
    if not (isinstance(kernel_paths, dict)
            and all(isinstance(v, dict) for v in kernel_paths.values())):
        raise _bad_baseline(path, "kernel_paths: expected an object of kernel paths (id -> "
                                  f"fields); got {kernel_paths!r}", modules)
    listed = document.get("counters")
    if not isinstance(listed, list):
        raise _bad_baseline(path, f"counters: expected a list of entries; got "
                                  f"{'nothing' if listed is None else type(listed).__name__}",
                            modules)
    entries: dict[Key, BaselineEntry] = {}
    for index, raw in enumerate(listed):
        entry = _entry(raw, f"counters[{index}]", version, kernel_paths, path, modules)
        if entry.key in entries:
            raise _bad_baseline(path, f"counters[{index}]: expected one entry per finding, "
                                      f"case and variant; got {entry.key} again", modules)
        entries[entry.key] = entry
    return Baseline(path, version, dict(kernel_paths), entries)


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
    kernel_path: str = ""
    """The id of the kernel path the counts were recorded under."""
    other_kernel_paths: int = 0
    """Other kernel paths whose counts the file keeps."""
    stale: tuple[Key, ...] = ()
    """Cells whose counts changed here: their other kernel paths' counts were dropped."""


def _previous(path: Path, findings: set[str], replace_stale: bool, modules: Sequence[str] = ()
              ) -> tuple[Baseline | None, str | None]:
    """The baseline to merge with, and why the file is replaced instead (None: merged).

    A file of another schema (schema 1: its allocation counters have no kernel path to
    keep them under) or torch version, or that cannot be read, has nothing to merge with:
    it is replaced when `replace_stale`, or when it holds entries of the measured findings
    only (their tolerances kept); otherwise UsageError (the other findings' entries would
    be lost or mixed with counts of another torch version or machine).
    """
    if not path.exists():
        return None, None
    try:
        current = load_baseline(path, modules=modules)
    except UsageError as err:
        problem = str(err)
    else:
        if current.schema_version == SCHEMA_VERSION:
            return current, None
        problem = (f"{path}: schema_version {current.schema_version} keeps the allocation "
                   "counters without the CPU kernel path they were counted on; "
                   f"`{update_command(path, modules=modules)}` rewrites it as schema "
                   f"{SCHEMA_VERSION}")
    try:  # a readable file of another torch version: its tolerances carry over
        loose = load_baseline(path, check_fingerprint=False)
    except UsageError:
        loose = None
    others = None if loose is None else sorted({k[0] for k in loose.entries} - findings)
    if not replace_stale and others != []:
        whose = "the entries of the other findings" if others is None else ", ".join(others)
        raise UsageError(f"baseline not updated, it would lose {whose}: {problem}")
    if loose is not None:  # its counts are of another torch version: only tolerances stay
        loose = dataclasses.replace(loose, kernel_paths={}, entries={
            k: dataclasses.replace(e, by_kernel_path={}, sources=None)
            for k, e in loose.entries.items() if k[0] in findings})
    return loose, problem


def _merged(cell: CellCounts, old: BaselineEntry | None, here: str) -> tuple[BaselineEntry, bool]:
    """The entry of a measured cell: its counts for kernel path `here`, the old entry's
    tolerance and other kernel paths' counts, unless the counts changed here (then those
    were counted on other code: dropped, and the second value is True)."""
    counts = cell.counts
    exact = {k: counts[k] for k in EXACT}
    mine = KernelCounts({k: counts[k] for k in KERNEL_DEPENDENT},
                        _split(cell.sources, KERNEL_DEPENDENT))
    others = dict(old.by_kernel_path) if old is not None else {}
    previous = others.pop(here, None)
    changed = old is not None and (old.exact != exact or (
        previous is not None and previous.counts != mine.counts))
    stale = changed and bool(others)
    return BaselineEntry(cell.finding, cell.case, cell.variant, exact,
                         by_kernel_path={**({} if changed else others), here: mine},
                         tolerance=old.tolerance if old is not None else {},
                         sources=_split(cell.sources, EXACT)), stale


def _split(sources: Sources | str | None, counters: Sequence[str]) -> Sources | str | None:
    """The part of `sources` that is about `counters` (a reason why there are none as is)."""
    if not isinstance(sources, Sources):
        return sources
    return Sources(tuple(e for e in sources.entries if e.counter in counters))


def _stored(sources: Sources | str | None) -> dict:
    if sources is None:
        return {}
    return {"sources": sources if isinstance(sources, str) else sources.as_rows()}


def _document(baseline: Baseline, here_path: dict) -> dict:
    """The file's JSON: the kernel paths its entries use, each entry's counts and lines."""
    used = {name for e in baseline.entries.values() for name in e.by_kernel_path}
    entries = []
    for e in baseline.entries.values():
        entry = {"finding": e.finding, "case": e.case, "variant": e.variant, **e.exact,
                 **_stored(e.sources)}
        entry["by_kernel_path"] = {name: {**k.counts, **_stored(k.sources)}
                                   for name, k in e.by_kernel_path.items()}
        if e.tolerance:
            entry["tolerance"] = e.tolerance
        entries.append(entry)
    return {
        "schema_version": SCHEMA_VERSION,
        "fingerprint": counting_fingerprint(),
        "recorded_with": {"torch": torch.__version__, "python": platform.python_version()},
        "command": UPDATE_COMMAND,
        "kernel_paths": {name: fields for name, fields in
                         {**baseline.kernel_paths, kernel_path_id(here_path): here_path}.items()
                         if name in used},
        "counters": entries,
    }


def dump(document: dict) -> str:
    """`document` as indented JSON, each row of sources on a line of its own (a baseline
    holds thousands of them)."""
    rows: list[str] = []

    def placeholders(value):
        if isinstance(value, dict):
            return {k: (_mark(v, rows) if k == "sources" and isinstance(v, list)
                        else placeholders(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [placeholders(v) for v in value]
        return value

    text = json.dumps(placeholders(document), indent=1)
    for index, rendered in enumerate(rows):
        text = text.replace(json.dumps(f"\0sources {index}"), rendered, 1)
    return text + "\n"


def _mark(rows: list, rendered: list[str]) -> str:
    """A placeholder for `rows`, rendered one row a line."""
    rendered.append("[" + ",".join("\n  " + json.dumps(row) for row in rows)
                    + ("\n ]" if rows else "]"))
    return f"\0sources {len(rendered) - 1}"


def write_baseline(path: Path, cells: Sequence[CellCounts], *, replace_stale: bool = False,
                   here: dict | None = None) -> BaselineUpdate:
    """Merge the measured cells, counted on kernel path `here` (default: this process's,
    `gate_kernel_path`), into the baseline at `path` and write it atomically.

    The entries of the cells' findings are rewritten from the measurement for this kernel
    path (a cell skipped here keeps its old entry; an entry whose cell no longer exists is
    dropped; a cell whose counts changed here loses the other kernel paths' counts: they
    were counted on other code); every entry of any other finding and the other kernel
    paths' counts are kept as they were, in place. Tolerances are kept.
    Raises UsageError, leaving the file as it was, when a cell raised or counted
    differently on two calls (such a cell cannot be gated exactly), or when the old file
    cannot be merged into (see `_previous`; `replace_stale` replaces it instead).
    """
    broken = [c for c in cells if c.error]
    if broken:
        listing = "; ".join(f"{c.finding} {c.variant} [{c.case}]: {c.error}" for c in broken)
        raise UsageError(f"baseline not written, {len(broken)} cell(s) failed: {listing}")
    here_path = gate_kernel_path() if here is None else dict(here)
    here_id = kernel_path_id(here_path)
    findings = {c.finding for c in cells}
    old, replaced = _previous(path, findings, replace_stale)
    old_entries = old.entries if old is not None else {}
    # the file's order of findings, then new ones; each measured finding in measured order
    groups: dict[str, list[BaselineEntry]] = {key[0]: [] for key in old_entries}
    kept_skipped, stale = 0, []
    for key, entry in old_entries.items():
        if key[0] not in findings:
            groups[key[0]].append(entry)
    for cell in cells:
        if cell.counts is not None:
            entry, dropped_others = _merged(cell, old_entries.get(cell.key), here_id)
            groups.setdefault(cell.finding, []).append(entry)
            if dropped_others:
                stale.append(cell.key)
        elif cell.key in old_entries and replaced is None:  # skipped here: as recorded there
            groups[cell.finding].append(old_entries[cell.key])
            kept_skipped += 1
    merged = Baseline(path, SCHEMA_VERSION, old.kernel_paths if old is not None else {},
                      {e.key: e for group in groups.values() for e in group})
    document = _document(merged, here_path)
    atomic_write_text(path, dump(document))
    measured = {c.key for c in cells}
    return BaselineUpdate(
        written=sum(c.counts is not None for c in cells),
        kept={f: len(group) for f, group in groups.items() if f not in findings and group},
        kept_skipped=kept_skipped,
        dropped=tuple(k for k in old_entries if k[0] in findings and k not in measured),
        replaced=replaced, kernel_path=here_id,
        other_kernel_paths=len(set(document["kernel_paths"]) - {here_id}),
        stale=tuple(stale),
    )


# ------------------------------------------------------------------------------- comparison

def _counts_text(counts: Mapping[str, int]) -> str:
    return " ".join(f"{k}={counts[k]}" for k in COUNTERS if k in counts)


def _field_change(name: str, here: object, there: object) -> str:
    """'env_onednn_max_cpu_isa: here 'AVX2', recorded None'; flags as what differs."""
    if name == "cpu_flags" and isinstance(here, str) and isinstance(there, str):
        mine, theirs = set(here.split()), set(there.split())
        return (f"cpu_flags: here {' '.join(sorted(mine - theirs)) or 'none'} more, "
                f"{' '.join(sorted(theirs - mine)) or 'none'} fewer")
    return f"{name}: here {here!r}, recorded {there!r}"


@dataclass(frozen=True)
class KernelMatch:
    """Whether the baseline holds KERNEL_DEPENDENT counts for this machine's kernel path,
    and, where it does not, why (for the rows and the note after the table)."""

    here: dict
    """This machine's kernel path."""
    id: str
    differences: tuple[str, ...] = ()
    """Fields where the nearest recorded kernel path differs ('name: here X, recorded Y'),
    empty when the baseline holds this one, or none at all."""
    recorded: int = 0
    """Kernel paths the baseline holds."""
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def of(cls, baseline: Baseline, here: dict | None = None) -> "KernelMatch":
        here = gate_kernel_path() if here is None else dict(here)
        match = cls(here, kernel_path_id(here), recorded=len(baseline.kernel_paths),
                    schema_version=baseline.schema_version)
        if match.id in baseline.kernel_paths or not baseline.kernel_paths:
            return match
        nearest = min((fingerprint_changes(fields, here) for fields in
                       baseline.kernel_paths.values()), key=len)
        return dataclasses.replace(match, differences=tuple(
            _field_change(name, new, old) for name, old, new in nearest))

    def reason(self, entry: BaselineEntry) -> str | None:
        """Why `entry`'s KERNEL_DEPENDENT counts cannot be compared here, or None."""
        if self.id in entry.by_kernel_path:
            return None
        if self.schema_version == 1:
            return "the baseline (schema 1) recorded them without their CPU kernel path"
        if self.differences:
            fields = ", ".join(d.split(":", 1)[0] for d in self.differences)
            return f"this CPU kernel path is not in the baseline ({fields} differs)"
        if entry.by_kernel_path:
            return "the entry holds them for other CPU kernel paths only"
        return "the entry holds them for no CPU kernel path"


def _compare_cell(current: CellCounts, entry: BaselineEntry, match: KernelMatch,
                  path: Path) -> GateRow:
    recorded = entry.by_kernel_path.get(match.id)
    before = {**entry.exact, **(recorded.counts if recorded else {})}
    after = {k: current.counts[k] for k in before}
    unmatched = () if recorded else KERNEL_DEPENDENT
    base = dict(check="counters", finding=current.finding, variant=current.variant,
                case=current.case, baseline=_counts_text(before),
                current="same" if before == after else _counts_text(after))
    changes, worse, better = [], False, False
    for name in before:
        diff = after[name] - before[name]
        slack = entry.tolerance.get(name, 0)
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
    notes = []
    if outcome is Outcome.IMPROVED:
        notes.append(f"lock it in with `{update_command(path, [current.finding])}`")
    if unmatched:
        notes.append(f"{', '.join(unmatched)} not compared: {match.reason(entry)}")
    return GateRow(**base, change=", ".join(changes) or "=", outcome=outcome,
                   note="; ".join(notes), not_compared=unmatched)


#: outcomes of a measured cell held against its baseline entry
COMPARED = (Outcome.PASS, Outcome.IMPROVED, Outcome.REGRESSION)


def compare(current: Sequence[CellCounts], baseline: Baseline, finding_ids: Sequence[str], *,
            allow_new: bool = False, match: KernelMatch | None = None) -> list[GateRow]:
    """One row per measured cell, then one per baseline entry of these findings not measured.

    EXACT counters are compared in every cell with an entry; KERNEL_DEPENDENT ones where
    the entry holds them for this machine's kernel path (`match`, default this process's),
    else the row names them in `not_compared` and says why. A measured cell without a
    baseline entry is NEW (fails); with `allow_new` it is NEW_ALLOWED (passes), but only
    when some other cell was compared: a baseline with no entry for any measured cell
    never passes.
    """
    match = KernelMatch.of(baseline) if match is None else match
    path, entries = baseline.path, baseline.entries
    allowed = allow_new and any(c.counts is not None and c.key in entries for c in current)
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
        elif cell.key not in entries:
            rows.append(GateRow(
                **base, baseline="", current=_counts_text(cell.counts), change="",
                outcome=Outcome.NEW_ALLOWED if allowed else Outcome.NEW,
                note=f"not in the baseline; add it with `{update_command(path, [cell.finding])}`"))
        else:
            rows.append(_compare_cell(cell, entries[cell.key], match, path))
    for key, entry in entries.items():
        if key not in seen and entry.finding in finding_ids:
            rows.append(GateRow(check="counters", finding=entry.finding, variant=entry.variant,
                                case=entry.case, baseline=_counts_text(entry.exact), current="",
                                change="", outcome=Outcome.MISSING,
                                note="not measured here (variant or case not on this machine)"))
    return rows


def not_compared_note(rows: Sequence[GateRow], match: KernelMatch, path: Path,
                      command: str) -> str | None:
    """One sentence for after the table when some cells' KERNEL_DEPENDENT counters were
    not compared: which, in how many cells, why (the kernel path fields that differ from
    the nearest recorded one) and `command`, which records this machine's; else None."""
    compared = [r for r in rows if r.check == "counters" and r.outcome in COMPARED]
    partial = [r for r in compared if r.not_compared]
    if not partial:
        return None
    names = sorted({n for r in partial for n in r.not_compared}, key=COUNTERS.index)
    if match.schema_version == 1:
        why = (f"{path} is of schema 1, which recorded them without the CPU kernel path they "
               "were counted on")
    elif match.differences:
        nearest = "the one recorded" if match.recorded == 1 else \
            f"the nearest of the {match.recorded} recorded"
        why = (f"this machine's CPU kernel path is not in {path} ({nearest} differs in "
               f"{'; '.join(match.differences)})")
    else:
        why = f"{path} holds them for this CPU kernel path in other cells only"
    kept = ("it rewrites the file as schema 2" if match.schema_version == 1
            else "the other kernel paths' counts are kept")
    return (f"counters: {', '.join(names)} depend on the CPU kernel path and were not compared "
            f"in {len(partial)} of {len(compared)} cells: {why}; {', '.join(EXACT)} were "
            f"compared exactly. Record this machine's counts with `{command}` ({kept}).")


def _recorded_sources(entry: BaselineEntry, match: KernelMatch, before: Mapping[str, int],
                      counters: Sequence[str]) -> tuple[Sources | None, str]:
    """The baseline's lines behind `counters` of `entry` on this kernel path, or None with
    why there are none (lines that do not add up to the entry's counts `before`, edited by
    hand, are none)."""
    parts = [entry.sources]
    if any(c in KERNEL_DEPENDENT for c in counters):
        recorded = entry.by_kernel_path.get(match.id)
        parts.append(recorded.sources if recorded else None)
    for part in parts:
        if isinstance(part, str):
            return None, f"its lines could not be recorded ({part})"
        if part is None:
            return None, "the baseline holds no lines for this cell"
    sources = Sources(tuple(e for part in parts for e in part.entries))
    totals = sources.totals()
    if any(c in totals and totals[c] != before[c] for c in counters):
        return None, "the baseline's lines of this cell do not add up to its counts"
    return sources, ""


def explain_changes(rows: Sequence[GateRow], current: Sequence[CellCounts], baseline: Baseline,
                    *, seed: int = 0, match: KernelMatch | None = None,
                    command: str = UPDATE_COMMAND) -> list[GateRow]:
    """The rows, each regression or improvement with its changed counters explained in its
    note as per-line deltas: the cell is profiled once more with its events split by the
    project's lines (`harness.explain`) and held against the lines the baseline recorded,
    e.g. `op calls 583 -> 584: +1 aten::clone at mylib/ops.py:42 in scale()`. Where the
    baseline has no lines for the cell (an older file), the note lists where the counter
    comes from now and says how to record them (`command`); a cell that cannot be
    attributed says why."""
    match = KernelMatch.of(baseline) if match is None else match
    measured = {cell.key: cell for cell in current}
    out = []
    for row in rows:
        key = (row.finding, row.case, row.variant)
        if row.outcome not in (Outcome.REGRESSION, Outcome.IMPROVED) or key not in measured:
            out.append(row)
            continue
        entry = baseline.entries[key]
        compared = [c for c in COUNTERS if c not in row.not_compared]
        before = {**entry.exact, **(entry.by_kernel_path[match.id].counts
                                    if match.id in entry.by_kernel_path else {})}
        before = {c: before[c] for c in compared}
        after = {c: measured[key].counts[c] for c in compared}
        finding = registry.planned(registry.FINDINGS[row.finding], True)
        case = next(c for c in finding.cases(True) if c.label == row.case)
        old, missing = _recorded_sources(entry, match, before, explain.changed(before, after))
        try:
            now = explain.cell_sources(finding, case, row.variant, seed=seed)
            text = explain.between(before, after, old, now)
            if old is None:
                text += f" ({missing}; `{command}` records them)"
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
    """Measure every cell of `finding_ids` twice, refuse non-deterministic cells, split
    each by line, and merge them into the baseline for this machine's kernel path
    (`write_baseline`; `modules`, the findings modules, are named in its messages)."""
    _previous(baseline_path, set(finding_ids), replace_stale, modules)  # refuse before measuring
    cells = measure(finding_ids, repeat_check=True, attribute=True)
    return write_baseline(baseline_path, cells, replace_stale=replace_stale)
