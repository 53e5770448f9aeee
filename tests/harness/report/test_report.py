"""harness.report: HTML from real tiny runs, verdict sentences, plots, compare mode, index."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from harness import findings as registry
from harness.findings import Case, Finding
from harness.measure.flamegraph import record_flamegraph
from harness.report.plots import crossings, scaling_figure
from harness.report.cli import main as report_main
from harness.report.compare import Change, compare_runs
from harness.report.data import phase_breakdowns
from harness.report.site import COPY_LIMIT_BYTES, attach, render_run, update_index
from harness.results import Run, load_run
from harness.run import main as run_main
from harness.report.verdicts import case_phrase, verdict_sentence

FINDINGS = ["B4-DRL-03", "B4-PT-05"]
RUN_ARGS = ["--quick", "--findings", *FINDINGS, "--budget", "1", "--every-cell", "--device", "cpu",
            "--threads", "1"]


class Links(HTMLParser):
    """Every <img src>, <a href> and element id of a page; raises on unbalanced tags."""

    VOID = {"meta", "img", "br", "hr", "link", "input", "col"}  # HTML void elements used

    def __init__(self) -> None:
        super().__init__()
        self.images, self.hrefs, self.ids, self.open = [], [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "a":
            self.hrefs.append(attrs["href"])
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1:]}>"
        self.open.pop()


def parse(page: Path) -> Links:
    links = Links()
    links.feed(page.read_text())
    links.close()
    assert links.open == [], f"unclosed tags: {links.open}"
    return links


def assert_self_contained(page: Path) -> Links:
    """Every image exists and is non-empty; every link points at a file or an anchor."""
    links = parse(page)
    for src in links.images:
        assert (page.parent / src).stat().st_size > 0, src
    for href in links.hrefs:
        if href.startswith("#"):
            assert href[1:] in links.ids, href
        else:
            assert (page.parent / href).exists(), href
    return links


def finding_png(finding: str, kind: str) -> str:
    """The file name the plots give a finding's figure of one kind."""
    return f"{finding}-{kind}.png"


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict:
    """Two tiny real runs of B4-DRL-03 and B4-PT-05; the first renders its report itself,
    the second skips profiling (no counters, no traces)."""
    base = tmp_path_factory.mktemp("report")
    assert run_main([*RUN_ARGS, "--out", str(base / "a"), "--reports", str(base / "reports")]) == 0
    assert run_main([*RUN_ARGS, "--out", str(base / "b"), "--no-report", "--no-profile"]) == 0
    folders = {name: next(p for p in (base / name).iterdir() if p.is_dir()) for name in "ab"}
    return {"base": base, **folders}


# --- the report of one run ----------------------------------------------------------------


@pytest.mark.integration
def test_run_renders_its_report_and_the_index(runs):
    run_id = runs["a"].name
    page = runs["base"] / "reports" / run_id / "index.html"
    links = assert_self_contained(page)
    assert set(FINDINGS) <= links.ids
    assert {"flamegraph", "metadata", "sampling"} <= links.ids
    assert f"{finding_png('B4-DRL-03', 'speedup')}" in links.images
    text = page.read_text()
    assert re.search(r"sampling: \d+ timed cells?: \d+ ", text)
    assert re.search(r"noise floor: \d+ placebos? \(the baseline against a copy of itself\)", text)
    assert re.search(r"words: \d+ decisive of \d+", text)
    assert "zero_tensor.clone() inside loop" in text  # the ticket's claim
    assert "No flamegraph: the run was made without --pyspy" in text
    index = runs["base"] / "reports" / "index.html"
    assert f"{run_id}/index.html" in assert_self_contained(index).hrefs
    assert not (runs["base"] / "b" / "reports").exists()  # --no-report wrote nothing


@pytest.mark.integration
def test_report_cli_renders_a_run_by_id(runs, tmp_path, capsys):
    code = report_main([runs["b"].name, "--results", str(runs["b"].parent),
                        "--out", str(tmp_path / "r" / "b")])
    assert code == 0
    page = tmp_path / "r" / "b" / "index.html"
    assert str(page) in capsys.readouterr().out
    links = assert_self_contained(page)
    # B4-PT-05 has one case: a speed-up chart, no scaling plot
    assert finding_png("B4-PT-05", "speedup") in links.images
    assert not [src for src in links.images if "scaling" in src]
    # the table holds every summary row of the run
    summary = load_run(runs["b"]).summary
    assert page.read_text().count("(baseline)</td>") == int(summary["baseline"].sum())


@pytest.mark.integration
def test_rendering_again_replaces_the_report_but_not_other_files(runs, tmp_path):
    out = tmp_path / "again"
    assert report_main([str(runs["a"]), "--out", str(out)]) == 0
    written = json.loads((out / "report.json").read_text())["files"]
    assert "index.html" in written and any(f.endswith(".png") for f in written)
    (out / "mine.png").write_bytes(b"x")  # not the report's: kept
    assert report_main([str(runs["b"]), "--out", str(out)]) == 0
    assert (out / "mine.png").read_bytes() == b"x"
    now = json.loads((out / "report.json").read_text())["files"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                  if p.is_file()) == sorted([*now, "mine.png", "report.json"])
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    assert report_main([str(runs["a"]), "--out", str(other)]) == 2
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


