"""harness.report at a glance: the summary table, the headline case, charts that read at the
default run's size, unfinished runs, bad paths, --markdown, the history page, and the pages
opened in a real (headless) browser.

One real quick run of B4-CR-03 and B4-DRL-03 (a tiny time budget) feeds the tests; the
history gets copies of it whose metadata say other commits and another machine, those of
the later commit with scan's times ten times longer (a planted change of level). Charts at the default run's size are drawn
from rows shaped like it (every default case and variant), since a default run takes
minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from harness import findings as registry
from harness.report import plots
from harness.report.cli import main as report_main
from harness.report.data import run_headlines, status_banner
from harness.report.headline import headline, headline_case
from harness.report.history import bisect_command, build_history
from harness.report.markdown import cell
from harness.results import load_run
from harness.run import main as run_main

REPO = Path(__file__).resolve().parents[3]
FINDINGS = ["B4-CR-03", "B4-DRL-03"]
RUN_ARGS = ["--quick", "--findings", *FINDINGS, "--budget", "1", "--every-cell", "--device", "cpu",
            "--threads", "1"]
VIEWPORT = (1400, 900)


class Page(HTMLParser):
    """A page's images and tables, each with the section it is in and whether it sits in a
    <details> block; the summary table's cells as text."""

    def __init__(self) -> None:
        super().__init__()
        self.images, self.tables, self.links = [], [], []
        self.summary: list[list[str]] = []
        self._stack, self._section, self._cell = [], None, None
        self._in_summary = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        details = "details" in self._stack
        if tag == "section":
            self._section = attrs.get("id")
        if tag == "img":
            self.images.append((attrs["src"], self._section, details))
        if tag == "a":
            self.links.append(attrs.get("href"))
        if tag == "table":
            self.tables.append((attrs.get("id"), self._section, details))
            self._in_summary = attrs.get("id") == "summary"
        if self._in_summary and tag == "tr":
            self.summary.append([])
        if self._in_summary and tag in ("td", "th"):
            self._cell = ""
        if tag == "br" and self._cell is not None:
            self._cell += " "
        if tag not in ("img", "meta", "br"):
            self._stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("img", "meta", "br"):
            return
        self._stack.pop()
        if tag in ("td", "th") and self._cell is not None:
            self.summary[-1].append(" ".join(self._cell.split()))
            self._cell = None
        if tag == "table":
            self._in_summary = False
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def parse(page: Path) -> Page:
    parsed = Page()
    parsed.feed(page.read_text())
    return parsed


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    return struct.unpack(">II", path.read_bytes()[16:24])


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict:
    """A real quick run of B4-CR-03 and B4-DRL-03; harness.run renders its report."""
    base = tmp_path_factory.mktemp("screen")
    assert run_main([*RUN_ARGS, "--out", str(base / "results"),
                     "--reports", str(base / "reports")]) == 0
    folder = next(p for p in (base / "results").iterdir() if (p / "run.json").is_file())
    return {"base": base, "run": folder, "page": base / "reports" / folder.name / "index.html"}


def copy_run(source: Path, results: Path, name: str, metadata: dict, row=None) -> Path:
    """Copy a run folder to `results/name` with `metadata` changed in its run.json, and each
    summary and sample row through `row(kind, row) -> row or None (dropped)`, kind
    'summary' or 'samples', wherever the run keeps rows (run.json, a cell journal)."""
    target = results / name
    shutil.copytree(source, target)
    keep = row or (lambda kind, r: r)

    def rows(kind: str, items: list[dict]) -> list[dict]:
        return [r for r in (keep(kind, dict(item)) for item in items) if r is not None]

    document = json.loads((target / "run.json").read_text())
    document.update(run_id=name, **metadata)
    document["summary"], document["rows"] = rows("summary", document["summary"]), \
        rows("samples", document["rows"])
    (target / "run.json").write_text(json.dumps(document))
    for path in sorted((target / "cells").glob("*.json")):  # a journal of cells, if any
        journal = json.loads(path.read_text())
        journal["summary"] = rows("summary", journal["summary"])
        journal["samples"] = rows("samples", journal["samples"])
        if journal["summary"]:
            path.write_text(json.dumps(journal))
        else:
            path.unlink()
    return target


# --- the summary first --------------------------------------------------------------------


