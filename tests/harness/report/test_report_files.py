"""A run renders from its files alone: no findings module is imported, a run whose
findings module is gone renders the same, and a run of the previous schema still renders,
marked as such."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.report.cli import main as report_main
from harness.results import SCHEMA_VERSION, load_run

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
REPO = Path(__file__).resolve().parents[3]

FINDINGS_MODULE = textwrap.dedent('''
    import torch
    from harness import About, Case, Finding, register

    register(Finding(
        id="GONE-sums", title="A sum against a loop of adds",
        claim="sum() is ~10x faster than a loop", variants=("loop", "sum"), baseline="loop",
        cases=[Case.of(n=64)],
        build=lambda case, device, seed: torch.ones(case["n"]),
        make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum"
                                     else (lambda: sum(x.tolist())),
        about=About(notes=("a note only the run recorded",),
                    reviewed="loops.py:10-12 @abc123", fix="the ticket's sum()",
                    premise="loops.py never loops at abc123"),
    ))
''')


@pytest.mark.integration
def test_a_run_whose_findings_module_is_deleted_renders_in_a_fresh_interpreter(tmp_path):
    """Measured with a findings module of the user's; the module is then deleted, and the
    report, in a fresh process, still shows its title, claim and notes from run.json."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "gone_findings.py").write_text(FINDINGS_MODULE)
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "harness.run", "--findings-module", "gone_findings",
         "--budget", "1", "--every-cell", "--no-profile", "--no-report", "--out", str(results)],
        cwd=project, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shutil.rmtree(project)  # the findings module is gone
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "harness.report", "latest", "--results",
         str(results), "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert not {name for name in imported if name.startswith(("harness.findings",
                                                              "esper_review", "esper"))}
    page = (out / "index.html").read_text()
    assert "A sum against a loop of adds" in page and "sum() is ~10x faster" in page
    assert "a note only the run recorded" in page
    assert "loops.py:10-12 @abc123" in page and "the ticket&#39;s sum()" in page
    assert "loops.py never loops at abc123" in page


def test_a_run_of_the_previous_schema_is_migrated_on_read_and_renders(tmp_path):
    run = load_run(None, FIXTURES / "schema1")
    assert run.metadata["schema_version"] == SCHEMA_VERSION == 2
    assert run.metadata["migrated_from"] == 1 and run.metadata["finding_info"] == {}
    out = tmp_path / "report"
    assert report_main(["latest", "--results", str(FIXTURES / "schema1"),
                        "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "interval from unpaired samples, older run" in page
    assert "did not record this finding" in page


def test_a_run_compares_with_one_of_the_previous_schema(tmp_path):
    older = FIXTURES / "schema1" / "20261125-123548-cpu"
    out = tmp_path / "cmp"
    assert report_main([str(older), "--compare", str(older), "--out", str(out)]) == 0
    assert "20261125-123548-cpu (new) vs" in (out / "index.html").read_text()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(schema_version=3), "It was written by a newer esper-bench: upgrade it"),
    (lambda d: d.update(schema_version="2"), "schema_version: expected one of 1, 2; got '2'"),
    (lambda d: d.update(summary="a string"), "field 'summary': expected a list of rows; got str"),
    (lambda d: d.update(schema_version=2, finding_info=[]),
     "field 'finding_info': expected an object"),
    (lambda d: d.update(summary=[{"finding": "F", "case": "c", "variant": "v",
                                  "ratio": "fast"}]),
     "summary row 0: field 'ratio': expected a number; got 'fast'"),
    (lambda d: d.update(summary=[{"finding": "F", "case": "c", "variant": "v",
                                  "status": "great"}]),
     "summary row 0: field 'status': expected one of ok, failed"),
    (lambda d: d.update(summary=[{"finding": 3, "case": "c", "variant": "v"}]),
     "summary row 0: field 'finding': expected a string; got 3"),
])
def test_a_run_json_with_a_wrong_field_is_named_with_file_and_field(tmp_path, capsys, edit,
                                                                    message):
    folder = tmp_path / "results" / "r1"
    folder.mkdir(parents=True)
    document = json.loads((FIXTURES / "schema1" / "20261125-123548-cpu" / "run.json").read_text())
    edit(document)
    (folder / "run.json").write_text(json.dumps(document))
    assert report_main([str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'run.json'}" in err and message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["", "\n", "   \n", "../elsewhere\n"])
def test_a_latest_file_naming_no_run_exits_2_naming_it(tmp_path, capsys, content):
    """An empty (or path-like) `latest` is named with what it holds, not a missing folder."""
    shutil.copytree(FIXTURES / "schema1", tmp_path / "results")
    latest = tmp_path / "results" / "latest"
    latest.write_text(content)
    before = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert report_main(["latest", "--results", str(tmp_path / "results"),
                        "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert f"{latest}: expected the id of the newest run" in err and repr(content.strip()) in err
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == before
    assert not (tmp_path / "report").exists()