@pytest.mark.integration
def test_report_out_empty_never_empties_the_current_folder(runs, tmp_path, monkeypatch, capsys):
    """The example that deleted a user's file: `--out ''` from a folder holding a
    report.json and a file of the user's."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "report.json").write_text(json.dumps({"kind": "run"}))
    (here / "thesis.tex").write_text("keep")
    monkeypatch.chdir(here)
    for out in ("", "."):
        assert report_main([str(runs["a"]), "--out", out]) == 2
        assert "the current folder, which is never emptied" in capsys.readouterr().err
    assert sorted(p.name for p in here.iterdir()) == ["report.json", "thesis.tex"]
    assert (here / "thesis.tex").read_text() == "keep"


@pytest.mark.integration
def test_a_corrupt_sibling_report_is_named_and_the_index_still_written(runs, tmp_path, capsys):
    reports = tmp_path / "reports"
    (reports / "broken").mkdir(parents=True)
    (reports / "broken" / "report.json").write_text("{not json")
    assert report_main([str(runs["a"]), "--out", str(reports / "fine")]) == 0
    assert f"{reports / 'broken' / 'report.json'}: not listed" in capsys.readouterr().err
    assert "fine/index.html" in (reports / "index.html").read_text()


@pytest.mark.integration
def test_report_module_runs_as_a_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.report", "no-such-run",
                           "--results", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error: RUN no-such-run: neither no-such-run nor")


# --- failures, mismatches and a scaling plot, from a tiny registered finding ---------------

TINY = "TEST-report"


@pytest.fixture
def tiny_run(tmp_path):
    """A real run of a finding whose variants agree, mismatch, raise, or scale worse."""

    def make_call(variant, x):
        return {"sum": lambda: x.sum(),
                "square": lambda: (x * x).sum() / (x * x).sum() * x.sum(),
                "wrong": lambda: x.sum() + 1,
                "boom": lambda: (_ for _ in ()).throw(RuntimeError("variant exploded"))}[variant]

    registry.FINDINGS[TINY] = Finding(
        id=TINY, title="tiny", claim="could be ~2x faster", variants=("sum", "square", "wrong",
                                                                        "boom"),
        baseline="sum", cases=lambda quick: [Case.of(num_envs=64), Case.of(num_envs=4096)],
        build=lambda case, device, seed: torch.ones(case["num_envs"], dtype=torch.float64),
        make_call=make_call, check=lambda out, ref: abs(float(out) - float(ref)),
        tolerance=lambda case: 1e-9,
    )
    try:
        code = run_main(["--findings", TINY, "--budget", "1", "--every-cell", "--device", "cpu",
                         "--out", str(tmp_path / "results"), "--no-report"])
    finally:
        del registry.FINDINGS[TINY]
    assert code == 1  # a mismatch and a failure
    return next((tmp_path / "results").glob("*-cpu"))


@pytest.mark.integration
def test_failed_and_mismatched_rows_are_reported_with_their_reasons(tiny_run, tmp_path):
    out = tmp_path / "report"
    assert report_main([str(tiny_run), "--out", str(out)]) == 0
    links = assert_self_contained(out / "index.html")
    text = (out / "index.html").read_text()
    assert "variant exploded" in text
    assert "wrong disagrees with the reference at 64 envs" in text
    assert "FAIL (max error 1)" in text
    # two sizes of the only parameter: a scaling plot, drawn after the registry forgot it
    assert finding_png(TINY, "scaling-num_envs") in links.images


# --- verdict sentences (a pure function of one summary row) -------------------------------

ROW = {"variant": "scan", "case": "num_envs=4,max_steps=25", "p_num_envs": 4.0,
       "p_max_steps": 25, "p_dones": float("nan")}


PAIRED = {"interval": "paired", "ci_level": 0.95, "margin": 0.05}


@pytest.mark.parametrize(("cells", "claim", "expected"), [
    ({**PAIRED, "verdict": "faster", "ratio": 1 / 17.6, "ci_low": 1 / 18.2, "ci_high": 1 / 16.9,
      "claim_word": "exceeded", "claim_tolerance": 0.25}, 4.0,
     "scan is 17.6x (95% CI 16.9-18.2) faster than loop at 4 envs x 25 steps; the ticket "
     "estimated ~4x: exceeded (tolerance 25%)."),
    ({**PAIRED, "verdict": "faster", "ratio": 0.5, "ci_low": 0.45, "ci_high": 0.55,
      "ci_level": 0.9917}, None,
     "scan is 2x (99.2% CI 1.82-2.22) faster than loop at 4 envs x 25 steps."),
    ({**PAIRED, "verdict": "slower", "ratio": 2.5, "ci_low": 2.0, "ci_high": 3.0}, 4.0,
     "scan is 2.5x (95% CI 2-3) slower than loop at 4 envs x 25 steps."),
    ({**PAIRED, "verdict": "same", "ratio": 1.01, "ci_low": 0.98, "ci_high": 1.04}, None,
     "scan takes the same time as loop at 4 envs x 25 steps: time ratio 1.01 (95% CI "
     "0.98-1.04 lies within \u00b15%)."),
    ({**PAIRED, "verdict": "inconclusive", "ratio": 1.04, "ci_low": 1.02, "ci_high": 1.06,
      "lean": "same", "rounds_to_decide": 1234}, None,
     "Inconclusive between scan and loop at 4 envs x 25 steps: time ratio 1.04 (95% CI "
     "1.02-1.06 reaches across a \u00b15% edge); it leans same, and about 1,234 rounds "
     "would decide it."),
    ({**PAIRED, "verdict": "inconclusive", "ratio": 1.05, "ci_low": 1.0, "ci_high": 1.1,
      "lean": "same"}, None,
     "Inconclusive between scan and loop at 4 envs x 25 steps: time ratio 1.05 (95% CI "
     "1-1.1 reaches across a \u00b15% edge); it leans same, and sits on the edge: no number "
     "of rounds would decide it."),
    # runs made before paired estimates keep their words, marked as such
    ({"verdict": "faster", "ratio": 0.5, "ci_low": 0.45, "ci_high": 0.55}, 4.0,
     "scan is 2x (95% CI 1.82-2.22) faster than loop at 4 envs x 25 steps (interval from "
     "unpaired samples, older run); the ticket estimated ~4x (the measured interval is "
     "below it)."),
    ({"verdict": "no_difference", "ratio": 0.98, "ci_low": 0.9, "ci_high": 1.05}, None,
     "No measurable difference between scan and loop at 4 envs x 25 steps: time ratio 0.98 "
     "(95% CI 0.9-1.05 contains 1) (interval from unpaired samples, older run)."),
    ({"verdict": "within_factor", "ratio": 0.97, "ci_low": 0.96, "ci_high": 0.98}, None,
     "scan is 1.03x (95% CI 1.02-1.04) faster than loop at 4 envs x 25 steps: measurable, "
     "but below the factor that counts (interval from unpaired samples, older run)."),
    ({"status": "mismatch", "verdict": "mismatch",
      "reason": "max error 0.5 > tolerance 2e-05"}, None,
     "scan disagrees with the reference at 4 envs x 25 steps (max error 0.5 > tolerance "
     "2e-05), so it was not timed."),
    ({"status": "failed", "verdict": "failed", "error": "first call: RuntimeError: boom"}, None,
     "scan failed at 4 envs x 25 steps: first call: RuntimeError: boom."),
    ({"status": "needs_cuda", "verdict": "needs_cuda", "reason": "needs CUDA"}, None,
     "scan needs CUDA; this run had no GPU, so it was not measured at 4 envs x 25 steps."),
    ({"status": "not_timed", "verdict": "not_timed", "reason": "skipped: too slow"}, None,
     "scan was not timed at 4 envs x 25 steps: skipped: too slow."),
    ({"verdict": "baseline", "median_s": 0.0021}, 4.0,
     "scan is the baseline: 2.1 ms per call at 4 envs x 25 steps."),
])
def test_verdict_sentence(cells, claim, expected):
    expected = expected.replace("\\u00b1", "\u00b1")
    assert verdict_sentence({**ROW, **cells}, against="loop", claim=claim) == expected


@pytest.mark.parametrize(("cells", "message"), [
    ({"verdict": "quicker"}, "field 'verdict': expected one of baseline, faster, .*; got 'quicker'"),
    ({"verdict": "faster", "ratio": 0.5, "ci_low": None, "ci_high": 0.6},
     "field 'ci_low': expected a number for verdict 'faster'; got None"),
])
def test_verdict_sentence_rejects_bad_rows(cells, message):
    with pytest.raises(ValueError, match=message):
        verdict_sentence({**ROW, **cells}, against="loop")


def test_case_phrase():
    assert case_phrase({"p_num_envs": 16.0, "p_max_steps": 150, "p_dones": "episode"}) == \
        "16 envs x 150 steps (dones=episode)"
    assert case_phrase({"p_n": 3, "case": "n=3"}) == "n=3"


# --- plots from hand-made rows ------------------------------------------------------------


def test_crossings_are_interpolated_on_log_log_axes():
    x = np.array([1.0, 10.0, 100.0])
    a = np.array([1.0, 1.0, 1.0])      # flat
    b = np.array([0.1, 1.0 * 10, 10.0])  # below a, then above
    (at, y, a_faster_after), = crossings(x, a, b)
    assert at == pytest.approx(10 ** 0.5) and y == pytest.approx(1.0) and a_faster_after
    assert crossings(x, a, a * 2) == []


def scaling_rows(times: dict[str, list[float]], envs=(1, 4, 16, 64)) -> pd.DataFrame:
    rows = []
    for variant, medians in times.items():
        for e, m in zip(envs, medians):
            rows.append({"finding": "X", "case": f"num_envs={e},max_steps=25", "p_num_envs": e,
                         "p_max_steps": 25, "variant": variant, "median_s": m})
    return pd.DataFrame(rows)


def test_scaling_plot_marks_crossovers_and_needs_two_sizes(tmp_path):
    rows = scaling_rows({"loop": [1e-4, 4e-4, 1.6e-3, 6.4e-3], "scan": [4e-4, 5e-4, 6e-4, 7e-4]})
    figure, found = scaling_figure("X", rows, "p_num_envs", ["loop", "scan"], tmp_path)
    assert (tmp_path / figure.file).stat().st_size > 0
    assert [(c.faster_below, c.faster_above, c.slice) for c in found] == \
        [("loop", "scan", "max_steps=25")]
    assert 4 < found[0].at < 16
    assert scaling_figure("X", rows, "p_max_steps", ["loop", "scan"], tmp_path) is None
    one_case = scaling_rows({"loop": [1e-3], "scan": [2e-3]}, envs=(4,))
    assert scaling_figure("X", one_case, "p_num_envs", ["loop", "scan"], tmp_path) is None


#: the phases the E2E finding declares (`Recording.phases`), as its runs record them
PHASES = ("env_step", "policy_forward", "buffer_add", "gae", "update")
E2E_INFO = {"E2E-iteration": {"title": "A full PPO iteration", "claim": "runs once per rollout",
                              "baseline": "original", "phases": list(PHASES)}}


def test_end_to_end_prediction_is_amdahl_over_the_phases():
    phases = {f"phase_{p}_s": s for p, s in zip(PHASES, (4.0, 2.0, 1.0, 2.0, 1.0))}
    faster_gae = {**phases, "phase_gae_s": 0.5}  # GAE 4x faster, 20% of the time
    rows = pd.DataFrame([
        {"case": "num_envs=4", "p_num_envs": 4, "variant": "original", "median_s": 12.0,
         "gae_share": 0.2, "ratio": None, **phases},
        {"case": "num_envs=4", "p_num_envs": 4, "variant": "optimized", "median_s": 10.0,
         "gae_share": 0.5 / 8.5, "ratio": 0.84, "ci_low": 0.8, "ci_high": 0.9, **faster_gae},
    ])
    (b,) = phase_breakdowns(rows, "original", PHASES)
    assert phase_breakdowns(rows, "original", ()) == []  # a finding that declares no phases
    assert b.predicted_ratio == pytest.approx(1 - 0.2 + 0.2 / 4)  # Amdahl
    assert b.predicted_s == pytest.approx(12.0 * 0.85)
    assert b.measured_ratio == 0.84 and b.measured_ci == (0.8, 0.9)
    assert [r["gain"] for r in b.phase_rows()] == ["1x", "1x", "1x", "4x", "1x"]


def test_a_section_with_declared_phases_is_rendered_from_its_rows(tmp_path):
    phases = {f"phase_{p}_s": s for p, s in zip(PHASES, (0.4, 0.2, 0.1, 0.2, 0.1))}
    base = {"finding": "E2E-iteration", "case": "num_envs=4,max_steps=10", "p_num_envs": 4,
            "p_max_steps": 10, "status": "ok", "n": 5, "iqr_s": 0.01}
    summary = pd.DataFrame([
        {**base, "variant": "original", "baseline": True, "verdict": "baseline",
         "median_s": 1.0, "gae_share": 0.2, **phases},
        {**base, "variant": "optimized", "baseline": False, "verdict": "faster",
         "median_s": 0.8, "ratio": 0.8, "ci_low": 0.75, "ci_high": 0.85, "speedup": 1.25,
         "gae_share": 0.05 / 0.85, **phases, "phase_gae_s": 0.05},
    ])
    run = Run(folder=tmp_path / "run", metadata={"run_id": "hand-made", "status": "complete",
                                                  "finding_info": E2E_INFO},
              summary=summary, rows=pd.DataFrame())
    page = render_run(run, tmp_path / "report")
    update_index(tmp_path)
    links = assert_self_contained(page)
    assert finding_png("E2E-iteration", "phases-0") in links.images
    text = page.read_text()
    assert "predicted from the phase gains (Amdahl)" in text
    assert "1.18x" in text  # predicted: 1 / 0.85


def test_detail_table_shows_samples_stop_reason_interval_and_peak_memory(tmp_path):
    base = {"finding": "B4-DRL-03", "case": "num_envs=4,max_steps=25", "p_num_envs": 4,
            "p_max_steps": 25, "status": "ok", "iqr_s": 1e-5, "stopped_by": "precision_reached"}
    summary = pd.DataFrame([
        {**base, "variant": "clone", "baseline": True, "verdict": "baseline", "median_s": 1e-3,
         "n": 34, "precision_reached": 0.021, "peak_bytes": 24576},
        {**base, "variant": "mask", "baseline": False, "verdict": "no_difference",
         "median_s": 1e-3, "n": 34, "ratio": 1.0, "ci_low": 0.98, "ci_high": 1.02,
         "ci_halfwidth": 0.02, "peak_bytes": 2048, "stopped_by": "time_budget"},
    ])
    run = Run(folder=tmp_path / "run", metadata={"run_id": "hand-made", "status": "complete"},
              summary=summary, rows=pd.DataFrame())
    text = render_run(run, tmp_path / "report").read_text()
    assert "34 (precision reached)" in text and "34 (budget spent)" in text
    assert "\u00b12.1%" in text and "\u00b12%" in text
    assert "24.6 kB" in text and "2.05 kB" in text


def test_a_stability_finding_is_answered_by_its_estimates_then_its_cost(tmp_path):
    """C1's answer is a rate with its Wilson interval, not the time ratio: the summary,
    the section and the markdown lead with it; the time ratio follows as the cost; every
    estimate of the rows is in the section's estimates table."""
    from harness.report.markdown import run_markdown

    base = {"finding": "C1-grad-scaler", "case": "train_batches=2", "p_train_batches": 2,
            "status": "ok", "n": 20, "iqr_s": 1e-5}
    rate = "inf_in_host_changed_other_scale_rate"
    summary = pd.DataFrame([
        {**base, "variant": "shared", "baseline": True, "verdict": "baseline", "median_s": 2e-3,
         rate: 1.0, f"{rate}_low": 0.51, f"{rate}_high": 1.0},
        {**base, "variant": "per_optimizer", "baseline": False, "verdict": "no_difference",
         "median_s": 2e-3, "ratio": 1.01, "ci_low": 0.97, "ci_high": 1.05, "speedup": 0.99,
         rate: 0.0, f"{rate}_low": 0.0, f"{rate}_high": 0.49},
    ])
    info = {"C1-grad-scaler": {"title": "Mixed precision", "claim": "the scaler...",
                               "baseline": "shared", "answer": [rate]}}
    run = Run(folder=tmp_path / "run", metadata={"run_id": "hand-made", "status": "complete",
                                                  "finding_info": info},
              summary=summary, rows=pd.DataFrame())
    text = render_run(run, tmp_path / "report").read_text()
    answer = ("inf in host changed other scale rate: per_optimizer 0 [0, 0.49] vs shared "
              "1 [0.51, 1]; time: per_optimizer no measurable difference")
    assert answer in text  # in the summary table and the section's answer line
    assert "Estimates with 95% intervals" in text
    assert answer in run_markdown(run, "report/index.html")