@pytest.mark.integration
def test_the_page_opens_with_one_summary_row_per_finding(quick):
    page = parse(quick["page"])
    assert page.tables[0] == ("summary", None, False)  # the first table on the page
    header, *rows = page.summary
    assert header == ["finding", "claim", "headline case", "verdict (interval)",
                      "counter that changed most"]
    headlines = run_headlines(load_run(quick["run"]))
    assert [r[0] for r in rows] == FINDINGS == [h.finding for h in headlines]
    for row, h in zip(rows, headlines):  # the cells are the shared headline's words
        assert row[2:] == [h.where, h.verdict_text(), h.counter_text()]
    gae, reset = rows
    assert gae[2] == "4 envs x 25 steps (dones=episode)"  # the trainer's default size
    # the ticket's fix, after the noise floor's warning where the placebo missed
    assert re.search(r"(^|; )batched ", gae[3]) and "; ticket said ~4x" in gae[3]
    assert gae[4].startswith("host syncs ") and gae[4].endswith("\u2192 0")  # the loop syncs
    assert re.search(r"(^|; )mask ", reset[3])  # the ticket's option 3
    assert f"#{FINDINGS[0]}" in page.links


@pytest.mark.integration
def test_each_section_opens_with_its_answer_chart_and_keeps_the_detail_folded(quick):
    page = parse(quick["page"])
    first = {}
    for src, section, folded in page.images:
        first.setdefault(section, (src, folded))
    # B4-CR-03 compares 8 variants: a heat map, not hundreds of bars
    assert first["B4-CR-03"] == ("B4-CR-03-speedup-map.png", False)
    assert first["B4-DRL-03"] == ("B4-DRL-03-speedup.png", False)
    assert "B4-CR-03-speedup.png" not in [src for src, _, _ in page.images]
    for src, section, folded in page.images:
        if section and not src.startswith(section + "-speedup"):
            assert folded, f"{src} is not in a <details> block"
    for table_id, section, folded in page.tables:
        if section:  # the full table, crossovers and counters
            assert folded, f"a table of {section} is not in a <details> block"
    # every chart on the page reads: no overlapping labels, legend over data, ...
    marker = json.loads((quick["page"].parent / "report.json").read_text())
    assert marker["layout_problems"] == []


# --- the headline, from hand-made rows ----------------------------------------------------


def gae_rows(cases: dict[str, dict], variants: dict[str, dict]) -> pd.DataFrame:
    """Summary rows: `cases` label -> params, `variants` name -> cells (same at every case)."""
    rows = []
    for case, params in cases.items():
        for variant, cells in variants.items():
            rows.append({"finding": "B4-CR-03", "case": case, **params, "variant": variant,
                         "baseline": variant == "loop", "status": "ok", **cells})
    return pd.DataFrame(rows)


LOOP = {"verdict": "baseline", "median_s": 2e-3, "host_syncs": 204, "allocations": 717}
SCAN = {"verdict": "faster", "ratio": 1 / 11.8, "ci_low": 1 / 13.9, "ci_high": 1 / 11.2,
        "median_s": 2e-3 / 11.8, "host_syncs": 0, "allocations": 49}
NUMBA = {"verdict": "faster", "ratio": 1 / 90, "ci_low": 1 / 95, "ci_high": 1 / 85,
         "median_s": 2e-3 / 90, "host_syncs": 0, "allocations": 12}
CASES = {"num_envs=1,max_steps=25": {"p_num_envs": 1, "p_max_steps": 25},
         "num_envs=1024,max_steps=1024": {"p_num_envs": 1024, "p_max_steps": 1024},
         "num_envs=4,max_steps=25": {"p_num_envs": 4, "p_max_steps": 25},
         "num_envs=4,max_steps=25,dones=random": {"p_num_envs": 4, "p_max_steps": 25}}


def test_the_headline_is_the_claims_proposal_at_the_case_the_run_marked():
    rows = gae_rows(CASES, {"loop": LOOP, "batched": {**SCAN, "ratio": 1 / 8.5},
                            "scan": SCAN, "numba": NUMBA})
    h = headline("B4-CR-03", rows, claim="could be ~4x faster", baseline="loop",
                 claim_factor=4.0, proposed="scan")
    # an older run (no `headline` rows): the case nearest 4 envs x 25 steps
    assert h.case == "num_envs=4,max_steps=25"  # distance 0, and first of the two such
    assert h.variant == "scan"  # the finding's `proposed`
    marked = rows.assign(headline=rows["case"] == "num_envs=1,max_steps=25")
    assert headline("B4-CR-03", marked, claim="", baseline="loop").case == \
        "num_envs=1,max_steps=25"  # the run's own mark wins
    # without a proposal, the fastest variant heads it
    assert headline("B4-CR-03", rows, claim="", baseline="loop").variant == "numba"
    assert h.verdict_text() == ("scan 11.8x faster [11.2-13.9] (-1.83 ms a call); ticket said "
                                "~4x; fastest: numba 90x")
    # host syncs moved most (205x, counting from 1); allocations 14.4x
    assert h.counter_text() == "host syncs 204 \u2192 0"
    assert h.counters_text() == "host syncs 204 \u2192 0, allocations 717 \u2192 49"


