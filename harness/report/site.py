"""Writes report folders: a run's page, a run-vs-run page, the history page, and the index
of all reports.

A report folder is self-contained and opens from disk: `index.html`, the PNG figures
next to it, copies of small traces and the flamegraph, and `report.json` (what the
folder holds, read back by the index, any chart's layout problems, and the list of files
the report wrote). Each page is drawn in a staging folder and moved in when complete
(`harness.report.folder`): rendering again removes only the files the earlier report
listed. The index is rewritten only when it carries INDEX_GENERATOR's meta tag (this
module wrote it). Nothing here measures; everything comes from the runs' files.

A run's page opens with the summary table (one `Headline` per finding) and the run's
metadata in a line; each finding's section with its answer chart and verdicts, the
rest folded into `<details>` blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import pandas as pd

from harness.measure.decision import DEFAULT_MARGIN
from harness.exits import Nonsense
from harness.report import plots, sense
from harness.report.compare import (
    Change, check_comparable, compare_headlines, compare_runs,
)
from harness.report.data import (
    COUNTERS, ReportError, counters_at, finding_phases, finding_text, format_date, has_bandwidth,
    metadata_line,
    metadata_panel, param_columns, phase_breakdowns, run_headlines, run_sampling_line, sentences,
    status_banner, table_rows,
)
from harness.report.folder import MARKER, is_staging, staged
from harness.report.headline import Headline, estimate, estimate_fields
from harness.report.reliability import reliability, without_placebo
from harness.report.changepoints import MIN_SIZE, PENALTY_BETA
from harness.report.history import MACHINE_FIELDS, History
from harness.report.summary import verdict_word
from harness.report.verdicts import level_label, present
from harness.results import Run, atomic_write_text
from harness.report.summary import format_seconds

#: marks an index page this module wrote, and so may rewrite
INDEX_GENERATOR = "esper-bench harness.report index"
INDEX_TAG = f'<meta name="generator" content="{INDEX_GENERATOR}">'
#: what every index written before INDEX_TAG existed holds: those are ours too
LEGACY_INDEX = ("<title>esper-bench reports</title>",
                "Rendered by <code>python -m harness.report</code>")
#: the most variants compared in grouped bars; more read better as a heat map or table
BAR_VARIANTS = 3
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


def _answer_figure(finding_id: str, rows: pd.DataFrame, text, variants: list[str],
                   out: Path) -> plots.Figure | None:
    """The one chart that carries a finding's answer: speed-up bars with their intervals
    for a few variants (BAR_VARIANTS) over few enough cases (MAX_BARS), else the
    case x variant heat map."""
    compared = rows[rows["ratio"].notna()] if "ratio" in rows else rows.iloc[0:0]
    bars = compared["variant"].nunique() * compared["case"].nunique()
    if bars <= plots.MAX_BARS and compared["variant"].nunique() <= BAR_VARIANTS:
        return plots.speedup_figure(finding_id, rows, text.baseline, variants,
                                    text.claim_factor, out)
    return plots.speedup_heatmap(finding_id, rows, text.baseline, variants, out)


def _finding_section(run: Run, finding_id: str, headline: Headline, out: Path) -> dict:
    """What a finding's section shows: its answer chart and verdicts first, the rest in
    collapsed blocks (the full table, crossovers, scaling charts, counters, the trace)."""
    every_row = run.summary[run.summary["finding"] == finding_id]
    text = finding_text(finding_id, every_row, run.metadata)
    rows = without_placebo(every_row)  # the charts: the finding's own variants
    variants = list(dict.fromkeys(rows["variant"]))
    verdicts, every = sentences(every_row, text, headline.case)
    phases, answer = [], None
    declared = finding_phases(run.metadata, finding_id)
    for index, breakdown in enumerate(phase_breakdowns(rows, text.baseline, declared)):
        phases.append({"breakdown": breakdown,
                       "figure": plots.phases_figure(finding_id, breakdown, out, index)})
    if phases:  # the breakdown at the headline case carries the answer; the others go below
        phases.sort(key=lambda item: (item["breakdown"].case != headline.where,
                                      item["breakdown"].variant != headline.variant))
    else:
        answer = _answer_figure(finding_id, rows, text, variants, out)
    figures, crossovers = [], []
    for param in param_columns(rows):
        drawn = plots.scaling_figure(finding_id, rows, param, variants, out)
        if drawn is not None:
            figures.append(drawn[0])
            crossovers += drawn[1]
    counted = (rows["case"].nunique() * len(variants) <= plots.MAX_BARS
               and len(variants) <= BAR_VARIANTS + 1)
    trace = run.folder / "traces" / f"{finding_id}.json.gz"
    return {
        "text": text, "headline": headline, "answer": answer, "verdicts": verdicts,
        "sentences": every, "figures": figures, "crossovers": crossovers,
        "table": table_rows(every_row), "phases": phases,
        "level": level_label(every_row["ci_level"] if "ci_level" in every_row else []), "bandwidth": has_bandwidth(rows),
        "counters_figure": plots.counters_figure(finding_id, rows, variants, out)
        if counted else None,
        "counters_at": counters_at(rows, headline.case),
        "estimates": estimates_at(rows, headline.case),
        "trace": attach(trace, out, "traces") if trace.is_file() else None,
    }


def estimates_at(rows, case: str | None) -> dict:
    """Every estimate with an interval the rows carry (stability counts, learning
    outcomes, per-phase savings) at the headline `case`: {"variants": [...], "fields":
    [(field, {variant: 'value [low, high]'})]}; empty fields when there are none."""
    at = rows[rows["case"] == case] if case is not None else rows.iloc[0:0]
    variants = list(dict.fromkeys(at["variant"]))
    fields = []
    for name in estimate_fields(at):
        texts = {}
        for row in at.to_dict("records"):
            found = estimate(row, name)
            texts[row["variant"]] = found.text() if found is not None else "-"
        fields.append((name.replace("_", " "), texts))
    return {"variants": variants, "fields": fields}


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
    refuse_nonsense(run)
    with staged(out, protect=[run.folder]) as stage:
        headlines = run_headlines(run)
        sections = [_finding_section(run, h.finding, h, stage) for h in headlines]
        page = _TEMPLATES.get_template("run.html.j2").render(
            run_id=run.run_id, metadata=metadata_panel(run.metadata), meta=run.metadata,
            meta_line=metadata_line(run.metadata), banner=status_banner(run.metadata),
            sampling=run_sampling_line(run), trust=reliability(run.summary),
            headlines=headlines, sections=sections,
            flame=_flamegraph(run, stage),
            format_seconds=format_seconds, counters=COUNTERS,
        )
        atomic_write_text(stage / "index.html", page)
        atomic_write_text(stage / MARKER,
                          _marker("run", run, layout_problems=_layout_problems(sections)))
    return out / "index.html"


def refuse_nonsense(run: Run) -> None:
    """`harness.exits.Nonsense` (exit 3) when a number of `run` makes no sense
    (`harness.report.sense`): a report never prints one."""
    found = sense.problems(run.summary)
    if found:
        raise Nonsense(f"report of {run.run_id}", found)


def _layout_problems(sections: list[dict]) -> list[str]:
    """'file: problem' for every chart of the page that `plots.layout_problems` faulted."""
    figures = []
    for s in sections:
        figures += [s["answer"], s["counters_figure"], *s["figures"],
                    *(item["figure"] for item in s["phases"])]
    return [f"{f.file}: {problem}" for f in figures if f is not None for problem in f.problems]


def render_compare(new: Run, old: Run, out: Path, *, force: bool = False,
                   margin: float = DEFAULT_MARGIN) -> Path:
    """Write the new-vs-old report into `out`; ReportError if fingerprints differ unless forced."""
    refuse_nonsense(new)
    refuse_nonsense(old)
    comparability = check_comparable(new, old, force)
    table = compare_runs(new, old, margin=margin, force=force)
    out = Path(out)
    counts = table["change"].value_counts().to_dict()
    with staged(out, protect=[new.folder, old.folder]) as stage:
        page = _TEMPLATES.get_template("compare.html.j2").render(
            new=new, old=old, margin=margin, comparability=comparability,
            headlines=compare_headlines(new, old, table),
            banners=[(label, status_banner(r.metadata)) for label, r in (("new", new),
                                                                          ("old", old))
                     if status_banner(r.metadata)],
            rows=table.astype(object).where(table.notna(), None).to_dict("records"),
            counts=[(c.value, counts.get(c.value, 0)) for c in Change],
            figure=plots.compare_figure(table, margin, stage),
            new_meta=dict(metadata_panel(new.metadata)),
            old_meta=dict(metadata_panel(old.metadata)),
            format_seconds=format_seconds,
        )
        atomic_write_text(stage / "index.html", page)
        atomic_write_text(stage / MARKER, _marker("compare", new, old_run_id=old.run_id))
    return out / "index.html"


def render_history(history: History, out: Path, results_dir: Path) -> Path:
    """Write the history page of `history` into `out`; returns its page."""
    out = Path(out)
    with staged(out, protect=[results_dir]) as stage:
        _draw_history(history, stage, results_dir)
    return out / "index.html"


def _draw_history(history: History, out: Path, results_dir: Path) -> None:
    points = history.points
    findings = []
    for finding in dict.fromkeys(points["finding"]):
        rows = points[points["finding"] == finding]
        baseline = next(iter(rows.loc[rows["baseline"], "variant"]), "baseline")
        newest = rows[rows["order"] == rows["order"].max()]
        variant = history.headline_variants.get(finding)
        head = newest[newest["variant"] == variant].to_dict("records")
        findings.append({
            "id": finding, "where": rows["where"].iloc[0], "baseline": baseline,
            "variants": ", ".join(dict.fromkeys(rows["variant"])),
            "runs": rows["run_id"].nunique(),
            "steps": sum(c.finding == finding for c in history.changes),
            "changes": [c for c in history.changes if c.finding == finding],
            "newest": _speedup_text(head[0]) if head else "-",
            "figure": plots.history_figure(finding, points, [m.number for m in history.machines],
                                           baseline, out),
            "points": [{**p, "speedup": _speedup_text(p),
                        "steps": ", ".join(name for name, hit in (("speed-up", p["ratio_step"]),
                                                                  ("time", p["time_step"])) if hit)}
                       for p in rows.astype(object).where(rows.notna(), None).to_dict("records")],
        })
    rendered = datetime.now(timezone.utc).isoformat(timespec="seconds")
    page = _TEMPLATES.get_template("history.html.j2").render(
        runs=history.runs, machines=history.machines, skipped=history.skipped,
        findings=findings, results=str(results_dir), rendered=format_date(rendered),
        min_runs=MIN_SIZE, beta=PENALTY_BETA,
        machine_fields=MACHINE_FIELDS, format_seconds=format_seconds,
    )
    atomic_write_text(out / "index.html", page)
    atomic_write_text(out / MARKER, json.dumps({"kind": "history", "runs": len(history.runs),
                                                "created": rendered}, indent=1))


def _speedup_text(point: dict) -> str:
    """'scan 11.8x [11.2-13.9]' style speed-up of a history point, or its verdict."""
    if point.get("ratio") is None or not present(point.get("ratio")):
        return f"{point['variant']}: {verdict_word(point)}"
    return (f"{point['variant']} {1 / point['ratio']:.3g}x "
            f"[{1 / point['ci_high']:.3g}-{1 / point['ci_low']:.3g}]")


def _created(entry: dict) -> datetime:
    """Sort key in UTC; a report without a readable date sorts last."""
    try:
        stamp = datetime.fromisoformat(entry.get("created") or "")
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def check_index(reports_dir: Path) -> None:
    """ReportError (exit 2) when `reports_dir/index.html` exists but this module did not
    write it (it lacks the INDEX_GENERATOR meta tag): that page is someone else's."""
    index = Path(reports_dir) / "index.html"
    if not index.exists() and not index.is_symlink():
        return
    text = index.read_bytes().decode("utf-8", errors="replace") if index.is_file() else ""
    if INDEX_TAG not in text and not all(mark in text for mark in LEGACY_INDEX):
        raise ReportError(
            f"--out: expected a folder whose parent holds no index.html or one written by "
            f"harness.report; got {index}, which harness.report did not write (no {INDEX_TAG}). "
            "Choose another --out, or move that file away."
        )