def test_a_learning_finding_s_worded_decision_leads_its_answer(tmp_path):
    """TL-bootstrap's rows say 'cannot decide' in words (`decision`) where its estimates
    alone would read as a difference: the report puts the words first."""
    base = {"finding": "TL-bootstrap", "case": "num_envs=4,max_steps=25", "p_num_envs": 4,
            "p_max_steps": 25, "status": "ok", "n": 5, "iqr_s": 0.01}
    vs_wait = "return_vs_wait"
    decision = "cannot decide: truncated does not beat always-WAIT"
    summary = pd.DataFrame([
        {**base, "variant": "truncated", "baseline": True, "verdict": "baseline",
         "median_s": 0.5, vs_wait: 0.1, f"{vs_wait}_low": -0.2, f"{vs_wait}_high": 0.4},
        {**base, "variant": "terminal", "baseline": False, "verdict": "same", "median_s": 0.5,
         "ratio": 1.0, "ci_low": 0.98, "ci_high": 1.02, "speedup": 1.0, vs_wait: 0.9,
         f"{vs_wait}_low": 0.5, f"{vs_wait}_high": 1.3, "decision": decision},
    ])
    info = {"TL-bootstrap": {"title": "The time limit", "claim": "truncation...",
                             "baseline": "truncated", "answer": [vs_wait]}}
    run = Run(folder=tmp_path / "run", metadata={"run_id": "hand-made", "status": "complete",
                                                  "finding_info": info},
              summary=summary, rows=pd.DataFrame())
    text = render_run(run, tmp_path / "report").read_text()
    assert f"{decision}; return vs wait: terminal 0.9 [0.5, 1.3] vs truncated 0.1" in text