def test_a_word_the_thread_count_flips_is_said_and_a_loaded_one_thread_timing_shares_the_blame():
    """Where the word at one thread differs from the run's, the headline says so; where
    other processes kept every core busy while it was timed at one thread, that load is
    named beside the thread count as what may decide it."""
    alone = {"one_thread_verdict": "slower", "one_thread_ratio": 1.3,
             "one_thread_ci_low": 1.2, "one_thread_ci_high": 1.4}
    rows = gae_rows(CASES, {"loop": LOOP, "scan": {**SCAN, **alone}})
    text = headline("B4-CR-03", rows, claim="", baseline="loop").threads_text()
    assert text == ("at 1 thread: slower 1.3 [1.2-1.4], where the run's threads read faster: "
                    "the thread count decides this word")
    loaded = gae_rows(CASES, {"loop": LOOP, "scan": {**SCAN, **alone,
                                                     "one_thread_beside_load": True}})
    assert headline("B4-CR-03", loaded, claim="", baseline="loop").threads_text().endswith(
        "read faster: timed while other processes kept every core busy: the thread count or "
        "that load decides this word")
    same = gae_rows(CASES, {"loop": LOOP, "scan": {**SCAN, **alone, "one_thread_verdict":
                                                   "faster", "one_thread_beside_load": True}})
    assert headline("B4-CR-03", same, claim="", baseline="loop").threads_text() == ""


def test_the_headline_case_needs_a_timed_baseline_and_broken_variants_are_named():
    rows = gae_rows(CASES, {"loop": LOOP, "scan": SCAN})
    untimed = rows.copy()
    at_default = untimed["case"].str.startswith("num_envs=4,")
    untimed.loc[at_default & (untimed["variant"] == "loop"), "median_s"] = np.nan
    assert headline_case(untimed, "loop") == "num_envs=1,max_steps=25"
    broken = pd.concat([rows, pd.DataFrame([{
        "finding": "B4-CR-03", "case": "num_envs=1,max_steps=25", "p_num_envs": 1,
        "p_max_steps": 25, "variant": "numba", "status": "failed", "verdict": "failed",
        "error": "boom"}])])
    h = headline("B4-CR-03", broken, claim="", baseline="loop")
    assert h.verdict_text() == ("scan 11.8x faster [11.2-13.9] (-1.83 ms a call); 1 variant "
                                "failed or disagreed (numba)")


PLACEBO = {"verdict": "same", "ratio": 1.01, "ci_low": 0.98, "ci_high": 1.04, "median_s": 2e-3,
           "placebo": True}


@pytest.mark.parametrize(("floor", "said"), [
    ({}, ""),
    ({"verdict": "slower", "ratio": 1.15, "ci_low": 1.12, "ci_high": 1.18},
     "noise floor failed: placebo slower, 1.15 [1.12-1.18]; "),
    ({"verdict": "faster", "ratio": 0.9, "ci_low": 0.85, "ci_high": 0.95},
     "noise floor failed: placebo faster, 0.9 [0.85-0.95]; "),
    ({"verdict": "inconclusive", "ratio": 1.02, "ci_low": 0.99, "ci_high": 1.06},
     "noise floor not shown: placebo inconclusive, 1.02 "
     "[0.99-1.06]; "),
])
def test_a_failed_noise_floor_is_said_first(floor, said):
    """The headline cell's placebo (the baseline against itself) reads same, or the
    verdict opens by saying it did not (the first screen and the README's row)."""
    rows = gae_rows(CASES, {"loop": LOOP, "scan": SCAN, "placebo": {**PLACEBO, **floor}})
    h = headline("B4-CR-03", rows, claim="", baseline="loop", proposed="scan")
    assert h.verdict_text() == said + "scan 11.8x faster [11.2-13.9] (-1.83 ms a call)"


