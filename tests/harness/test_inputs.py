"""Every input a message names, in the user's words, with what to do about it.

A run named through `latest` that is gone, a `--results` that is a file, a timed row
without its median, a findings module whose call returns what its check cannot take:
each is one line naming where the input came from (the `latest` file, the option, the
argument, the finding and its variant), what was expected and what was found.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.findings import Case, Finding, max_abs_difference
from harness.report import cli as report_cli
from esper_review.gae_tools import targets
from harness.run import main as run_main
from harness.runner import CaseRun, RunOptions

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "schema1"
RUN_ID = "20261125-123548-cpu"


@pytest.fixture
def results(tmp_path) -> Path:
    """A results folder holding one run, and `latest` naming it."""
    folder = tmp_path / "results"
    shutil.copytree(FIXTURES, folder)
    return folder


def test_a_latest_file_naming_a_deleted_run_says_the_id_came_from_latest(results, capsys):
    (results / "latest").write_text("20250101-000000-cpu\n")
    assert report_cli.main(["--results", str(results), "--out", str(results.parent / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: RUN latest: {results / 'latest'} names run "
                          "'20250101-000000-cpu', which is not there"), err
    assert "python -m harness.run" in err and err.count("\n") == 1
    assert run_main(["--resume", "latest", "--out", str(results)]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: --resume latest: {results / 'latest'} names run '20250101-000000-cpu'")


def test_a_run_that_is_not_there_is_named_with_the_argument_it_came_from(results, capsys):
    assert report_cli.main(["no-such-run", "--results", str(results),
                            "--out", str(results.parent / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: RUN no-such-run: neither no-such-run nor "
                          f"{results / 'no-such-run'} holds a run.json"), err
    assert report_cli.main([RUN_ID, "--compare", "gone", "--results", str(results),
                            "--out", str(results.parent / "r")]) == 2
    assert capsys.readouterr().err.startswith("error: --compare gone: neither gone nor ")


def test_targets_with_results_that_is_a_file_names_the_option(tmp_path, capsys):
    a_file = tmp_path / "results.json"
    a_file.write_text("{}")
    assert targets.main(["--results", str(a_file)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --results: expected a folder of runs; got {a_file} (a file)\n", err


def test_a_timed_row_without_its_median_is_a_corrupt_file_named_with_its_field(results, capsys):
    """The issue's run whose summary rows lack median_s: exit 2 naming the file that holds
    the rows (the journal's cell), the row and the field; it was exit 3, 'numbers that
    make no sense', naming neither."""
    run = results / RUN_ID
    cell = sorted((run / "cells").glob("*.json"))[0]
    document = json.loads(cell.read_text())
    for row in document["summary"]:
        row.pop("median_s", None)
    cell.write_text(json.dumps(document))
    assert report_cli.main([str(run), "--out", str(results.parent / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {cell}: summary row 0: field 'median_s': expected the "
                          "median seconds of a timed row (status 'ok'), a number > 0; got "
                          "nothing (the field is missing)"), err
    assert not (results.parent / "r").exists()


def _finding(returned) -> Finding:
    """A finding whose second variant's call returns `returned` (the first: a tensor)."""
    return Finding(
        id="TEST-returns", title="t", claim="c", variants=("good", "bad"), baseline="good",
        cases=[Case.of(n=4)], build=lambda case, device, seed: torch.ones(case["n"]),
        make_call=lambda variant, x: (lambda: x * 2) if variant == "good" else (lambda: returned),
        reference=lambda x: x * 2, check=max_abs_difference, tolerance=1e-6)


@pytest.mark.parametrize(("returned", "kind"), [(None, "NoneType"), ([1.0, 2.0], "list")])
def test_a_call_that_returns_what_the_check_cannot_take_fails_at_its_first_call(returned, kind):
    finding = _finding(returned)
    cell = CaseRun(finding, Case.of(n=4), RunOptions(device=torch.device("cpu"), min_samples=2),
                   sampling_s=0.02).run()
    rows = {row["variant"]: row for row in cell.summary}
    assert rows["good"]["status"] == "ok"
    assert rows["bad"]["status"] == "failed"
    assert rows["bad"]["error"] == (
        f"first call: TEST-returns bad: its call returned a {kind}; the finding's check "
        "max_abs_difference takes a Tensor (make_call must return a callable whose result "
        "the check can compare with the reference)")