def test_paired_e2e_shows_each_phase_saving_with_its_interval_and_device_time(tmp_path):
    """A paired E2E run: per phase the time saved per iteration (baseline - optimized,
    from the rows' `<phase>_diff` fields) with its interval, next to Amdahl's prediction
    from the phases' medians; the whole iteration's measured saving; and on CUDA rows the
    device seconds beside the host ones."""
    phases = {f"phase_{p}_s": s for p, s in zip(PHASES, (0.4, 0.2, 0.1, 0.2, 0.1))}
    device = {f"phase_{p}_device_s": s for p, s in zip(PHASES, (0.3, 0.2, 0.1, 0.25, 0.1))}
    diffs = {}
    for phase in PHASES:  # optimized - original: gae 3 ms faster, the rest unchanged
        saved = -0.003 if phase == "gae" else 0.0
        diffs.update({f"phase_{phase}_s_diff": saved, f"phase_{phase}_s_diff_low": saved - 0.001,
                      f"phase_{phase}_s_diff_high": saved + 0.001})
    base = {"finding": "E2E-iteration", "case": "num_envs=4,max_steps=25", "p_num_envs": 4,
            "p_max_steps": 25, "status": "ok", "n": 20, "iqr_s": 0.01}
    summary = pd.DataFrame([
        {**base, "variant": "original", "baseline": True, "verdict": "baseline",
         "median_s": 1.0, "gae_share": 0.2, **phases, **device},
        {**base, "variant": "optimized", "baseline": False, "verdict": "faster",
         "median_s": 0.997, "ratio": 0.997, "ci_low": 0.995, "ci_high": 0.999, "speedup": 1.003,
         "gae_share": 0.197 / 0.997, **phases, "phase_gae_s": 0.197, **device, **diffs,
         "time_diff_s": -0.0031, "time_diff_low_s": -0.0045, "time_diff_high_s": -0.0012},
    ])
    run = Run(folder=tmp_path / "run", metadata={"run_id": "hand-made", "status": "complete",
                                                  "finding_info": E2E_INFO},
              summary=summary, rows=pd.DataFrame())
    text = render_run(run, tmp_path / "report").read_text()
    assert "paired over calls" in text
    assert "3 ms [2 ms, 4 ms]" in text  # gae: saved 3 ms, interval 2-4 ms
    assert "3.1 ms [1.2 ms, 4.5 ms]" in text  # the whole iteration, measured
    assert "original on the device" in text and "250 ms" in text  # device update time


