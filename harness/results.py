"""Results on disk: one folder per run, a journal of its cells, atomic writes; loaders.

    results/<run-id>/run.json        schema version, metadata and status; when the run
                                     ends, also every summary row and sample row
    results/<run-id>/cells/*.json    the journal: one file per finding x case, written
                                     (atomically, fsync'ed) the moment the cell is measured
    results/<run-id>/rows.csv        tidy: one row per finding x variant x case x sample
    results/<run-id>/traces/         gzipped Chrome traces, one per finding
    results/latest                   the id of the newest run

A run's status is `running` while it measures, then `complete`, `interrupted` (a signal
stopped it; what was measured is kept) or `crashed` (an internal error). A run whose
process died without saying so (SIGKILL, power loss) still reads `running` in its
`run.json`; `load_run` reports it as `killed` once that process is gone. Either way its
cells are in the journal: the report renders them and `harness.run --resume` measures
only the cells that are missing.

Run ids are unique: the folder is created exclusively, with a suffix on a collision, so
runs started in the same second never share one.

Every file is checked where it is read (`load_run`, `read_cells`): the document's kind
and schema version (documents of schema 1, before runs described their findings and words
had a margin, are brought to the current schema on read, in `migrate`), and each summary
row against `ROW_FIELDS` (`check_row`): a wrong one is a `RunFileError` naming the file,
the row and the field, with what was expected and what was found. Rows keep the words and
intervals they were measured with; the report marks those of older runs where it shows
them (`harness.report.headline`, `harness.report.verdicts`: words of unpaired intervals).
"""

from __future__ import annotations

import contextlib
import csv
import enum
import errno
import hashlib
import io
import json
import math
import os
import re
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import lock
from harness.combine import combine
from harness.exits import UsageError, elided, process_stat, read_json, too_long
from harness.measure.decision import DEFAULT_MARGIN
from harness.measure.numbers import is_real, is_whole
from harness.measure.stats import Verdict

#: 2: runs record what the report needs of each finding (`finding_info`), rows their
#: words with a margin, the paired estimate behind them and the placebo
SCHEMA_VERSION = 2
#: the versions `migrate` reads
READABLE_VERSIONS = (1, 2)
DEFAULT_RESULTS_DIR = Path("results")
CELLS = "cells"
#: statuses a run.json can hold; `killed` is only ever inferred by `load_run`
STATUSES = ("running", "complete", "interrupted", "crashed", "killed")


class Status(str, enum.Enum):
    """What happened to one finding x case x variant (a summary row's `status`)."""

    OK = "ok"
    """Timed (its `verdict` says what the time shows)."""
    FAILED = "failed"
    """It raised; `error` says where."""
    MISMATCH = "mismatch"
    """Its output disagreed with the reference, so it was not timed; `reason` says by how much."""
    NEEDS_CUDA = "needs_cuda"
    """It needs a CUDA device and the run had none."""
    NOT_TIMED = "not_timed"
    """Left out here (`reason` says why)."""


#: a summary row's fields whose kind is fixed, and that kind (a present value must be one;
#: None is an absent value). Other fields (a finding's own metrics) are kept as they are.
ROW_FIELDS: dict[str, type | tuple[type, ...]] = {
    "finding": str, "case": str, "variant": str, "status": Status, "verdict": Verdict,
    "baseline": bool, "placebo": bool, "headline": bool, "device": str,
    "n": int, "median_s": float, "iqr_s": float, "first_call_s": float,
    "ratio": float, "ci_low": float, "ci_high": float, "ci_level": float, "speedup": float,
    "ci_halfwidth": float, "margin": float, "pvalue": float, "log_se": float, "df": float,
    "process_sd": float, "processes": int, "process_note": str, "rounds_to_decide": int,
    "process_df": float, "process_p": float, "first_output_s": float,
    "one_thread_ratio": float, "one_thread_ci_low": float, "one_thread_ci_high": float,
    "one_thread_verdict": str, "processes_to_decide": int,
    "max_error": float,
    "op_calls": int, "host_syncs": int, "allocations": int, "allocated_bytes": int,
    "kernel_launches": int, "peak_bytes": int, "error": str, "reason": str,
    "stopped_by": str, "precision_reached": float, "number_per_sample": int,
    "compared_to": str, "call_overhead_s": float, "interval": str, "lean": str,
    "claim_word": str, "claim_factor": float, "claim_tolerance": float, "profile_note": str,
    "warning": str, "floor_s": float, "floor_level": str, "bound": str, "min_bytes": float,
    "achieved_bytes_per_s": float, "others_busy_cores": float, "timed_beside_load": bool,
    "one_thread_beside_load": bool,
}


