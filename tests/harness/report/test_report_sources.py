"""`harness.run --sources`: runs that record the lines behind their counters, and the
report's `--compare` and `--markdown` naming them.

Two quick runs of a user's finding (tests/bisect_repo.py's `MY-scale`), the second after
a `.item()` was planted in the library's `scale()`: the comparison names the planted line,
and the second run's own summary names it against the baseline variant.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.report.cli import main as report_main
from tests.bisect_repo import FINDINGS, OPS, PLANTED, PYPROJECT

PLANTED_LINE = 5  # `peak = x.abs().max().item()` in OPS with PLANTED in scale()'s body
#: a recorded run (of an older schema: the report migrates it) to copy as either side
FIXTURE_RUN = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "schema1" / \
    "20261125-123548-cpu"


def _run(project: Path, *args: str) -> Path:
    """One quick run at one thread: unpinned, a run beside a busy process (another test)
    times at fewer threads than one beside none, and the two would not compare."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    before = set((project / "results").glob("*-cpu*"))
    done = subprocess.run([sys.executable, "-m", "harness.run", "--quick", "--no-report",
                           "--budget", "1", "--every-cell", "--threads", "1", "--out", "results", *args], cwd=project,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (folder,) = set((project / "results").glob("*-cpu*")) - before
    return folder


@pytest.mark.integration
def test_compare_and_markdown_name_the_line_a_change_added(tmp_path, capsys):
    project = tmp_path / "project"
    (project / "mylib").mkdir(parents=True)
    (project / "mylib" / "__init__.py").write_text("")
    (project / "mylib" / "ops.py").write_text(OPS)
    (project / "bench_findings.py").write_text(FINDINGS)
    (project / "pyproject.toml").write_text(PYPROJECT)
    old = _run(project, "--sources")
    (project / "mylib" / "ops.py").write_text(
        OPS.replace("    return x / x.abs().max()\n", PLANTED))
    new = _run(project, "--sources")
    journal = json.loads(next((new / "cells").glob("*.json")).read_text())
    assert set(journal["sources"]) == {"torch", "mylib"}

    line = f"host syncs 0 -> 1: +1 aten::item at mylib/ops.py:{PLANTED_LINE} in scale()"
    assert report_main([str(new), "--compare", str(old), "--out", str(tmp_path / "compare"),
                        "--markdown"]) == 0
    assert line in capsys.readouterr().out
    assert line in html.unescape((tmp_path / "compare" / "index.html").read_text())
    # one run: the headline variant against the baseline variant, whose ops come from the
    # findings module's lambda, not from mylib
    assert report_main([str(new), "--out", str(tmp_path / "run"), "--markdown"]) == 0
    assert line in capsys.readouterr().out


@pytest.mark.integration
def test_without_sources_the_counts_stand_alone_and_sources_needs_the_profile(tmp_path):
    project = tmp_path / "project"
    (project / "mylib").mkdir(parents=True)
    (project / "mylib" / "__init__.py").write_text("")
    (project / "mylib" / "ops.py").write_text(OPS)
    (project / "bench_findings.py").write_text(FINDINGS)
    (project / "pyproject.toml").write_text(PYPROJECT)
    folder = _run(project)
    assert "sources" not in json.loads(next((folder / "cells").glob("*.json")).read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "harness.run", "--quick", "--sources",
                           "--no-profile", "--out", "results"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "--sources: expected with the profiling pass" in done.stderr


def _copy_run(folder: Path, run_id: str, sources: bool) -> Path:
    """The fixture run as `run_id`, its journal holding lines for every variant when
    `sources` (one op call at one line each), as `harness.run --sources` records them."""
    shutil.copytree(FIXTURE_RUN, folder)
    document = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**document, "run_id": run_id}))
    for cell_file in (folder / "cells").glob("*.json"):
        cell = json.loads(cell_file.read_text())
        if sources:
            cell["sources"] = {row["variant"]: [{
                "counter": "op_calls", "op": "aten::add", "count": 1,
                "site": {"file": "mylib/ops.py", "line": 3, "function": "scale"}}]
                for row in cell["summary"]}
        cell_file.write_text(json.dumps(cell))
    return folder


@pytest.mark.parametrize("recorded", [("new",), ("old",), ("new", "old"), ()])
def test_compare_says_when_only_one_run_recorded_the_lines(tmp_path, capsys, recorded):
    """With lines from one run only, the counter changes cannot name lines: the page and
    the markdown say which run lacks them and how to record them (they said nothing)."""
    runs = {label: _copy_run(tmp_path / "results" / f"{label}-run", f"{label}-run",
                             label in recorded) for label in ("new", "old")}
    out = tmp_path / "compare"
    assert report_main([str(runs["new"]), "--compare", str(runs["old"]), "--out", str(out),
                        "--markdown"]) == 0
    said = capsys.readouterr().out + html.unescape((out / "index.html").read_text())
    missing = {"new", "old"} - set(recorded)
    if len(missing) == 1:
        (label,) = missing
        sentence = (f"The {label} run ({label}-run) was recorded without --sources: counter "
                    "changes are shown without the ops and lines behind them. Record both runs "
                    "with `python -m harness.run --sources` to see them.")
        assert said.count(sentence) == 2  # the markdown and the page
    else:
        assert "without --sources" not in said