# --- compare mode -------------------------------------------------------------------------


@pytest.mark.integration
def test_compare_refuses_a_cell_measured_on_another_device(runs):
    """Sharded runs mark each row with the device that measured it; a cell measured on
    another device in the other run is not compared (unless forced), the others are."""
    new, old = load_run(runs["b"]), load_run(runs["a"])
    plain = compare_runs(new, old)
    first = int(plain.index[plain["ratio"].notna()][0])  # a cell both runs timed
    marked = new.summary.copy()
    marked["device_name"] = new.metadata["device_name"]
    marked.loc[first, "device_name"] = "NVIDIA H100 80GB HBM3"
    moved = Run(folder=new.folder, metadata=new.metadata, summary=marked, rows=new.rows)
    table = compare_runs(moved, old)
    refused = table.iloc[first]
    assert refused["change"] == "not_comparable" and pd.isna(refused["ratio"])
    assert "measured on different devices" in refused["note"] and "H100" in refused["note"]
    others = table.drop(index=first)
    assert others["ratio"].notna().sum() == plain.drop(index=first)["ratio"].notna().sum()
    forced = compare_runs(moved, old, force=True).iloc[first]
    assert forced["note"] == "" and forced["ratio"] == plain.iloc[first]["ratio"]


@pytest.mark.integration
def test_compare_two_runs(runs, tmp_path):
    assert report_main([str(runs["b"]), "--compare", str(runs["a"]),
                        "--out", str(tmp_path / "cmp")]) == 0
    links = assert_self_contained(tmp_path / "cmp" / "index.html")
    assert "compare.png" in links.images
    table = compare_runs(load_run(runs["b"]), load_run(runs["a"]))
    assert len(table) == len(load_run(runs["b"]).summary)
    timed = table[table["ratio"].notna()]
    # 3 cases x 3 variants with a ratio to the baseline in both runs, and 2 placebos; the
    # 3 baselines have none
    assert len(timed) == 11
    assert (timed["ci_low"] <= timed["ratio"]).all() and (timed["ratio"] <= timed["ci_high"]).all()
    assert set(table["change"]) <= {c.value for c in Change}
    index = parse(tmp_path / "index.html")
    assert "cmp/index.html" in index.hrefs


