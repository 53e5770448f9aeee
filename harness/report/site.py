"""Writes report folders: a run's page, a run-vs-run page, and the index of all reports.

A report folder is self-contained and opens from disk: `index.html`, the PNG figures
next to it, copies of small traces and the flamegraph, and `report.json` (what the
folder holds, read back by the index). The folder is disposable: rendering again
replaces it. Nothing here measures; everything comes from the runs' files.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2

from harness.report import plots
from harness.report.compare import DEFAULT_FACTOR, Change, check_comparable, compare_runs
from harness.report.data import (
    E2E_ID, ReportError, finding_text, has_bandwidth, metadata_panel, param_columns,
    phase_breakdowns, sentences, table_rows,
)
from harness.results import Run, atomic_write_text
from harness.report.summary import format_seconds

MARKER = "report.json"
#: files up to this size are copied into the report; larger ones are linked where they are
COPY_LIMIT_BYTES = 2 * 1024 * 1024
_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("harness.report", "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
)


@dataclass(frozen=True)
class Attachment:
    """A file of the run shown or linked from the report (a trace, the flamegraph)."""

    name: str
    href: str
    """Relative to the report folder."""
    size: str
    copied: bool


def prepare_folder(out: Path) -> None:
    """Empty `out` for a new report; refuse a non-empty folder that is not a report."""
    if out.exists():
        if not out.is_dir():
            raise ReportError(f"--out {out}: expected a folder; got a file")
        if any(out.iterdir()) and not (out / MARKER).is_file():
            raise ReportError(
                f"--out {out}: expected an empty folder or an earlier report (with {MARKER}); "
                "got a folder holding other files. Choose another --out."
            )
        shutil.rmtree(out)  # an earlier report: the folder is disposable
    out.mkdir(parents=True)
    # marked before anything is drawn, so that a render that dies half-way can be redone
    atomic_write_text(out / MARKER, json.dumps({"kind": "partial"}))


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1024 / 1024:.1f} MB"


def attach(source: Path, out: Path, subfolder: str = "") -> Attachment:
    """Copy `source` into `out/subfolder` when small; else link it relatively where it is."""
    if source.stat().st_size < COPY_LIMIT_BYTES:
        target = out / subfolder / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return Attachment(source.name, target.relative_to(out).as_posix(), _size(source), True)
    href = Path(os.path.relpath(source.resolve(), out.resolve())).as_posix()
    return Attachment(source.name, href, _size(source), False)


def _finding_section(run: Run, finding_id: str, out: Path) -> dict:
    rows = run.summary[run.summary["finding"] == finding_id]
    text = finding_text(finding_id, rows)
    variants = list(dict.fromkeys(rows["variant"]))
    headlines, every = sentences(rows, text)
    figures, crossovers = [], []
    for param in param_columns(rows):
        drawn = plots.scaling_figure(finding_id, rows, param, variants, out)
        if drawn is not None:
            figures.append(drawn[0])
            crossovers += [c.sentence() for c in drawn[1]]
    for figure in (plots.speedup_figure(finding_id, rows, text.baseline, variants,
                                        text.claim_factor, out),
                   plots.counters_figure(finding_id, rows, variants, out)):
        if figure is not None:
            figures.append(figure)
    e2e = []
    if finding_id == E2E_ID:
        for index, breakdown in enumerate(phase_breakdowns(rows, text.baseline)):
            e2e.append({"breakdown": breakdown,
                        "figure": plots.phases_figure(finding_id, breakdown, out, index)})
    trace = run.folder / "traces" / f"{finding_id}.json.gz"
    return {
        "text": text, "headlines": headlines, "sentences": every, "figures": figures,
        "crossovers": crossovers, "table": table_rows(rows), "e2e": e2e,
        "bandwidth": has_bandwidth(rows),
        "trace": attach(trace, out, "traces") if trace.is_file() else None,
    }


def _flamegraph(run: Run, out: Path) -> dict:
    """What to show for the py-spy flamegraph: the picture, or why there is none."""
    outcome = run.metadata.get("pyspy")
    if outcome is None:
        return {"status": "not_requested", "detail": "the run was made without --pyspy",
                "file": None}
    source = run.folder / outcome["file"] if outcome.get("file") else None
    if outcome["status"] == "recorded" and source is not None and source.is_file():
        return {**outcome, "file": attach(source, out)}
    if outcome["status"] == "recorded":
        return {"status": "failed", "file": None,
                "detail": f"the run recorded {outcome['file']}, but it is not in the run folder"}
    return {**outcome, "file": None}


def _marker(kind: str, run: Run, **extra) -> str:
    m = run.metadata
    return json.dumps({"kind": kind, "run_id": run.run_id, "created": m.get("created"),
                       "git_commit": m.get("git_commit"), "git_dirty": m.get("git_dirty"),
                       "device_name": m.get("device_name"), "status": m.get("status"),
                       **extra}, indent=1)


def render_run(run: Run, out: Path) -> Path:
    """Write the report of `run` into `out` (replacing an earlier one); returns its page."""
    out = Path(out)
    prepare_folder(out)
    findings = list(dict.fromkeys(run.summary["finding"])) if not run.summary.empty else []
    sections = [_finding_section(run, f, out) for f in findings]
    page = _TEMPLATES.get_template("run.html.j2").render(
        run_id=run.run_id, metadata=metadata_panel(run.metadata), meta=run.metadata,
        sections=sections, flame=_flamegraph(run, out), format_seconds=format_seconds,
    )
    atomic_write_text(out / "index.html", page)
    atomic_write_text(out / MARKER, _marker("run", run))
    return out / "index.html"


def render_compare(new: Run, old: Run, out: Path, *, force: bool = False,
                   factor: float = DEFAULT_FACTOR) -> Path:
    """Write the new-vs-old report into `out`; ReportError if fingerprints differ unless forced."""
    differences = check_comparable(new, old, force)
    table = compare_runs(new, old, factor=factor)
    out = Path(out)
    prepare_folder(out)
    counts = table["change"].value_counts().to_dict()
    page = _TEMPLATES.get_template("compare.html.j2").render(
        new=new, old=old, factor=factor, differences=differences,
        rows=table.astype(object).where(table.notna(), None).to_dict("records"), counts=[(c.value, counts.get(c.value, 0)) for c in Change],
        figure=plots.compare_figure(table, factor, out),
        new_meta=dict(metadata_panel(new.metadata)), old_meta=dict(metadata_panel(old.metadata)),
        format_seconds=format_seconds,
    )
    atomic_write_text(out / "index.html", page)
    atomic_write_text(out / MARKER, _marker("compare", new, old_run_id=old.run_id))
    return out / "index.html"


def _created(entry: dict) -> datetime:
    """Sort key in UTC; a report without a readable date sorts last."""
    try:
        stamp = datetime.fromisoformat(entry.get("created") or "")
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def update_index(reports_dir: Path) -> Path:
    """Rewrite `reports_dir/index.html`: every report folder in it, newest first."""
    reports_dir = Path(reports_dir)
    entries = []
    for marker in sorted(reports_dir.glob(f"*/{MARKER}")):
        entry = json.loads(marker.read_text())
        if entry.get("kind") not in ("run", "compare"):
            continue  # a render that did not finish
        entries.append({**entry, "href": f"{marker.parent.name}/index.html",
                        "folder": marker.parent.name})
    entries.sort(key=_created, reverse=True)
    page = _TEMPLATES.get_template("index.html.j2").render(
        runs=[e for e in entries if e["kind"] == "run"],
        compares=[e for e in entries if e["kind"] == "compare"],
    )
    atomic_write_text(reports_dir / "index.html", page)
    return reports_dir / "index.html"

