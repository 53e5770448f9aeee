"""harness.gate appends its table to $GITHUB_STEP_SUMMARY when that variable names a file.

The gate runs for real on one invariant (scan vs the per-env loop, ~10x apart, held to a
threshold no machine can meet, so the row is a regression whatever the noise): about a
second of timing.
"""

from __future__ import annotations

from harness.gate import cli as gate
from harness.gate.table import STEP_SUMMARY_VARIABLE
from tests.harness.gate.test_gate import _config
from tests.review import MODULE as REVIEW


def _impossible_invariant(tmp_path):
    """Gate options for one invariant no machine meets (scan 1e6x faster than the loop),
    with the review's findings named (a test may run outside this repository's folder)."""
    _config(tmp_path, min_speedup=1e6)
    return ["--invariants", "--config", str(tmp_path / "invariants.json"),
            "--findings-module", REVIEW]


def test_the_gate_appends_its_table_to_the_step_summary(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "step-summary.md"
    summary.write_text("## an earlier step\n\n")
    monkeypatch.setenv(STEP_SUMMARY_VARIABLE, str(summary))
    assert gate.main(_impossible_invariant(tmp_path)) == 1
    out = capsys.readouterr().out
    table, after = out.strip().split("\n\n", 1)  # the table; its notes and summary line
    *notes, line = after.splitlines()
    assert notes == ["note: invariants: timed at 1 torch thread (sampling.threads of the "
                     "invariants config)"]
    text = summary.read_text()
    assert text.startswith("## an earlier step\n\n")  # appended, not overwritten
    listed = "".join(f"- {note.removeprefix('note: ')}\n" for note in notes)
    assert f"### harness.gate\n\n{table}\n\n{listed}\n{line}\n" in text
    assert "| invariant scan-vs-loop | B4-CR-03 | scan vs loop |" in text
    assert line.startswith("FAIL: 1 regression")


def test_an_empty_variable_names_no_file_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _impossible_invariant(tmp_path)
    monkeypatch.setenv(STEP_SUMMARY_VARIABLE, "")
    assert gate.main(config) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["invariants.json"]


def test_a_step_summary_that_cannot_be_written_exits_2_before_measuring(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setenv(STEP_SUMMARY_VARIABLE, str(tmp_path))  # a folder, not a file
    assert gate.main(["--invariants", "--config", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert f"${STEP_SUMMARY_VARIABLE}: expected a file to write; got {tmp_path}, a folder" in err