@pytest.mark.integration
def test_a_run_compared_with_itself_never_reads_as_a_change(runs):
    """Each run's own ratio: a run against itself is a ratio of exactly 1 whose words
    cannot be decisive changes; the baseline rows have no ratio and say why."""
    run = load_run(runs["a"])
    table = compare_runs(run, run)
    compared = table[table["ratio"].notna()]
    assert len(compared) and (compared["ratio"] == 1.0).all()
    assert set(compared["change"]) <= {Change.SAME.value, Change.INCONCLUSIVE.value}
    baselines = table[table["ratio"].isna()]
    assert set(baselines["change"]) == {Change.NOT_COMPARABLE.value}
    assert all(note.startswith("no ratio in the new run and the old run (the reference's own "
                               "time is not compared") for note in baselines["note"])


@pytest.mark.integration
def test_a_busier_machine_in_one_run_reads_as_no_change(runs, tmp_path):
    """Every time 1.3x longer (another job on the machine during the new run), each
    variant's ratio to its baseline as it was: nothing reads slower, the placebo
    included. (Comparing absolute times flagged every row, baseline and placebo too.)"""
    busier = tmp_path / "busier" / runs["a"].name
    shutil.copytree(runs["a"], busier)
    for journal in (busier / "cells").glob("*.json"):  # what the run's summary is read from
        entry = json.loads(journal.read_text())
        for row in entry["summary"]:
            for field in ("median_s", "iqr_s", "first_output_s"):
                if row.get(field) is not None:
                    row[field] *= 1.3
        for sample in entry["samples"]:
            sample["seconds"] *= 1.3
        journal.write_text(json.dumps(entry))
    table = compare_runs(load_run(busier), load_run(runs["a"]))
    assert (table["new_median_s"] > table["old_median_s"]).any()
    assert Change.SLOWER.value not in set(table["change"])
    assert (table[table["variant"] == "placebo"]["change"] != Change.SLOWER.value).all()