def update_index(reports_dir: Path) -> Path:
    """Rewrite `reports_dir/index.html`: every report folder in it, newest first, and a
    link to the history page when there is one. Refuses an index it did not write."""
    reports_dir = Path(reports_dir)
    check_index(reports_dir)
    entries = []
    for marker in sorted(reports_dir.glob(f"*/{MARKER}")):
        if is_staging(marker.parent):
            continue  # a render in progress
        try:
            entry = json.loads(marker.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            print(f"{marker}: not listed in {reports_dir / 'index.html'}: expected a report's "
                  f"JSON marker; got a file that cannot be read as one ({err})", file=sys.stderr)
            continue
        if not isinstance(entry, dict) or entry.get("kind") not in ("run", "compare", "history"):
            continue  # a render that did not finish, or not a report
        entries.append({**entry, "href": f"{marker.parent.name}/index.html",
                        "folder": marker.parent.name})
    entries.sort(key=_created, reverse=True)
    histories = [e for e in entries if e["kind"] == "history"]
    page = _TEMPLATES.get_template("index.html.j2").render(
        runs=[e for e in entries if e["kind"] == "run"],
        compares=[e for e in entries if e["kind"] == "compare"],
        history={**histories[0], "rendered": format_date(histories[0].get("created"))}
        if histories else None,
        generator=INDEX_GENERATOR,
    )
    atomic_write_text(reports_dir / "index.html", page)
    return reports_dir / "index.html"

