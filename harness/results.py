"""Results on disk: one folder per run, written atomically; loaders return DataFrames.

    results/<run-id>/run.json   schema version, metadata, summary rows, sample rows
    results/<run-id>/rows.csv   tidy: one row per finding x variant x case x sample
    results/<run-id>/traces/    gzipped Chrome traces, one per finding
    results/latest              the id of the newest run
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
DEFAULT_RESULTS_DIR = Path("results")


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; results are for reading
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


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


class RunWriter:
    """Collects a run's rows and rewrites its files after every finding, so an interrupted
    or crashing run keeps everything measured so far."""

    def __init__(self, results_dir: Path, run_id: str, metadata: dict) -> None:
        self.folder = Path(results_dir) / run_id
        self.traces = self.folder / "traces"
        self.traces.mkdir(parents=True, exist_ok=True)
        self.results_dir = Path(results_dir)
        self.metadata = {"run_id": run_id, **metadata}
        self.summary: list[dict] = []
        self.samples: list[dict] = []

    def add(self, summary: list[dict], samples: list[dict]) -> None:
        self.summary += summary
        self.samples += samples
        self.write(status="running")

    def write(self, status: str) -> None:
        document = {
            "schema_version": SCHEMA_VERSION,
            "status": status,
            **self.metadata,
            "summary": self.summary,
            "rows": self.samples,
        }
        atomic_write_text(self.folder / "run.json", json.dumps(_json_safe(document), indent=1))
        atomic_write_text(self.folder / "rows.csv", _csv_text(self.samples))
        atomic_write_text(self.results_dir / "latest", self.metadata["run_id"] + "\n")


@dataclass(frozen=True)
class Run:
    """A run read back from disk."""

    folder: Path
    metadata: dict
    summary: pd.DataFrame
    """One row per finding x case x variant: status, verdict, median, ratio + CI, counters."""
    rows: pd.DataFrame
    """One row per timed sample (tidy)."""

    @property
    def run_id(self) -> str:
        return self.metadata["run_id"]


def resolve_run_folder(run: str | Path | None, results_dir: Path = DEFAULT_RESULTS_DIR) -> Path:
    """A run folder from a path, a run id under `results_dir`, or `latest` / None."""
    if run is None or str(run) == "latest":
        latest = Path(results_dir) / "latest"
        if not latest.exists():
            raise FileNotFoundError(
                f"no run found: {latest} does not exist; create one with `python -m harness.run`"
            )
        run = latest.read_text().strip()
    candidate = Path(run)
    if (candidate / "run.json").exists():
        return candidate
    under = Path(results_dir) / str(run)
    if (under / "run.json").exists():
        return under
    raise FileNotFoundError(f"no run {run!r}: neither {candidate} nor {under} holds a run.json")


def load_run(run: str | Path | None = None, results_dir: Path = DEFAULT_RESULTS_DIR) -> Run:
    """Read a run (path, id or `latest`); rejects other schema versions with what to do."""
    folder = resolve_run_folder(run, results_dir)
    document = json.loads((folder / "run.json").read_text())
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{folder / 'run.json'}: schema_version: expected {SCHEMA_VERSION}; got {version!r}. "
            "Re-run `python -m harness.run` with this version of the harness."
        )
    summary = pd.DataFrame(document.pop("summary"))
    rows = pd.DataFrame(document.pop("rows"))
    return Run(folder=folder, metadata=document, summary=summary, rows=rows)


def load_rows(run: str | Path | None = None, results_dir: Path = DEFAULT_RESULTS_DIR) -> pd.DataFrame:
    """The tidy sample rows of a run as a DataFrame."""
    return load_run(run, results_dir).rows