def test_runs_are_compared_through_their_ratios_with_both_runs_own_errors():
    """A variant whose ratio to the loop went from 0.50 to 0.55 (10% slower against it),
    each ratio known to 1% (log units): slower, the variance the sum of the two runs';
    against different references, or without a standard error, there is nothing to say."""
    from harness.report.compare import ratio_difference

    old = {"ratio": 0.50, "log_se": 0.01, "df": 40.0, "compared_to": "loop", "n": 20,
           "processes": 2}
    new = {**old, "ratio": 0.55}
    slower = ratio_difference(new, old)
    assert slower.ratio == pytest.approx(1.10)
    assert slower.se == pytest.approx(math.sqrt(2) * 0.01)
    assert slower.df == pytest.approx(80.0)  # Welch-Satterthwaite of two equal halves
    assert slower.interval(0.95)[0] > 1.05
    noisy = ratio_difference({**new, "log_se": 0.05}, {**old, "log_se": 0.05})
    assert noisy.interval(0.95)[0] < 1.05 < noisy.interval(0.95)[1]
    assert ratio_difference({**new, "compared_to": "batched"}, old) is None
    assert ratio_difference({**new, "log_se": None}, old) is None
    assert ratio_difference({**new, "ratio": None}, old) is None


@pytest.mark.integration
def test_compare_refuses_runs_from_different_machines(runs, tmp_path, capsys):
    other = tmp_path / "other" / runs["a"].name
    shutil.copytree(runs["a"], other)
    document = json.loads((other / "run.json").read_text())
    document["cpu_model"] = "Some Other CPU"
    (other / "run.json").write_text(json.dumps(document))
    args = [str(runs["b"]), "--compare", str(other), "--out", str(tmp_path / "cmp")]
    assert report_main(args) == 2
    err = capsys.readouterr().err
    assert "cpu_model: old 'Some Other CPU'" in err and "--force" in err
    assert not (tmp_path / "cmp").exists()
    assert report_main([*args, "--force"]) == 0
    assert "Compared with --force across different machines" in \
        (tmp_path / "cmp" / "index.html").read_text()


def _copy_with(run: Path, where: Path, **changes) -> Path:
    """A copy of `run` in `where` whose run.json has `changes` (None: the field removed)."""
    copy = where / run.name
    shutil.copytree(run, copy)
    document = json.loads((copy / "run.json").read_text())
    for field, value in changes.items():
        if value is None:
            document.pop(field, None)
        else:
            document[field] = value
    (copy / "run.json").write_text(json.dumps(document))
    return copy


@pytest.mark.parametrize(("changes", "field"), [
    ({"aten_cpu_capability": "DEFAULT", "env_aten_cpu_capability": "default"},
     "aten_cpu_capability: old 'DEFAULT'"),
    ({"env_onednn_max_cpu_isa": "AVX2"}, "env_onednn_max_cpu_isa: old 'AVX2', new None"),
    ({"threads": 7}, "threads: old 7"),
])
@pytest.mark.integration
def test_compare_refuses_runs_whose_kernel_paths_differ_saying_it_may_be_one_machine(
        runs, tmp_path, capsys, changes, field):
    """An AVX-512 run against one on the default kernels, or on another thread count, read
    as a change of the code (exit 0, no note); the thread count was refused as 'different
    machines' even on one machine."""
    other = _copy_with(runs["a"], tmp_path / "other", **changes)
    args = [str(runs["b"]), "--compare", str(other), "--out", str(tmp_path / "cmp")]
    assert report_main(args) == 2
    err = capsys.readouterr().err
    assert field in err and "ran different CPU kernels" in err, err
    assert "may be the same machine" in err and "different machines" not in err, err
    # a thread count chosen by the run (fewer beside a busy process) names its remedy
    assert ("--threads N" in err) == ("threads" in changes), err
    assert not (tmp_path / "cmp").exists()
    assert report_main([*args, "--force", "--markdown", str(tmp_path / "cmp.md")]) == 0
    for text in (html.unescape((tmp_path / "cmp" / "index.html").read_text()),
                 (tmp_path / "cmp.md").read_text()):
        assert "Compared with --force across different CPU kernels" in text and field in text


@pytest.mark.integration
def test_a_run_recorded_before_the_kernel_path_still_compares_and_says_so(runs, tmp_path, capsys):
    older = _copy_with(runs["a"], tmp_path / "older", aten_cpu_capability=None, cpu_flags=None,
                       env_aten_cpu_capability=None, env_onednn_max_cpu_isa=None)
    args = [str(runs["b"]), "--compare", str(older), "--out", str(tmp_path / "cmp"),
            "--markdown", str(tmp_path / "cmp.md")]
    assert report_main(args) == 0, capsys.readouterr().err
    note = (f"The old run ({older.name}) did not record its CPU kernel path (it predates "
            "that record): a difference of kernels between the runs cannot be ruled out.")
    assert note in html.unescape((tmp_path / "cmp" / "index.html").read_text())
    assert note in (tmp_path / "cmp.md").read_text()
    assert report_main([str(older), "--out", str(tmp_path / "alone")]) == 0  # and renders


