"""harness.report.folder: a report never empties a folder that is not its own, and
rendering again removes only the files the earlier report listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.report.folder import (
    MARKER, ReportFolderError, check_destination, remove_orphans, staged,
)


def draw(stage, *names):
    """A stand-in render: the files `names` and a marker."""
    for name in names:
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_text(name)
    (stage / MARKER).write_text(json.dumps({"kind": "run", "run_id": "r"}))


def test_a_report_lists_its_files_and_rendering_again_removes_only_those(tmp_path):
    out = tmp_path / "report"
    with staged(out) as stage:
        draw(stage, "index.html", "a.png", "traces/x.json.gz")
    marker = json.loads((out / MARKER).read_text())
    assert marker["files"] == ["a.png", "index.html", "traces/x.json.gz"]
    (out / "notes.txt").write_text("mine")          # the user's file beside the report
    (out / "traces" / "keep.txt").write_text("mine")
    with staged(out) as stage:
        draw(stage, "index.html", "b.png")
    assert sorted(p.name for p in out.iterdir()) == ["b.png", "index.html", "notes.txt",
                                                     MARKER, "traces"]
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "traces" / "keep.txt").read_text() == "mine"
    assert not (out / "traces" / "x.json.gz").exists()
    assert not list(tmp_path.glob(".*staging*"))


def test_a_render_that_raises_leaves_the_earlier_report_whole(tmp_path):
    out = tmp_path / "report"
    with staged(out) as stage:
        draw(stage, "index.html", "a.png")
    with pytest.raises(RuntimeError), staged(out) as stage:
        draw(stage, "index.html")
        raise RuntimeError("drawing failed")
    assert (out / "a.png").read_text() == "a.png"
    assert not list(tmp_path.glob(".*staging*"))


@pytest.mark.parametrize("where", ["empty", "dot", "cwd", "parent", "home", "repo", "runs"])
def test_places_that_are_never_a_report_are_refused_and_untouched(tmp_path, monkeypatch, where):
    home = tmp_path / "home"
    work = home / "work"
    (work / "results" / "run1").mkdir(parents=True)
    (work / "results" / "run1" / "run.json").write_text("{}")
    (work / ".git").mkdir()
    for folder in (home, work):
        (folder / MARKER).write_text(json.dumps({"kind": "run"}))
        (folder / "mine.txt").write_text("keep")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work / "results")
    out = {"empty": "", "dot": ".", "cwd": str(work / "results"), "parent": "..",
           "home": str(home), "repo": str(work), "runs": "run1"}[where]
    with pytest.raises(ReportFolderError, match="never emptied"):
        check_destination(__import__("pathlib").Path(out), protect=[work / "results" / "run1"])
    assert (work / "mine.txt").read_text() == "keep"
    assert (home / "mine.txt").read_text() == "keep"


def test_a_folder_of_other_files_is_refused(tmp_path):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ReportFolderError, match="expected an empty folder or an earlier report"):
        check_destination(other)
    legacy = tmp_path / "legacy"  # a report from before `files`, with a stranger in it
    legacy.mkdir()
    (legacy / MARKER).write_text(json.dumps({"kind": "run"}))
    (legacy / "index.html").write_text("x")
    (legacy / "notes.txt").write_text("keep")
    with pytest.raises(ReportFolderError, match="notes.txt, which a report does not write"):
        with staged(legacy) as stage:
            draw(stage, "index.html")
    assert (legacy / "notes.txt").read_text() == "keep"


def test_a_legacy_report_holding_only_report_files_is_replaced(tmp_path):
    legacy = tmp_path / "legacy"
    (legacy / "traces").mkdir(parents=True)
    (legacy / MARKER).write_text(json.dumps({"kind": "run"}))
    for name in ("index.html", "old.png", "traces/t.json.gz"):
        (legacy / name).write_text("x")
    with staged(legacy) as stage:
        draw(stage, "index.html")
    assert sorted(p.name for p in legacy.iterdir()) == ["index.html", MARKER]


def test_a_killed_render_is_cleaned_up_by_the_next(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    orphan = tmp_path / f".report.staging-{dead.stdout.strip()}"
    orphan.mkdir()
    (orphan / "half.png").write_text("x")
    live = tmp_path / f".other.staging-{os.getpid()}"  # a render in progress: left alone
    live.mkdir()
    assert remove_orphans(tmp_path) == [orphan]
    assert not orphan.exists() and live.exists()
    assert "a report render that was killed before it finished" in capsys.readouterr().err