def test_each_ratio_has_its_size_per_call_and_per_iteration():
    """(ratio - 1) x the baseline's median a call; with `per_iteration`, times the calls
    per iteration and as a share of the iteration's baseline time."""
    rows = gae_rows(CASES, {"loop": LOOP, "scan": SCAN})
    per_step = headline("B4-CR-03", rows, claim="", baseline="loop",
                        per_iteration=(25.0, "E2E-iteration"), iteration_s=0.5)
    assert per_step.size_text() == ("-1.83 ms a call, -45.8 ms an iteration (25 calls), "
                                    "-9.2% of an iteration")
    itself = headline("E2E-iteration", rows, claim="", baseline="loop",
                      per_iteration=(1.0, "E2E-iteration"), iteration_s=2e-3)
    assert itself.size_text() == "-1.83 ms a call, -92% of an iteration"
    slower = gae_rows(CASES, {"loop": LOOP, "scan": {**SCAN, "verdict": "slower", "ratio": 1.5,
                                                     "ci_low": 1.4, "ci_high": 1.6}})
    assert headline("X", slower, claim="", baseline="loop").size_text() == "+1 ms a call"
    unmeasured = gae_rows(CASES, {"loop": {**LOOP, "median_s": np.nan}, "scan": SCAN})
    assert headline("X", unmeasured, claim="", baseline="loop").size_text() == ""


def test_the_fastest_of_ours_is_set_against_the_review_s_fix():
    rows = gae_rows(CASES, {"loop": LOOP, "scan": SCAN, "numba": NUMBA})
    h = headline("B4-CR-03", rows, claim="", baseline="loop", proposed="scan", ours=("numba",))
    assert h.verdict_text().endswith("; fastest: numba 90x (ours; 7.63x scan)")


def test_the_iteration_share_reads_the_iteration_finding_s_baseline_in_the_same_run():
    from harness.report.data import finding_headline

    rows = gae_rows(CASES, {"loop": LOOP, "scan": SCAN})
    iteration = pd.DataFrame([{"finding": "E2E-iteration", "case": "num_envs=4,max_steps=25",
                               "p_num_envs": 4, "p_max_steps": 25, "variant": "original",
                               "baseline": True, "status": "ok", "verdict": "baseline",
                               "median_s": 0.5, "headline": True}])
    metadata = {"finding_info": {
        "B4-CR-03": {"baseline": "loop", "proposed": "scan", "per_iteration": [1, "E2E-iteration"]},
        "E2E-iteration": {"baseline": "original"}}}
    h = finding_headline("B4-CR-03", rows, metadata, pd.concat([rows, iteration]))
    assert (h.iteration_s, h.per_iteration) == (0.5, (1.0, "E2E-iteration"))
    assert h.size_text() == ("-1.83 ms a call, -1.83 ms an iteration (1 call), -0.37% of an "
                             "iteration")
    assert finding_headline("B4-CR-03", rows, metadata).iteration_s is None  # no run summary


def test_a_finding_that_is_not_one_axis_headlines_its_only_or_fastest_variant():
    one = gae_rows(CASES, {"loop": LOOP, "mine": {**SCAN, "verdict": "no_difference",
                                                  "ratio": 1.02, "ci_low": 0.97,
                                                  "ci_high": 1.08}})
    h = headline("X", one, claim="", baseline="loop")
    assert h.verdict_text() == ("mine: no measurable difference: time ratio 1.02 [0.97-1.08] "
                                "(interval from unpaired samples, older run) (+40 us a call)")
    two = gae_rows(CASES, {"loop": LOOP, "slow": SCAN, "fast": NUMBA})
    assert headline("X", two, claim="", baseline="loop").variant == "fast"
    cuda = gae_rows(CASES, {"loop": LOOP, "gpu": {"verdict": "needs_cuda", "status":
                                                  "needs_cuda", "reason": "needs CUDA"}})
    assert headline("X", cuda, claim="", baseline="loop").verdict_text() == \
        "gpu: needs CUDA, not measured on this machine"


# --- charts that read at the default run's size -------------------------------------------


def default_size_rows() -> pd.DataFrame:
    """B4-CR-03 rows shaped like a default run's: every default case and variant, the loop
    skipped where the registry skips it, times that grow with the size."""
    finding = registry.select(["B4-CR-03"])[0]
    rng = np.random.default_rng(0)
    rows = []
    for case in finding.cases(False):
        size = case["num_envs"] * case["max_steps"]
        timed = {}
        for k, variant in enumerate(finding.variants):
            skip = finding.skip(variant, case, torch.device("cpu"))
            cells = {"status": "not_timed", "verdict": "not_timed", "reason": skip} if skip \
                else {"status": "ok", "median_s": 4e-5 * size if variant == "loop"
                      else 2e-5 * (1 + k) * (1 + size / 2e4) * rng.uniform(0.8, 1.2)}
            if not skip:
                timed[variant] = cells["median_s"]
            rows.append({"finding": finding.id, "case": case.label,
                         **{f"p_{key}": value for key, value in case.params},
                         "variant": variant, "baseline": variant == "loop", **cells,
                         "host_syncs": 2 * size if variant == "loop" else 0})
        reference = "loop" if "loop" in timed else next(iter(timed))
        for row in rows[-len(finding.variants):]:
            if row["variant"] == reference:
                row["verdict"] = "baseline"
            elif row["variant"] in timed:
                ratio = timed[row["variant"]] / timed[reference]
                row.update(ratio=ratio, ci_low=ratio * 0.95, ci_high=ratio * 1.05,
                           compared_to=reference,
                           verdict="faster" if ratio < 0.95 else "slower" if ratio > 1.05
                           else "no_difference")
    return pd.DataFrame(rows)


