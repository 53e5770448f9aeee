"""One writer per folder (`harness.lock`): a run, a resume, a report and the gate's files.

The holders are real processes: `python -m harness.run`, or a small program that takes a
folder's lock and waits. A second writer must exit 2 naming the holder's pid and command
and change nothing; a reader never waits; a holder killed by SIGKILL leaves a stale lock
that the next writer takes over and names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import lock
from harness.gate import cli as gate_cli
from harness.report import cli as report_cli
from harness.results import load_run
from harness.run import main
from tests.findings_modules import tiny
from tests.harness.test_run_persistence import RUN, _cells, _start, _stop_after_the_first_cell

REPO = Path(__file__).resolve().parents[2]
#: takes the lock of the folder in argv[1], says so, and waits to be killed
HOLDER = ("import sys, time\nfrom pathlib import Path\nfrom harness.lock import hold\n"
          "with hold(Path(sys.argv[1]), 'a test holder'):\n"
          "    print('held', flush=True)\n    time.sleep(600)\n")


@pytest.fixture
def holder():
    """`holder(folder)`: a process that holds `folder`'s lock until the test ends."""
    started = []

    def start(folder: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO,
                                   stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline() == "held\n"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but the lock file (the holder's)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != lock.LOCK_FILE}


def test_the_lock_file_names_its_holder_and_holds_nest_within_a_process(tmp_path):
    with lock.hold(tmp_path, "--out x"):
        recorded = json.loads((tmp_path / lock.LOCK_FILE).read_text())
        assert recorded["pid"] == os.getpid() and recorded["command"]
        with lock.hold(tmp_path / "." , "--out x"):  # the same folder, spelled otherwise
            pass
        assert (tmp_path / lock.LOCK_FILE).is_file()  # the outer hold still has it
    assert not (tmp_path / lock.LOCK_FILE).exists()  # released: nothing left behind


@pytest.mark.integration
def test_a_second_writer_of_a_run_folder_exits_2_naming_the_holder_and_changes_nothing(
        tmp_path, monkeypatch, holder, capsys):
    folder = _stop_after_the_first_cell(tmp_path, monkeypatch)
    capsys.readouterr()
    before = _snapshot(tmp_path)
    process = holder(folder)
    assert main(["--resume", str(folder), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --resume {folder}: ")
    assert f"pid {process.pid} (python -c " in err and "being written by another process" in err
    assert _snapshot(tmp_path) == before


@pytest.mark.integration
def test_readers_never_wait_for_a_writer(tmp_path, monkeypatch, holder):
    folder = _stop_after_the_first_cell(tmp_path, monkeypatch)
    holder(folder)
    assert load_run(folder).metadata["cells_done"] == 1
    assert report_cli.main([str(folder), "--out", str(tmp_path / "reports" / "r")]) == 0


@pytest.mark.integration
def test_a_second_report_into_one_reports_folder_exits_2_and_writes_nothing(
        tmp_path, monkeypatch, holder, capsys):
    folder = _stop_after_the_first_cell(tmp_path, monkeypatch)
    reports = tmp_path / "reports"
    process = holder(reports)
    capsys.readouterr()
    assert report_cli.main([str(folder), "--out", str(reports / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {reports / 'r'}: ") and f"pid {process.pid} " in err
    assert sorted(p.name for p in reports.iterdir()) == [lock.LOCK_FILE]


def test_a_gate_that_would_write_a_locked_folder_exits_2_and_writes_nothing(
        tmp_path, holder, capsys):
    baselines = tmp_path / "baselines"
    process = holder(baselines)
    args = ["--findings-module", "tests.findings_modules.tiny", "--baseline",
            str(baselines / "counters.json")]
    assert gate_cli.main(["--update-baseline", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --baseline {baselines / 'counters.json'}: ")
    assert f"pid {process.pid} " in err
    assert sorted(p.name for p in baselines.iterdir()) == [lock.LOCK_FILE]


@pytest.mark.integration
def test_the_gate_writes_json_only_into_a_folder_no_one_else_writes(tmp_path, holder, capsys):
    args = ["--findings-module", "tests.findings_modules.tiny", "--findings", "TINY-sums",
            "--baseline", str(tmp_path / "counters.json")]
    assert gate_cli.main(["--update-baseline", *args]) == 0
    shared = tmp_path / "shared"
    process = holder(shared)
    capsys.readouterr()
    assert gate_cli.main(["--counters", *args, "--json", str(shared / "rows.json")]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the checks' progress lines
    assert err.startswith(f"error: --json {shared / 'rows.json'}: ")
    assert f"pid {process.pid} " in err
    assert sorted(p.name for p in shared.iterdir()) == [lock.LOCK_FILE]


@pytest.mark.integration
def test_two_resumes_of_one_run_started_together_measure_it_once(tmp_path, monkeypatch):
    """The issue's two `--resume` of one run, 0.3 s apart: one measures the missing
    cells, the other exits 2 naming it, and every cell is measured exactly once."""
    folder = _stop_after_the_first_cell(tmp_path, monkeypatch)
    command = [sys.executable, "-m", "harness.run", "--resume", str(folder), "--no-report"]
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    second = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    outcomes = {p.pid: (p.wait(timeout=300), p.stderr.read()) for p in (first, second)}
    codes = sorted(code for code, _ in outcomes.values())
    assert codes == [0, 2], outcomes
    (winner,) = [pid for pid, (code, _) in outcomes.items() if code == 0]
    (refused,) = [err for code, err in outcomes.values() if code == 2]
    assert f"pid {winner} (python -m harness.run --resume {folder} --no-report)" in refused
    assert "resuming" not in refused  # it measured nothing
    run = load_run(folder)
    assert run.metadata["status"] == "complete" and run.metadata["cells_done"] == tiny.CASES
    assert len(run.summary) == 2 * tiny.CASES + 1  # each cell once (and the headline's placebo)


@pytest.mark.integration
def test_a_writer_killed_by_sigkill_leaves_a_stale_lock_the_next_writer_names(tmp_path, capsys):
    process = _start(tmp_path)
    for line in process.stderr:  # the first cell is journaled
        if line.startswith("["):
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    (folder,) = [p for p in tmp_path.iterdir() if (p / "run.json").is_file()]
    left = lock.holder_of(folder)
    assert left["pid"] == process.pid and "harness.run" in left["command"]

    assert main(["--resume", str(folder), "--no-report"]) == 0
    err = capsys.readouterr().err
    assert (f"took over the lock of pid {process.pid} (python -m harness.run {' '.join(RUN)}"
            in err), err
    assert "ended without releasing it (killed)" in err
    assert _cells(load_run(folder)) == {("TINY-sums", f"n={256 * (k + 1)}")
                                        for k in range(tiny.CASES)}
    assert not (folder / lock.LOCK_FILE).exists()


@pytest.mark.integration
def test_a_run_whose_reports_folder_is_being_written_keeps_its_run_and_says_how_to_render(
        tmp_path, holder, capsys):
    reports = tmp_path / "reports"
    process = holder(reports)
    run = [arg for arg in RUN if arg != "--no-report"]
    assert main([*run, "--out", str(tmp_path / "results"), "--reports", str(reports)]) == 0
    err = capsys.readouterr().err
    (folder,) = [p for p in (tmp_path / "results").iterdir() if p.is_dir()]
    assert f"report not written: --out {reports / folder.name}: " in err
    assert f"pid {process.pid} " in err
    assert f"render it with: python -m harness.report {folder}" in err
    assert load_run(folder).metadata["status"] == "complete"
    assert sorted(p.name for p in reports.iterdir()) == [lock.LOCK_FILE]