#: run.json's metadata fields whose kind is fixed (None, where allowed, is absent)
METADATA_FIELDS: dict[str, type] = {
    "status": str, "run_id": str, "created": str, "quick": bool, "seed": int,
    "time_budget_s": float, "budget_s": float, "precision": float, "margin": float,
    "placebo": str, "process_level": dict, "seconds": float,
    "processes": int,
    "profile": bool, "findings": list, "options": dict, "cells_total": int,
    "cells_done": int, "world_size": int, "device": str, "device_name": str,
    "cpu_model": str, "cpu_flags": str, "aten_cpu_capability": str,
    "env_aten_cpu_capability": str, "env_onednn_max_cpu_isa": str,
    "python": str, "torch": str, "cuda": str, "threads": int,
    "platform": str, "git_commit": str, "git_dirty": bool, "tool_version": str,
    "tool_git_commit": str, "command": str, "pid": int,
    "host": str, "process_start": str, "finding_info": dict, "process_noise": dict,
    "copy_bandwidth_bytes_per_s": float, "pyspy": dict, "ranks": list, "warnings": list,
}


def _kind_name(kind) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(m.value for m in kind)
    return {str: "a string", bool: "true or false", int: "a whole number",
            float: "a number", list: "a list", dict: "an object"}[kind]


def _check_kinds(document: dict, kinds: dict, where, fix: str = "") -> None:
    """RunFileError naming the first field of `kinds` present in `document` whose value
    is not of its kind (absent and null fields pass)."""
    for field, kind in kinds.items():
        value = document.get(field)
        if value is not None and not _fits(value, kind):
            raise RunFileError(f"{where}: field {field!r}: expected {_kind_name(kind)}; got "
                               f"{value!r}{fix}")


def _fits(value, kind) -> bool:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return isinstance(value, str) and value in {m.value for m in kind}
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return is_whole(value) or (isinstance(value, float) and value.is_integer())
    if kind is float:
        return is_real(value, finite=False)
    return isinstance(value, kind)


def check_row(row: object, where: str) -> dict:
    """`row` if it is a summary row (a JSON object whose fields in ROW_FIELDS hold their
    kind); else RunFileError naming `where` and the field."""
    if not isinstance(row, dict):
        raise RunFileError(f"{where}: expected a JSON object (a summary row); got "
                           f"{type(row).__name__}")
    for field in ("finding", "case", "variant"):
        if not isinstance(row.get(field), str):
            raise RunFileError(f"{where}: field {field!r}: expected a string; got "
                               f"{row.get(field)!r}")
    _check_kinds(row, ROW_FIELDS, where)
    for field, value in row.items():
        if field.startswith("p_") and isinstance(value, (list, dict)):
            raise RunFileError(f"{where}: field {field!r}: expected a case parameter (a "
                               f"string, a number or true/false); got {value!r}")
    if row.get("status") == Status.OK.value:  # timed: the report reads its median and word
        _check_positive(row, "median_s", where, "the median seconds of a timed row (status "
                        "'ok'), a number > 0")
        if row.get("verdict") is None:
            raise RunFileError(f"{where}: field 'verdict': expected the word of a timed row "
                               f"(status 'ok'), {_kind_name(Verdict)}; got "
                               f"{'nothing (the field is missing)' if 'verdict' not in row else None}")
    if any(row.get(field) is not None for field in _INTERVAL):
        for field in _INTERVAL:
            _check_positive(row, field, where, "a number > 0 (a row with a ratio has its "
                            "interval: ratio, ci_low and ci_high)")
    return row