@pytest.mark.slow  # four charts of 27 cases drawn: 4 s
def test_charts_read_at_the_default_runs_size(tmp_path):
    rows = default_size_rows()
    variants = list(dict.fromkeys(rows["variant"]))
    assert rows["case"].nunique() == 27
    heat = plots.speedup_heatmap("B4-CR-03", rows, "loop", variants, tmp_path)
    assert heat.problems == ()
    for param in ("p_num_envs", "p_max_steps"):
        figure, crossovers = plots.scaling_figure("B4-CR-03", rows, param, variants, tmp_path)
        assert figure.problems == ()
    assert png_size(tmp_path / heat.file)[0] <= plots.MAX_WIDTH_PX
    # the check bites: the bar chart the report used to draw here is unreadable
    bars = plots.speedup_figure("B4-CR-03", rows, "loop", variants, 4.0, tmp_path)
    assert any("x tick labels overlap" in p for p in bars.problems)


# --- runs that did not finish -------------------------------------------------------------


@pytest.mark.integration
def test_an_interrupted_run_is_rendered_with_a_banner_and_its_partial_findings(quick, tmp_path,
                                                                               capsys):
    kept_cases = ["num_envs=16,max_steps=25,dones=episode",
                  "num_envs=16,max_steps=150,dones=episode"]

    last_case = load_run(quick["run"]).summary["case"].iloc[-1]  # B4-DRL-03's last case

    def partial(kind, row):
        """B4-CR-03 at two of its cases; B4-DRL-03 only its baseline at one case."""
        if row["finding"] == "B4-CR-03" and row["case"] in kept_cases:
            return row
        if row["finding"] == "B4-DRL-03" and row["variant"] == "clone" \
                and row["case"] == last_case:
            return row
        return None

    run = copy_run(quick["run"], tmp_path / "results", "stopped",
                   {"status": "interrupted", "cells_done": 3, "cells_total": 6}, partial)
    out = tmp_path / "reports" / "stopped"
    assert report_main([str(run), "--out", str(out), "--markdown"]) == 0
    markdown = capsys.readouterr().out
    banner = ("This run was interrupted after 3 of 6 cells; resume it with python -m "
              "harness.run --resume stopped.")
    text = (out / "index.html").read_text()
    assert banner in text and banner in markdown
    page = parse(out / "index.html")
    gae, reset = page.summary[1:]
    assert gae[2] == "16 envs x 25 steps (dones=episode) 2 of 4 cases"
    assert re.search(r"(^|; )batched ", gae[3])  # the ticket's fix
    assert reset[3] == "not compared: only clone has a row at 4 envs x 25 steps (dones=random0.05)"
    for src, _, _ in page.images:
        assert (out / src).stat().st_size > 0


@pytest.mark.parametrize(("metadata", "expected"), [
    ({"status": "killed", "run_id": "R", "cells_done": 7, "cells_total": 36},
     "This run was killed after 7 of 36 cells (its process died without finishing); resume "
     "it with python -m harness.run --resume R."),
    ({"status": "running", "run_id": "R", "cells_done": 7, "cells_total": 36},
     "This run is still running (7 of 36 cells so far), or its process stopped without saying so."),
    ({"status": "interrupted", "run_id": "R"},
     "This run was interrupted; resume it with python -m harness.run --resume R."),
    ({"run_id": "R"}, "This run has status None, not complete."),
])
def test_the_banner_says_how_far_a_run_got_and_how_to_resume_it(metadata, expected):
    assert status_banner(metadata).startswith(expected)
    assert status_banner({"status": "complete"}) is None


# --- bad paths and corrupt runs: exit 2, one line, nothing written ------------------------

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