# --- attachments, the flamegraph and the index --------------------------------------------


def test_large_files_are_linked_where_they_are_not_copied(tmp_path):
    big, small = tmp_path / "run" / "big.json.gz", tmp_path / "run" / "small.json.gz"
    big.parent.mkdir()
    big.write_bytes(b"\0" * (COPY_LIMIT_BYTES + 1))
    small.write_bytes(b"\0" * 10)
    out = tmp_path / "report"
    out.mkdir()
    linked, copied = attach(big, out, "traces"), attach(small, out, "traces")
    assert (linked.copied, linked.href) == (False, "../run/big.json.gz")
    assert (copied.copied, copied.href) == (True, "traces/small.json.gz")
    assert (out / copied.href).read_bytes() == small.read_bytes()
    assert not (out / "traces" / "big.json.gz").exists()


@pytest.mark.integration
def test_missing_pyspy_is_reported_plainly(runs, tmp_path):
    outcome = record_flamegraph(tmp_path, ("-c", "pass"), executable="no-such-py-spy")
    assert outcome["status"] == "missing" and "not installed" in outcome["detail"]
    run = tmp_path / "run" / runs["a"].name
    shutil.copytree(runs["a"], run)
    document = json.loads((run / "run.json").read_text())
    document["pyspy"] = {"status": "failed", "file": None,
                         "detail": "py-spy exited with status 1: Operation not permitted"}
    (run / "run.json").write_text(json.dumps(document))
    assert report_main([str(run), "--out", str(tmp_path / "r" / "x")]) == 0
    text = (tmp_path / "r" / "x" / "index.html").read_text()
    assert "No flamegraph: py-spy could not record one." in text
    assert "Operation not permitted" in text


def test_index_lists_reports_newest_first(tmp_path):
    for name, created in [("old", "2026-01-01T00:00:00+00:00"), ("new", "2026-03-01T00:00:00+00:00"),
                          ("mid", "2026-02-01T00:00:00+00:00")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(
            {"kind": "run", "run_id": name, "created": created, "git_commit": "abc",
             "git_dirty": False, "device_name": "cpu", "status": "complete"}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "report.json").write_text(json.dumps({"kind": "partial"}))
    links = parse(update_index(tmp_path))
    assert [h for h in links.hrefs if h.endswith("index.html")] == \
        ["new/index.html", "mid/index.html", "old/index.html"]


@pytest.mark.integration
def test_no_missing_number_leaks_into_the_page(runs):
    body = (runs["base"] / "reports" / runs["a"].name / "index.html").read_text()
    body = body.split("</style>")[1]
    assert not re.search(r"\b(nan|none|undefined)\b", body, re.IGNORECASE)


def test_bandwidth_column_and_each_cases_floor_and_label(tmp_path):
    base = {"finding": "B4-CR-03", "p_num_envs": 1024, "p_max_steps": 256, "p_dones": "episode",
            "status": "ok", "n": 5, "iqr_s": 1e-5, "min_bytes": 5_775_360, "floor_s": 3e-4,
            "bound": "bandwidth-bound"}
    case = {"case": "num_envs=1024,max_steps=256,dones=episode"}
    summary = pd.DataFrame([
        {**base, **case, "variant": "scan", "baseline": True, "verdict": "baseline",
         "median_s": 3e-3, "achieved_bytes_per_s": 5_775_360 / 3e-3},
        {**base, **case, "variant": "numba", "baseline": False, "verdict": "faster",
         "median_s": 6e-4, "ratio": 0.2, "ci_low": 0.19, "ci_high": 0.21, "speedup": 5.0,
         "achieved_bytes_per_s": 5_775_360 / 6e-4},
        {**base, **case, "variant": "loop", "baseline": False, "status": "not_timed",
         "verdict": "not_timed", "reason": "skipped: too slow"},
    ])
    run = Run(folder=tmp_path / "run", summary=summary, rows=pd.DataFrame(),
              metadata={"run_id": "hand-made", "status": "complete",
                        "copy_bandwidth_bytes_per_s": 1.925e10})
    page = render_run(run, tmp_path / "report")
    update_index(tmp_path)
    assert_self_contained(page)
    text = page.read_text()
    assert "<th>bandwidth</th>" in text
    assert "9.63 GB/s (50% of copy)" in text  # numba: 5.78 MB in 0.6 ms; floor 0.3 ms
    assert "1.93 GB/s (10% of copy)" in text  # scan
    assert "floor 300 us (5.78 MB at copy bandwidth): bandwidth-bound" in text
    assert "19.2 GB/s (large tensor copy, read + write)" in text  # the run's metadata
    header = text.split("<th>variant</th>")[1].split("</tr>")[0]
    assert header.count("<th>") == 14  # one more column than findings without bandwidth