#: the fields of a row's ratio to its baseline: all of them or none
_INTERVAL = ("ratio", "ci_low", "ci_high")


def _check_positive(row: dict, field: str, where: str, expected: str) -> None:
    """RunFileError naming `field` unless `row` holds a finite number > 0 there."""
    value = row.get(field)
    if not (is_real(value) and value > 0):
        found = "nothing (the field is missing)" if field not in row else repr(value)
        raise RunFileError(f"{where}: field {field!r}: expected {expected}; got {found}")


def migrate(document: dict, path: Path) -> dict:
    """A run.json or journal document of any readable schema, as the current schema has
    it: the one place where older documents are brought to the current schema (their
    rows keep their words; the report marks them, module docstring). Schema 1 recorded nothing
    of its findings (`finding_info` becomes empty: the report says so) and its rows'
    intervals came from unpaired samples (their words keep their old values, and the
    report marks them). Runs before the findings modules' repository became the subject
    recorded the tool's checkout as `git_commit` and the modules' as `project_git_commit`:
    the latter becomes `git_commit`, the former `tool_git_commit`."""
    version = document.get("schema_version")
    if version not in READABLE_VERSIONS:
        newer = is_whole(version) and version > SCHEMA_VERSION
        raise RunFileError(
            f"{path}: schema_version: expected one of {', '.join(map(str, READABLE_VERSIONS))}; "
            f"got {version!r}. " + ("It was written by a newer esper-bench: upgrade it."
                                   if newer else
                                   "Re-run `python -m harness.run` with this version of the harness."))
    if version == 1:
        document = {**document, "schema_version": SCHEMA_VERSION,
                    "finding_info": document.get("finding_info") or {}, "migrated_from": 1}
    if document.get("project_git_commit"):
        document = {**document, "tool_git_commit": document.get("git_commit"),
                    "git_commit": document.pop("project_git_commit"),
                    "git_dirty": document.pop("project_git_dirty", None)}
    return document


class RunFileError(UsageError, ValueError):
    """A run folder or file that is missing, corrupt or of another schema (exit 2)."""


class DiskFullError(UsageError, OSError):
    """No space left while writing a result file; nothing half-written is left behind."""


# ------------------------------------------------------------------------------ writing