@pytest.mark.parametrize(("option", "message"), [
    ("out-file", "--out: expected a folder; got {tmp}/a-file, a file"),
    ("out-proc", "--out: expected a writable location; got /proc/esper/r/index.html"),
    pytest.param("out-read-only", "--out: expected a writable location; got {tmp}/ro/r/index.html",
                 marks=pytest.mark.skipif(ROOT, reason="root writes into read-only folders; "
                                                        "the /proc case covers the probe")),
    ("results", "--results: expected a folder of runs; got {tmp}/none (no such folder)"),
    ("markdown", "--markdown: expected a writable location; got /proc/esper/s.md"),
    ("history-with-run", "--history: expected on its own (with --results and --out); got it "
                         "with RUN"),
])
@pytest.mark.integration
def test_bad_paths_exit_2_before_rendering(quick, tmp_path, capsys, option, message):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "ro").mkdir(mode=0o500)
    argv = {"out-file": ["--out", str(tmp_path / "a-file")],
            "out-proc": ["--out", "/proc/esper/r"],
            "out-read-only": ["--out", str(tmp_path / "ro" / "r")],
            "results": ["--results", str(tmp_path / "none"), "--out", str(tmp_path / "r")],
            "markdown": ["--out", str(tmp_path / "r"), "--markdown", "/proc/esper/s.md"],
            "history-with-run": ["--history"]}[option]
    before = sorted(tmp_path.rglob("*"))
    assert report_main([str(quick["run"]), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert message.format(tmp=tmp_path) in err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(("content", "message"), [
    (b"", "expected a JSON document; the file is empty"),
    (b'{"schema_version": 1, "summ', "it looks truncated"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"schema_version": 1, "status": "complete"}', "field 'run_id': expected a string"),
    (b'{"schema_version": 7, "summary": [], "rows": []}',
     "schema_version: expected one of 1, 2; got 7. It was written by a newer esper-bench"),
])
def test_a_corrupt_run_json_exits_2_naming_the_file(tmp_path, capsys, content, message):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_bytes(content)
    assert report_main([str(tmp_path / "bad"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "bad" / "run.json") in err and message in err
    assert not (tmp_path / "r").exists()


@pytest.mark.integration
def test_an_index_the_report_did_not_write_is_never_overwritten(quick, tmp_path, capsys):
    mine = "<html><body>my own index</body></html>"
    (tmp_path / "index.html").write_text(mine)
    assert report_main([str(quick["run"]), "--out", str(tmp_path / "r")]) == 2
    assert "which harness.report did not write" in capsys.readouterr().err
    assert (tmp_path / "index.html").read_text() == mine
    assert not (tmp_path / "r").exists()
    # an index written before the generator tag existed (its title and footer) is ours
    (tmp_path / "index.html").write_text(
        "<html><head><title>esper-bench reports</title></head><body><footer>Rendered by "
        "<code>python -m harness.report</code> from the runs' files</footer></body></html>")
    # an index the report wrote is rewritten: a second report is listed beside the first
    for name in ("one", "two"):
        assert report_main([str(quick["run"]), "--out", str(tmp_path / name)]) == 0
    assert {"one/index.html", "two/index.html"} <= set(parse(tmp_path / "index.html").links)
    assert '<meta name="generator" content="esper-bench harness.report index">' in \
        (tmp_path / "index.html").read_text()


def test_report_has_version_and_lists_its_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        report_main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "exit status:\n  0    report written" in text
    assert "  2    usage or input error" in text
    with pytest.raises(SystemExit) as done:
        report_main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("python -m harness.report ")


# --- markdown for CI ----------------------------------------------------------------------


@pytest.mark.integration
def test_markdown_summary_has_the_summary_tables_cells(quick, tmp_path, capsys):
    out = tmp_path / "reports" / "r"
    assert report_main([str(quick["run"]), "--out", str(out), "--markdown"]) == 0
    captured = capsys.readouterr()
    assert f"report: {out / 'index.html'}" in captured.err  # stdout is the markdown alone
    lines = captured.out.splitlines()
    html = parse(out / "index.html").summary[1:]
    rows = [line for line in lines if line.startswith("| B4-")]
    assert len(rows) == len(html) == len(FINDINGS)
    headlines = run_headlines(load_run(quick["run"]))
    for line, h, cells in zip(rows, headlines, html):
        assert line == (f"| {h.finding} | {cell(h.claim)} | {h.where} | {cell(h.verdict_text())} "
                        f"| {cell(h.counters_text())} |")
        assert cells[3] == h.verdict_text()  # the page shows the same verdict
    assert lines[-1] == f"HTML report: [{out / 'index.html'}]({out / 'index.html'})"
    written = tmp_path / "summary.md"
    assert report_main([str(quick["run"]), "--out", str(out), "--markdown", str(written)]) == 0
    assert written.read_text().splitlines()[:-1] == lines[:-1]
    assert written.read_text().splitlines()[-1] == \
        "HTML report: [reports/r/index.html](reports/r/index.html)"


@pytest.mark.integration
def test_markdown_of_a_comparison(quick, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert report_main([str(quick["run"]), "--compare", str(quick["run"]), "--out", str(out),
                        "--markdown"]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("| B4-CR-03 |"))
    finding, where, verdict, changed, counters = row.strip("| ").split(" | ")
    assert where == "4 envs x 25 steps (dones=episode)"
    # a run against itself: 1 exactly, and no decisive change (the run-to-run noise)
    number = r"[\d.]+(e[+-]\d+)?"  # a tiny quick run's interval may be wide: 8.82e-05
    assert re.fullmatch(rf"batched: new / old 1 \[{number}-{number}\], (same|inconclusive)",
                        verdict), verdict
    assert changed.startswith("no change of ") and counters == "unchanged"
    page = parse(out / "index.html")
    assert page.summary[1][1:] == [where, verdict, changed, counters]


# --- the history page ---------------------------------------------------------------------


def two_commits() -> tuple[str, str]:
    """Two commits of this repository with different commit times: (older, newer)."""
    try:
        log = subprocess.run(["git", "log", "--format=%H %ct", "-n", "50"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history here: the history page orders runs by commit time")
    commits = [line.split() for line in log if line.strip()]
    newer = commits[0]
    older = next((c for c in commits if c[1] != newer[1]), None)
    if older is None:
        pytest.skip("no two commits with different commit times in the last 50")
    return (older[0], newer[0]) if int(older[1]) < int(newer[1]) else (newer[0], older[0])


@pytest.fixture(scope="module")
def history(quick) -> dict:
    """Results holding the quick run as five runs on two commits and two machines (the
    later commit's runs with scan ten times slower: two runs on each side of the change,
    the fewest a change point needs) and a corrupt run; the history page."""
    base = quick["base"] / "history"
    results = base / "results"
    older, newer = two_commits()

    def scan_slower(factor):
        def row(kind, r):
            if r["variant"] != "batched":
                return r
            if kind == "samples":
                return {**r, "seconds": r["seconds"] * factor}
            if r.get("ratio") is not None:
                ratio = r["ratio"] * factor
                r.update(median_s=r["median_s"] * factor, ratio=ratio, ci_low=ratio * 0.95,
                         ci_high=ratio * 1.05)
            elif r.get("median_s") is not None:
                r.update(median_s=r["median_s"] * factor)
            return r
        return row

    def on(commit, created, **more):
        return {"git_commit": commit, "git_dirty": False, "created": created, **more}

    # created dates in the opposite order to the commits: the page must follow the commits
    copy_run(quick["run"], results, "run-older", on(older, "2030-01-05T00:00:00+00:00"),
             scan_slower(1.0))
    copy_run(quick["run"], results, "run-older-2", on(older, "2030-01-06T00:00:00+00:00"),
             scan_slower(1.0))
    copy_run(quick["run"], results, "run-newer", on(newer, "2030-01-01T00:00:00+00:00"),
             scan_slower(10.0))
    copy_run(quick["run"], results, "run-newer-2", on(newer, "2030-01-02T00:00:00+00:00"),
             scan_slower(10.0))
    copy_run(quick["run"], results, "run-other",
             on(newer, "2030-01-03T00:00:00+00:00", cpu_model="Some Other CPU"),
             scan_slower(1.0))
    (results / "broken").mkdir()
    (results / "broken" / "run.json").write_text('{"schema_version": 1, "summ')
    out = base / "reports" / "history"
    assert report_main(["--history", "--results", str(results), "--out", str(out)]) == 0
    return {"results": results, "page": out / "index.html", "reports": base / "reports",
            "commits": (older, newer)}


@pytest.mark.integration
def test_history_orders_runs_by_commit_separates_machines_and_finds_the_change_point(history):
    table = build_history(history["results"], repo=REPO)
    assert [r.run_id for r in table.runs] == ["run-older", "run-older-2", "run-newer",
                                              "run-newer-2", "run-other"]
    assert table.skipped[0].startswith("broken: ") and "truncated" in table.skipped[0]
    points = table.points
    machine = dict(zip(points["run_id"], points["machine"]))
    assert machine["run-older"] == machine["run-newer"] != machine["run-other"]
    scan = points[(points["finding"] == "B4-CR-03") & (points["variant"] == "batched")]
    assert scan["case"].unique().tolist() == ["num_envs=4,max_steps=25,dones=episode"]
    steps = scan.set_index("run_id")
    assert bool(steps.loc["run-newer", "ratio_step"]) and bool(steps.loc["run-newer", "time_step"])
    assert not steps.loc["run-newer-2", "ratio_step"]
    # the other machine is a series of its own, of one run: no change point
    assert not steps.loc["run-other", "ratio_step"] and not steps.loc["run-other", "time_step"]
    untouched = points[points["variant"] != "batched"]
    assert not untouched["ratio_step"].any() and not untouched["time_step"].any()
    older, newer = history["commits"]
    found = {(c.finding, c.variant, c.measure): c for c in table.changes}
    assert set(found) == {("B4-CR-03", "batched", "speed-up"), ("B4-CR-03", "batched", "median time")}
    speed = found["B4-CR-03", "batched", "speed-up"]
    assert (speed.before["run_id"], speed.after["run_id"]) == ("run-older-2", "run-newer")
    assert speed.commits() == f"{older[:8]}..{newer[:8]}"
    assert speed.point.size == pytest.approx(0.1) and speed.point.low <= 0.1 <= speed.point.high
    assert found["B4-CR-03", "batched", "median time"].point.size == pytest.approx(10.0)
    assert speed.command == (f"python -m harness.bisect --good {older[:12]} --bad {newer[:12]} "
                             "--findings B4-CR-03 --time --findings-module esper_review")
    text = history["page"].read_text()
    assert speed.command in text and speed.point.text() in text


@pytest.mark.integration
def test_history_page_is_linked_from_the_index(history):
    page = parse(history["page"])
    assert [src for src, _, _ in page.images] == [f"{f}-history.png" for f in FINDINGS]
    for src, _, _ in page.images:
        assert (history["page"].parent / src).stat().st_size > 0
    assert "history/index.html" in parse(history["reports"] / "index.html").links
    text = history["page"].read_text()
    assert "Some Other CPU" in text and "broken: " in text


def test_the_bisect_command_follows_the_counters_and_needs_two_commits():
    before = {"commit": "a" * 40, "dirty": False, "_counters": {"host_syncs": 0, "op_calls": 9}}
    after = {"commit": "b" * 40, "dirty": False, "_counters": {"host_syncs": 4, "op_calls": 17}}
    assert bisect_command("F", before, after, ["bench.findings"]) == (
        f"python -m harness.bisect --good {'a' * 12} --bad {'b' * 12} --findings F "
        "--counter host_syncs --findings-module bench.findings", "")
    assert bisect_command("F", before, {**before, "commit": "b" * 40}, [])[0].endswith("--time")
    assert bisect_command("F", before, {**after, "dirty": True}, [])[0] is None
    assert bisect_command("F", before, {**after, "commit": before["commit"]}, []) == (
        None, "both runs measured one commit: the change is not in the code")


def test_history_without_runs_exits_2(tmp_path, capsys):
    (tmp_path / "results").mkdir()
    assert report_main(["--history", "--results", str(tmp_path / "results"),
                        "--out", str(tmp_path / "h")]) == 2
    assert "expected run folders (each with a run.json)" in capsys.readouterr().err


# --- in a real browser --------------------------------------------------------------------


@pytest.mark.integration
def test_the_pages_in_a_real_browser(quick, history):
    """Headless Chromium opens the quick run's report, the history page and the committed
    example report of a default run from disk at 1400 x 900: every image loads (also those in closed <details>), the summary table ends
    within the first screen, nothing needs a horizontal scroll (details closed or open).
    Saves the first screen next to each page. Skipped, saying why, without chromium."""
    pytest.importorskip("websocket", reason="websocket-client is not installed (the dev extra)")
    from tests.browser import Chromium, chromium_path

    executable = chromium_path()
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    measure = """(() => {
      const table = document.getElementById('summary');
      const root = document.documentElement;
      return {images: Array.from(document.images).map(i => [i.getAttribute('src'), i.naturalWidth]),
              summaryBottom: table.getBoundingClientRect().bottom + window.scrollY,
              scrollWidth: root.scrollWidth, height: root.scrollHeight};
    })()"""
    started = time.perf_counter()
    example = REPO / "reports" / "example" / "index.html"  # a default run: every finding
    with Chromium(executable) as browser:
        for page in (quick["page"], history["page"], example):
            browser.open_page(page, *VIEWPORT)
            seen = browser.evaluate(measure)
            assert seen["images"] and all(width > 0 for _, width in seen["images"]), seen["images"]
            assert len(seen["images"]) == len(parse(page).images)
            assert seen["summaryBottom"] <= VIEWPORT[1], (page, seen)
            assert seen["scrollWidth"] <= VIEWPORT[0], seen
            if page != example:  # the committed example keeps its own picture
                shot = browser.screenshot(page.parent / "first-screen.png")
                assert png_size(shot) == VIEWPORT
            browser.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
            assert browser.evaluate("document.documentElement.scrollWidth") <= VIEWPORT[0]
            print(f"{page}: {seen['height']} px tall, summary ends at "
                  f"{seen['summaryBottom']:.0f} px")
    print(f"browser checks: {time.perf_counter() - started:.1f} s")