def _mount(path: Path) -> str:
    """`/dev/sda1 (mounted at /data)`: the file system holding `path`, for error messages."""
    mount = Path(os.path.abspath(path))
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        table = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:  # no /proc: the mount point alone still says where
        table = []
    for line in table:
        fields = line.split()
        if len(fields) > 1 and fields[1] == str(mount):
            return f"{fields[0]} (mounted at {mount})"
    return str(mount)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the directory entry is its own write)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms that cannot open a folder have nothing to sync here
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raise_if_disk_full(err: OSError, path: Path) -> None:
    """DiskFullError naming the file system and `path` when `err` says the disk (or the
    quota) is full, RunFileError when writing there is refused (permissions, a read-only
    file system): both the user's to fix, exit 2; else nothing, and the caller re-raises
    `err`."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        raise DiskFullError(f"no space left on {_mount(Path(path).parent)} while writing {path}; "
                            "free some space and run again") from err
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        raise RunFileError(f"{path}: cannot be written ({err.strerror or err}); make its "
                           f"folder writable, or choose another folder") from err


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` all or nothing: a temp file in the same folder, flushed and
    fsync'ed, then renamed over `path`, then the folder fsync'ed.

    A reader sees the old file or the new one, never a mix, even after SIGKILL or a power
    cut. On any failure the temp file is removed; a full disk raises `DiskFullError`
    naming the file system and the file.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the writer's pid in the name: a later run can tell an orphan (`remove_orphan_temps`).
        # Named before it is created, so that a signal between the two leaves nothing the
        # `finally` does not remove (mkstemp's name came back only after the file existed)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        # results are for reading: 0o666 less the umask, as any file the user makes
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(path.parent)
    except OSError as err:
        raise_if_disk_full(err, path)
        raise
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


#: a temp file of `atomic_write_text` (or of a trace's merge): `.NAME.PID.XXXX.tmp`
_TEMP = re.compile(r"^\..+\.(?P<pid>\d+)\.(?:[^.]+\.)?tmp$")


def remove_orphan_temps(folder: Path, depth: int = 3) -> list[Path]:
    """Remove the temp files in `folder` (and up to `depth` levels below) whose writer's
    process is gone: what a SIGKILL or a power cut left half-written. Each removal is
    said on stderr. Returns the files removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    pattern = ["*"]
    for _ in range(depth + 1):
        for path in folder.glob("/".join([*pattern[:-1], ".*.tmp"])):
            match = _TEMP.match(path.name)
            if match and path.is_file() and not _alive(int(match["pid"]), None):
                path.unlink(missing_ok=True)
                print(f"removed {path}: a temp file left by a process that was killed",
                      file=sys.stderr)
                removed.append(path)
        pattern.append("*")
    return removed


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _csv_text(rows: list[dict]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def cell_file_name(finding: str, case: str) -> str:
    """`MY-rowsums--rows=256,cols=64--1a2b3c4d.json`: readable, unique per
    (finding, case), and safe as a file name whatever characters the case label holds."""
    digest = hashlib.sha1(f"{finding}\0{case}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^A-Za-z0-9._=,-]+", "_", f"{finding}--{case}")[:120]
    return f"{slug}--{digest}.json"


def _process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc), to tell a reused pid
    from the process that wrote a run; None where /proc cannot say."""
    fields = process_stat(pid)
    return None if fields is None else fields[19]  # field 22


def _alive(pid: int, started: str | None) -> bool:
    """Whether the process that recorded (`pid`, `started`) is still running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the pid: it is running
        pass
    return started is None or _process_start(pid) in (None, started)


def create_run_folder(results_dir: Path, run_id: str) -> Path:
    """Create `results_dir/run_id` exclusively; on a collision `run_id-2`, `-3`, ..."""
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 10_000):
        folder = results_dir / (run_id if attempt == 1 else f"{run_id}-{attempt}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise RunFileError(f"{results_dir}: expected a free run id; got 9,999 runs named {run_id}-*")


class RunWriter:
    """Writes one run: `run.json` at the start and the end, one journal file per cell the
    moment it is measured, `rows.csv` and `latest` at the end.

    Create a new run with `RunWriter.create`, or continue an earlier one with
    `RunWriter.reopen`; `add_cell` after each cell; `finish(status)` last; `close()` when
    done. Both hold the run folder's writer lock (`harness.lock`) until `close()`: a
    second process writing the folder is refused, naming this one.
    """

    def __init__(self, folder: Path, metadata: dict) -> None:
        self.folder = Path(folder)
        self.results_dir = self.folder.parent
        self.traces = self.folder / "traces"
        self.cells = self.folder / CELLS
        self.metadata = metadata
        self._held = contextlib.ExitStack()

    def close(self) -> None:
        """Release the run folder's writer lock (the writer writes no more)."""
        self._held.close()

    @classmethod
    def create(cls, results_dir: Path, run_id: str, metadata: dict) -> "RunWriter":
        """A new run folder (unique id), its `run.json` (status running) and `latest`."""
        folder = create_run_folder(results_dir, run_id)
        writer = cls(folder, {"run_id": folder.name, **metadata})
        with contextlib.ExitStack() as held:  # released here unless the run is open
            held.enter_context(lock.hold(folder, f"--out {results_dir}"))
            writer.traces.mkdir()
            writer.cells.mkdir()
            writer._write_header("running")
            try:
                atomic_write_text(writer.results_dir / "latest", folder.name + "\n")
            except UsageError:  # the run exists but cannot go on: it says so, where it can
                with contextlib.suppress(UsageError):
                    writer._write_header("crashed")
                raise
            writer._held = held.pop_all()
        return writer

    @classmethod
    def reopen(cls, folder: Path, what: str) -> "RunWriter":
        """An earlier run, to add its missing cells (`harness.run --resume`); `what` names
        the run as the user gave it (`--resume latest`), for a refusal's message."""
        with contextlib.ExitStack() as held:  # released here unless the run is open
            held.enter_context(lock.hold(Path(folder), what))
            document = _read_document(Path(folder))
            metadata = {k: v for k, v in document.items()
                        if k not in ("schema_version", "status", "summary", "rows")}
            writer = cls(folder, metadata)
            writer.traces.mkdir(exist_ok=True)
            writer.cells.mkdir(exist_ok=True)
            writer._write_header("running")
            writer._held = held.pop_all()
        return writer

    @classmethod
    def attach(cls, folder: Path, rank: int) -> "RunWriter":
        """Another rank's writer for rank 0's run `folder` (torchrun): it journals its cells
        there when this file system holds the folder, else in a folder of its own beside
        it (`<run-id>.rank<N>`), and never writes run.json; rank 0 gathers the cells."""
        folder = Path(folder)
        if not (folder / "run.json").is_file():
            folder = folder.parent / f"{folder.name}.rank{rank}"
            (folder / CELLS).mkdir(parents=True, exist_ok=True)
        writer = cls(folder, {"run_id": folder.name})
        writer.traces.mkdir(exist_ok=True)
        return writer

    def _write_header(self, status: str) -> None:
        """run.json without rows: the run's identity and that this process is writing it."""
        self.metadata.update(pid=os.getpid(), host=socket.gethostname(),
                             process_start=_process_start(os.getpid()))
        document = {"schema_version": SCHEMA_VERSION, "status": status, **self.metadata,
                    "summary": [], "rows": []}
        atomic_write_text(self.folder / "run.json", json.dumps(_json_safe(document), indent=1))

    def done_cells(self) -> set[tuple[str, str]]:
        """(finding, case) of every cell already in the journal."""
        return {(c["finding"], c["case"]) for c in read_cells(self.folder)}

    def add_cell(self, finding: str, case: str, order: tuple[int, int],
                 summary: list[dict], samples: list[dict], **extra) -> dict:
        """Journal one measured cell: its summary rows and sample rows, durably, now.

        `order` (finding index, case index) keeps the run's row order when the journal is
        read back; `extra` (e.g. the rank that measured it) is stored beside the rows.
        Returns the journal entry as written.
        """
        document = _json_safe({"schema_version": SCHEMA_VERSION, "finding": finding,
                               "case": case, "order": list(order), **extra,
                               "summary": summary, "samples": samples})
        atomic_write_text(self.cells / cell_file_name(finding, case), json.dumps(document))
        return document

    def finish(self, status: str) -> None:
        """Gather the journal into `run.json` (with `status`; every row worded from all its
        processes, `worded`) and `rows.csv`; point `latest` here."""
        if status not in STATUSES:
            raise ValueError(f"status: expected one of {', '.join(STATUSES)}; got {status!r}")
        cells = read_cells(self.folder)
        summary, level = worded(cells, self.metadata)
        samples = [row for c in cells for row in c["samples"]]
        if level is not None:
            self.metadata["process_level"] = level
        document = {"schema_version": SCHEMA_VERSION, "status": status, **self.metadata,
                    "cells_done": len(cells), "summary": summary, "rows": samples}
        atomic_write_text(self.folder / "run.json", json.dumps(_json_safe(document), indent=1))
        atomic_write_text(self.folder / "rows.csv", _csv_text(samples))
        atomic_write_text(self.results_dir / "latest", self.folder.name + "\n")

    @property
    def summary(self) -> list[dict]:
        """Every summary row journaled so far, in run order, worded from all its processes."""
        return worded(read_cells(self.folder), self.metadata)[0]


def measures_processes(metadata: dict) -> bool:
    """Whether a run timed each cell in several processes and words its rows from them
    all (`harness.combine`): runs made before kept one process's words per row."""
    return "budget_s" in metadata


def worded(cells: list[dict], metadata: dict) -> tuple[list[dict], dict | None]:
    """The journal's summary rows, worded from all their processes where the run measured
    them so, with what run.json keeps of its process level (else as journaled, and None)."""
    summary = [row for c in cells for row in c["summary"]]
    if not measures_processes(metadata) or not summary:
        return summary, None
    combined = combine(summary, [row for c in cells for row in c["samples"]],
                       metadata.get("finding_info") or {},
                       metadata.get("margin") or DEFAULT_MARGIN, metadata.get("threads"))
    return combined.summary, combined.noise()


# ------------------------------------------------------------------------------ reading

@dataclass(frozen=True)
class Run:
    """A run read back from disk."""

    folder: Path
    metadata: dict
    """run.json without its rows; `status` as `load_run` found it (see module docstring),
    `cells_done` the cells in the journal, `cells_total` the cells the run set out to do."""
    summary: pd.DataFrame
    """One row per finding x case x variant: status, verdict, median, ratio + CI, counters."""
    rows: pd.DataFrame
    """One row per timed sample (tidy)."""

    @property
    def run_id(self) -> str:
        return self.metadata["run_id"]


def resolve_run_folder(run: str | Path | None, results_dir: Path = DEFAULT_RESULTS_DIR,
                       source: str | None = None) -> Path:
    """A run folder from a path, a run id under `results_dir`, or `latest` / None.

    `source` names where `run` came from in the user's words (`--resume`, `RUN`), and
    each message then starts with it and the value given (`--resume latest: ...`).
    """
    given = "latest" if run is None else str(run)
    said = f"{source} {elided(given)}: " if source else ""
    long = too_long(Path(given))
    if long is not None:
        raise RunFileError(f"{said or 'run: '}expected a run folder, a run id or latest; "
                           f"got {long}")
    named_by = None
    if given == "latest":
        latest = Path(results_dir) / "latest"
        if not latest.is_file():
            raise RunFileError(
                f"{said}no run found: {latest} does not exist; create one with "
                "`python -m harness.run`")
        run = latest.read_text(errors="replace").strip()
        if not run or "/" in run or "\0" in run:
            raise RunFileError(
                f"{said}{latest}: expected the id of the newest run (a folder name beside it); "
                f"got {run!r}, which names no run; measure one with `python -m harness.run`, "
                f"or name a run instead of latest")
        named_by = latest
    candidate = Path(run)
    if (candidate / "run.json").exists():  # not only a file: what else it is, reading says
        return candidate
    under = Path(results_dir) / str(run)
    if (under / "run.json").exists():
        return under
    if named_by is not None:
        raise RunFileError(
            f"{said}{named_by} names run {str(run)!r}, which is not there (deleted or moved?): "
            f"{under} holds no run.json; measure a run with `python -m harness.run`, or name "
            "one that exists instead of latest")
    raise RunFileError(f"{said or f'no run {given!r}: '}neither {candidate} nor {under} holds a "
                       f"run.json; name a run folder, or the id of a run in {results_dir}")


def check_results_folder(results_dir: Path, option: str) -> None:
    """RunFileError unless `results_dir` (given as `option`) is a folder, where runs are."""
    if not Path(results_dir).is_dir():
        what = "a file" if Path(results_dir).exists() else "no such folder"
        raise RunFileError(f"{option}: expected a folder of runs; got {results_dir} ({what})")


def _read_document(folder: Path) -> dict:
    path = folder / "run.json"
    fix = "it is not a valid run; measure again with `python -m harness.run`"
    try:
        document = read_json(path, fix=fix)
    except UsageError as err:
        raise RunFileError(str(err)) from err
    if not isinstance(document, dict):
        raise RunFileError(f"{path}: expected a JSON object; got {type(document).__name__}; {fix}")
    document = migrate(document, path)
    if not isinstance(document.get("run_id"), str):
        raise RunFileError(f"{path}: field 'run_id': expected a string; got "
                           f"{document.get('run_id')!r}; {fix}")
    for field in ("summary", "rows"):
        if not isinstance(document.get(field, []), list):
            raise RunFileError(f"{path}: field {field!r}: expected a list of rows; got "
                               f"{type(document[field]).__name__}; {fix}")
    _check_kinds(document, METADATA_FIELDS, path, f"; {fix}")
    if document.get("status") not in (None, *STATUSES):
        raise RunFileError(f"{path}: field 'status': expected one of {', '.join(STATUSES)}; "
                           f"got {document['status']!r}; {fix}")
    info = document.get("finding_info") or {}
    bad = [k for k, v in info.items() if not isinstance(v, dict)]
    if bad:
        raise RunFileError(f"{path}: field 'finding_info': expected an object per finding; "
                           f"got {info[bad[0]]!r} for {bad[0]!r}; {fix}")
    document.setdefault("summary", [])
    document.setdefault("rows", [])
    for index, row in enumerate(document["summary"]):
        check_row(row, f"{path}: summary row {index}")
    return document


def read_cells(folder: Path) -> list[dict]:
    """The journal of run `folder`, in run order (empty for runs written before it
    existed); each cell checked (kind, schema, rows) and migrated to the current schema."""
    cells = []
    fix = "delete it and measure the cell again with `python -m harness.run --resume`"
    for path in sorted((Path(folder) / CELLS).glob("*.json")):
        try:
            cell = read_json(path, fix=fix)
        except UsageError as err:
            raise RunFileError(str(err)) from err
        if not isinstance(cell, dict):
            raise RunFileError(f"{path}: expected a JSON object (a journaled cell); got "
                               f"{type(cell).__name__}; {fix}")
        cell = migrate(cell, path)
        order = cell.get("order")
        if not (isinstance(order, list) and len(order) == 2
                and all(isinstance(i, int) for i in order)):
            raise RunFileError(f"{path}: field 'order': expected [finding index, case index]; "
                               f"got {order!r}; {fix}")
        for field in ("summary", "samples"):
            if not isinstance(cell.get(field), list):
                raise RunFileError(f"{path}: field {field!r}: expected a list of rows; got "
                                   f"{cell.get(field)!r}; {fix}")
        for index, row in enumerate(cell["summary"]):
            check_row(row, f"{path}: summary row {index}")
        cells.append(cell)
    return sorted(cells, key=lambda c: tuple(c["order"]))


def load_run(run: str | Path | None = None, results_dir: Path = DEFAULT_RESULTS_DIR,
             source: str | None = None) -> Run:
    """Read a run (path, id or `latest`), journaled cells included.

    Raises `RunFileError` (a `UsageError`: exit 2 in the commands) naming the file when
    the run is missing, not valid JSON (saying whether it looks truncated) or of another
    schema version; `source` (`resolve_run_folder`) names where `run` came from.
    """
    folder = resolve_run_folder(run, results_dir, source)
    document = _read_document(folder)
    cells = read_cells(folder)
    if cells:  # the journal is the record; run.json holds the same rows once finished
        summary = pd.DataFrame(worded(cells, document)[0])
        rows = pd.DataFrame([row for c in cells for row in c["samples"]])
    else:
        summary, rows = pd.DataFrame(document["summary"]), pd.DataFrame(document["rows"])
    metadata = {k: v for k, v in document.items() if k not in ("summary", "rows")}
    metadata["cells_done"] = len(cells) if cells else metadata.get("cells_done", _cells_in(summary))
    if metadata.get("status") == "running" and _writer_gone(metadata):
        metadata["status"] = "killed"
    return Run(folder=folder, metadata=metadata, summary=summary, rows=rows)


def _cells_in(summary: pd.DataFrame) -> int:
    return 0 if summary.empty else len(summary[["finding", "case"]].drop_duplicates())


def _writer_gone(metadata: dict) -> bool:
    """Whether the process that wrote a `running` run.json has ended (on this host)."""
    pid = metadata.get("pid")
    if not isinstance(pid, int) or metadata.get("host") != socket.gethostname():
        return False  # another machine's run, or an old one: nothing to check it against
    return not _alive(pid, metadata.get("process_start"))
