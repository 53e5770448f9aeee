"""Nothing measured is ever lost: the journal, signals, --resume, unique run ids, a full disk.

Real runs of `harness.run` on `TINY-sums` (tests/findings_modules/tiny.py: ten short
cells), in subprocesses where a signal must be real (SIGINT, SIGTERM, SIGKILL), in this
process where an interruption can be raised from inside a variant.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness import findings as registry, lock
from harness.report.cli import render
from harness.results import (
    DiskFullError, RunFileError, RunWriter, atomic_write_text, create_run_folder, load_run,
)
from harness.run import main
from tests import forked_run
from tests.findings_modules import tiny

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.findings_modules.tiny"
RUN = ["--findings-module", MODULE, "--findings", "TINY-sums", "--budget", "1", "--every-cell",
       "--no-profile", "--no-report"]
ALL_CELLS = {("TINY-sums", f"n={256 * (k + 1)}") for k in range(tiny.CASES)}


def _cells(run) -> set[tuple[str, str]]:
    if run.summary.empty:
        return set()
    return set(map(tuple, run.summary[["finding", "case"]].drop_duplicates().values.tolist()))


def _start(out: Path, *extra: str) -> subprocess.Popen:
    """`python -m harness.run` on TINY-sums in a subprocess, stderr piped (not a terminal)."""
    return subprocess.Popen([sys.executable, "-m", "harness.run", *RUN, "--out", str(out), *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _reported_cells(stderr: str) -> set[tuple[str, str]]:
    """Cells the run's progress lines said were done (each printed after its journal entry)."""
    cells = set()
    for line in stderr.splitlines():
        if line.startswith("[") and "] TINY-sums " in line:
            cells.add(("TINY-sums", line.split("] TINY-sums ", 1)[1].split(":", 1)[0]))
    return cells


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> set[tuple[str, str]]:
    """The cells of an uninterrupted run."""
    out = tmp_path_factory.mktemp("reference")
    assert main(RUN + ["--out", str(out)]) == 0
    run = load_run(None, out)
    assert run.metadata["status"] == "complete" and run.metadata["cells_done"] == tiny.CASES
    return _cells(run)


@pytest.mark.integration
def test_uninterrupted_run_journals_every_cell(reference):
    assert reference == ALL_CELLS


def _trial(out: Path, signum: int, rng: random.Random) -> dict:
    """Start a run, send `signum` at a random moment, wait; what it said and what it left."""
    stderr = out.parent / f"{out.name}.stderr"
    out.mkdir()
    process = forked_run.start(RUN + ["--out", str(out)], str(stderr))
    if rng.random() < 0.25:  # during start-up: run folder, bandwidth, first cell
        time.sleep(rng.uniform(0.0, 0.4))
    else:  # among the cells
        deadline = time.monotonic() + 60
        while "[" not in (stderr.read_text() if stderr.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.5))  # the cells after the first take about a second
    try:
        os.kill(process.pid, signum)
    except ProcessLookupError:  # it had finished and was reaped (by the fork server)
        pass
    process.join(timeout=60)
    return {"code": process.exitcode, "stderr": stderr.read_text()}


@pytest.mark.integration
@pytest.mark.parametrize("rounds", [3, pytest.param(7, marks=pytest.mark.long)])
def test_fault_injection_signals_at_random_moments_lose_nothing(tmp_path, reference, rounds):
    """3 x `rounds` runs (9 in CI, 21 with -m long), each stopped by SIGINT, SIGTERM or
    SIGKILL at a random moment: every cell a run reported done is in its results; every run
    loads and renders; `--resume` completes each one to the cells of an uninterrupted run."""
    rng = random.Random(20261124)
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL] * rounds
    outcomes = []
    for index, signum in enumerate(signals):
        out = tmp_path / f"trial{index}"
        outcome = _trial(out, signum, rng)
        reported = _reported_cells(outcome["stderr"])
        folders = [p for p in out.glob("*") if (p / "run.json").exists()]
        if not folders:  # stopped before the run folder existed: nothing was measured
            assert reported == set(), outcome["stderr"]
            continue
        (folder,) = folders
        run = load_run(folder)
        assert reported <= _cells(run), (signum, outcome["stderr"])
        status = run.metadata["status"]
        if status == "complete":  # the signal came after the run was written (or ended)
            assert outcome["code"] in (0, 128 + signum, -signum) and _cells(run) == ALL_CELLS
        elif signum == signal.SIGKILL:
            assert outcome["code"] == -signal.SIGKILL and status == "killed", status
        else:
            assert outcome["code"] == 128 + signum and status == "interrupted", outcome["stderr"]
        outcomes.append((signum, folder, run.metadata["status"], len(_cells(run))))

    stopped = [o for o in outcomes if o[2] != "complete"]
    assert len(stopped) >= len(signals) // 2, outcomes  # most landed while it measured
    assert len({o[0] for o in stopped}) == 3, outcomes  # every signal stopped a run midway
    assert any(0 < o[3] < tiny.CASES for o in stopped), outcomes  # and some between cells

    signum, folder, status, done = next(o for o in stopped if 0 < o[3])
    page = render(folder, out=tmp_path / "reports" / folder.name)
    html = page.read_text()
    assert "TINY-sums" in html

    for signum, folder, status, done in outcomes:
        assert main(["--resume", str(folder), "--no-report"]) == 0
        resumed = load_run(folder)
        assert resumed.metadata["status"] == "complete"
        assert _cells(resumed) == reference
        # each cell measured once; the headline cell also holds the placebo
        assert len(resumed.summary) == 2 * tiny.CASES + 1


#: a whole run of `python -m harness.run`, report included, for the whole-life injection
WHOLE_RUN = [arg for arg in RUN if arg != "--no-report"] + ["--budget", "1", "--every-cell"]


def _leftovers(folder: Path) -> list[Path]:
    """What a clean exit never leaves: temp files, report staging folders, writer locks."""
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or ".staging-" in p.name
            or p.name == lock.LOCK_FILE]


class _Trial:
    """One `python -m harness.run` (a real process: the interpreter's start-up, the
    imports, the run, its report and the interpreter's exit) sent SIGINT `delay` seconds
    after it was started, or `delay` seconds after its stderr first shows `after` (a
    progress line); its output goes to files, so that two run side by side."""

    def __init__(self, folder: Path, delay: float, after: str | None = None) -> None:
        self.folder, self.delay, self.after = folder, delay, after
        folder.mkdir()
        self.stdout, self.stderr = folder / "stdout", folder / "stderr"
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            # SIGINT as an interactive shell leaves it: CI may start the tests with it ignored
            self.process = subprocess.Popen(
                [sys.executable, "-m", "harness.run", *WHOLE_RUN, "--out", str(folder / "results")],
                cwd=REPO, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.due = None if after else time.monotonic() + delay
        self.sent = False

    def poll(self) -> bool:
        """Send the signal when it is due; whether the process has ended."""
        ended = self.process.poll() is not None
        if self.due is None and (ended or self.after in self.stderr.read_text()):
            self.due = time.monotonic() + self.delay
        if not self.sent and self.due is not None and time.monotonic() >= self.due:
            if not ended:
                self.process.send_signal(signal.SIGINT)
            self.sent = True
        return self.sent and ended


def _run_trials(tmp_path: Path, moments: list[tuple[float, str | None]]) -> list[_Trial]:
    """A trial per (delay, after) moment, two at a time (the CPU's cores), each to its end."""
    waiting, running, done = list(enumerate(moments)), [], []
    while waiting or running:
        while waiting and len(running) < 2:
            index, (delay, after) = waiting.pop(0)
            running.append(_Trial(tmp_path / f"trial{index}", delay, after))
        time.sleep(0.005)
        for trial in [t for t in running if t.poll()]:
            running.remove(trial)
            done.append(trial)
    return done


def _judge(trial: _Trial) -> tuple[str, list[str]]:
    """(the phase the signal stopped `trial` in, what went wrong there)."""
    code, err, out = trial.process.returncode, trial.stderr.read_text(), trial.stdout.read_text()
    runs = [p for p in (trial.folder / "results").glob("*") if (p / "run.json").is_file()]
    when = f"{trial.delay:.2f} s" + (f" after {trial.after!r}" if trial.after else "")
    said = f"SIGINT at {when}: exit {code}: {err[-1500:]!r}"
    problems = [] if code in (0, 130) else [said]
    if "internal error" in err or ("Fatal Python error" in err and code != 1):
        problems.append(said)
    if _leftovers(trial.folder):
        problems.append(f"{said}: left {_leftovers(trial.folder)}")
    if code in (-signal.SIGINT, 1) and "in run_module" not in err and not runs and not out:
        # Python itself was starting (its site module, runpy), before any of the command's
        # code: it dies by SIGINT, as any program does then, or fails to start (exit 1)
        starting = (err == "" or err.startswith("Traceback")) if code < 0 else \
            err.startswith("Fatal Python error: init_import_site")
        return "before the command", [] if starting else [said]
    if not runs:  # stopped before the run existed
        if _reported_cells(err) or not ("nothing was done" in err or "stopped, after" in err):
            problems.append(f"{said}: no run, yet cells reported or no word of the stop")
        return "before the run", problems
    (folder,) = runs
    run = load_run(folder)
    if not _reported_cells(err) <= _cells(run):
        problems.append(f"{said}: reported cells missing from the run")
    status = run.metadata["status"]
    if code == 0:
        if status != "complete" or _cells(run) != ALL_CELLS or not (
                trial.folder / "reports" / run.run_id / "index.html").is_file():
            problems.append(f"{said}: exit 0 without a complete run and its report")
        return "after the work", problems
    if status not in ("complete", "interrupted"):
        problems.append(f"{said}: the run reads {status}")
    if status == "interrupted":
        resumed = main(["--resume", str(folder), "--no-report"])
        run = load_run(folder)
        if resumed != 0 or run.metadata["status"] != "complete" or _cells(run) != ALL_CELLS \
                or len(run.summary) != 2 * tiny.CASES + 1:
            problems.append(f"{said}: --resume did not complete it ({resumed})")
        return "in the cells", problems
    return "in the report", problems


@pytest.mark.integration
@pytest.mark.parametrize("share", [0.05, pytest.param(1.0, marks=pytest.mark.long)],
                         ids=["10-moments", "100-moments"])
def test_sigint_at_any_moment_of_a_whole_run_ends_in_130_and_loses_nothing(tmp_path, share):
    """SIGINT at 100 moments (`-m long`; 2 of each kind, 10 in all, in CI) across the whole life
    of `python -m harness.run` with its report: 10 in its first second, 10 around its last,
    40 anywhere, and (so that a busy machine's slower start-up cannot crowd them out) 15
    among its cells and 25 after its last cell, in the report and the interpreter's exit. Every process ends
    in 130 after cleaning up (0 when the signal came after it had finished its work, as
    the interpreter exited), never 1, 2, 3 or a crash (134, 139): a signal while the
    command loads, works, writes its report or exits. Only while Python itself starts,
    before any of the command's code, does it end as any Python program then does: killed
    by SIGINT (-2, which a shell shows as 130) or failing to import its site module (1),
    with nothing created. Every cell a run said it measured is in its results, nothing is
    left half-written (no temp file, staging folder or lock), and `--resume` completes
    every run that was stopped."""
    started = time.monotonic()  # two whole runs side by side, as the trials run: how long
    whole = [_Trial(tmp_path / f"whole{i}", 3600.0) for i in range(2)]
    assert [w.process.wait(timeout=600) for w in whole] == [0, 0]
    life = time.monotonic() - started
    rng = random.Random(20261127)
    first, last = f"[ 1/{tiny.CASES}]", f"[{tiny.CASES}/{tiny.CASES}]"
    def n(count: int) -> int:
        return max(2, round(count * share))

    moments = ([(rng.uniform(0.0, 1.0), None) for _ in range(n(10))]
               + [(rng.uniform(life - 1.0, life + 0.2), None) for _ in range(n(10))]
               + [(rng.uniform(0.0, 0.5), first) for _ in range(n(15))]  # among the cells
               + [(rng.uniform(0.0, 3.0), last) for _ in range(n(25))]  # the report, the exit
               + [(rng.uniform(0.0, life), None) for _ in range(n(40))])
    phases, problems = {}, []
    for trial in _run_trials(tmp_path, moments):
        phase, found = _judge(trial)
        phases[phase] = phases.get(phase, 0) + 1
        problems += found
    assert problems == [], (phases, problems)
    # the moments covered every phase of the run's life
    assert {"before the run", "in the cells", "in the report"} <= set(phases), phases


@pytest.mark.integration
def test_interrupt_inside_a_variant_keeps_finished_cells_then_resume(tmp_path, reference, monkeypatch):
    """Ctrl-C raised inside the 4th cell: cells 1-3 are kept, the run says interrupted, and
    --resume measures exactly the 7 that are missing."""
    registry.load_findings_module(MODULE)
    finding = registry.FINDINGS["TINY-sums"]
    built: list[str] = []  # the cases built (the headline cell builds twice: its placebo)
    original_build = finding.build

    def build(case, device, seed):
        if case.label not in built:
            built.append(case.label)
        if len(built) == 4:
            raise KeyboardInterrupt
        return original_build(case, device, seed)

    monkeypatch.setitem(registry.FINDINGS, "TINY-sums",
                        __import__("dataclasses").replace(finding, build=build))
    assert main(RUN + ["--out", str(tmp_path)]) == 130
    run = load_run(None, tmp_path)
    assert run.metadata["status"] == "interrupted"
    assert len(_cells(run)) == 3 and run.metadata["cells_total"] == tiny.CASES
    document = json.loads((run.folder / "run.json").read_text())
    # the finished run.json holds the journal's rows too (and the headline's placebo)
    assert len(document["summary"]) == 7

    monkeypatch.setitem(registry.FINDINGS, "TINY-sums", finding)
    assert main(["--resume", run.run_id, "--out", str(tmp_path), "--no-report"]) == 0
    assert _cells(load_run(run.folder)) == reference


@pytest.mark.integration
def test_sigterm_exits_143_and_keeps_the_run(tmp_path):
    process = _start(tmp_path)
    for line in process.stderr:  # the first cell is journaled
        if line.startswith("["):
            break
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    run = load_run(None, tmp_path)
    assert run.metadata["status"] == "interrupted" and run.metadata["cells_done"] >= 1
    assert f"--resume {run.run_id}" in err


@pytest.mark.integration
def test_a_reader_that_closes_the_pipe_and_sigpipe_at_random_moments_lose_nothing(tmp_path):
    """`harness.run | head -1`: the reader takes one line of the table and closes the pipe;
    each run also gets SIGPIPE at a random moment (Python ignores it, so the write that
    follows raises BrokenPipeError instead). Every run still finishes its work: exit 0,
    every cell in its results, the report rendered."""
    rng = random.Random(20261125)
    for trial in range(3):
        out = tmp_path / f"trial{trial}"
        run = [arg for arg in RUN if arg != "--no-report"]
        process = subprocess.Popen([sys.executable, "-m", "harness.run", *run, "--out", str(out)],
                                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.2, 2.0))
        process.send_signal(signal.SIGPIPE)
        process.stdout.readline()
        process.stdout.close()  # the reader is gone: later writes to stdout break the pipe
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=300) == 0, stderr
        done = load_run(None, out)
        assert done.metadata["status"] == "complete" and _cells(done) == ALL_CELLS
        assert (out.parent / "reports" / done.run_id / "index.html").is_file(), stderr


@pytest.mark.integration
def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path):
    process = _start(tmp_path)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "\r" not in err
    assert _reported_cells(err) == ALL_CELLS
    assert f"[ 1/{tiny.CASES}] TINY-sums n=256: " in err


@pytest.mark.integration
def test_concurrent_runs_into_one_folder_keep_both(tmp_path):
    first, second = _start(tmp_path), _start(tmp_path)
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0
    runs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(runs) == 2, runs
    for folder in runs:
        run = load_run(folder)
        assert run.metadata["status"] == "complete" and _cells(run) == ALL_CELLS
    assert (tmp_path / "latest").read_text().strip() in {p.name for p in runs}


def test_run_ids_are_unique_within_a_second(tmp_path):
    names = [create_run_folder(tmp_path, "20260101-000000-cpu").name for _ in range(3)]
    assert names == ["20260101-000000-cpu", "20260101-000000-cpu-2", "20260101-000000-cpu-3"]


@pytest.mark.integration
def test_killed_run_is_reported_killed_and_renders(tmp_path):
    process = _start(tmp_path)
    for line in process.stderr:
        if line.startswith("[ 2/"):
            break
    process.kill()
    process.wait()
    run = load_run(None, tmp_path)
    assert run.metadata["status"] == "killed"
    assert 2 <= run.metadata["cells_done"] < tiny.CASES
    page = render(run.folder, out=tmp_path / "report")
    assert "TINY-sums" in page.read_text()


# --- --resume refuses what it cannot continue -------------------------------------------

def _stop_after_the_first_cell(out: Path, monkeypatch) -> Path:
    """Run TINY-sums into `out`, interrupted (Ctrl-C) while building its second cell."""
    registry.load_findings_module(MODULE)
    finding = registry.FINDINGS["TINY-sums"]
    seen = []

    def build(case, device, seed):
        seen.append(case)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return finding.build(case, device, seed)

    monkeypatch.setitem(registry.FINDINGS, "TINY-sums",
                        __import__("dataclasses").replace(finding, build=build))
    assert main(RUN + ["--out", str(out)]) == 130
    monkeypatch.setitem(registry.FINDINGS, "TINY-sums", finding)
    return load_run(None, out).folder


@pytest.fixture
def stopped_run(tmp_path, monkeypatch) -> Path:
    """A TINY-sums run interrupted after its first cell."""
    return _stop_after_the_first_cell(tmp_path, monkeypatch)


@pytest.mark.parametrize("extra, message", [
    (["--seed", "5"], "--seed: the run was measured with 0; got 5"),
    (["--budget", "2"], "--budget: the run was measured with 1.0; got 2.0"),
    (["--quick"], "--quick: the run was measured with False; got True"),
])
@pytest.mark.integration
def test_resume_refuses_other_options(stopped_run, extra, message, capsys):
    before = sorted(p.name for p in (stopped_run / "cells").iterdir())
    assert main(["--resume", str(stopped_run), "--no-report", *extra]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in (stopped_run / "cells").iterdir()) == before


@pytest.mark.integration
def test_resume_refuses_another_machine_or_commit(stopped_run, capsys):
    path = stopped_run / "run.json"
    document = json.loads(path.read_text())
    for field, value, message in (("cpu_model", "a faster CPU", "expected the machine"),
                                  ("git_commit", "0" * 40, "expected the code the run measured")):
        changed = {**document, field: value}
        path.write_text(json.dumps(changed))
        assert main(["--resume", str(stopped_run), "--no-report"]) == 2
        assert message in capsys.readouterr().err
    path.write_text(json.dumps(document))
    assert main(["--resume", str(stopped_run), "--no-report"]) == 0


@pytest.mark.integration
def test_resume_keeps_the_runs_thread_count(stopped_run):
    """A run started without --threads ran with torch's count then; its resume pins that
    count, not the resuming process's (which other code may have changed), so the machine
    check compares like with like and the resumed cells use the same threads."""
    recorded = load_run(stopped_run).metadata["threads"]
    before = torch.get_num_threads()
    torch.set_num_threads(recorded + 1)
    try:
        assert main(["--resume", str(stopped_run), "--no-report"]) == 0
        assert torch.get_num_threads() == recorded + 1  # restored after the run
    finally:
        torch.set_num_threads(before)
    assert load_run(stopped_run).metadata["threads"] == recorded


@pytest.mark.integration
def test_the_resume_hint_pastes_as_it_is_printed_with_spaces_in_the_path(tmp_path, monkeypatch,
                                                                        capsys):
    """The hint printed on Ctrl-C quotes its paths: split as a shell would, it resumes the run."""
    out = tmp_path / "my results (copy)"
    _stop_after_the_first_cell(out, monkeypatch)
    hint = next(line for line in capsys.readouterr().err.splitlines()
                if "continue with: " in line).split("continue with: ", 1)[1]
    argv = __import__("shlex").split(hint)
    assert argv[:3] == ["python", "-m", "harness.run"] and str(out) in argv
    assert main(argv[3:] + ["--no-report"]) == 0
    assert load_run(None, out).metadata["status"] == "complete"


@pytest.mark.integration
def test_resume_refuses_a_running_run(stopped_run, capsys):
    path = stopped_run / "run.json"
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "status": "running", "pid": os.getpid(),
                                "process_start": None}))
    assert main(["--resume", str(stopped_run), "--no-report"]) == 2
    assert "still running" in capsys.readouterr().err


# --- bad input: corrupt files, bad paths ---------------------------------------------

def test_corrupt_run_json_names_the_file_and_says_truncated(tmp_path, capsys):
    folder = tmp_path / "20260101-000000-cpu"
    folder.mkdir()
    (folder / "run.json").write_text('{"schema_version": 1, "status": "comp')
    with pytest.raises(RunFileError, match=r"run\.json: not valid JSON.*looks truncated"):
        load_run(folder)
    (folder / "run.json").write_bytes(b"\xff\xfe garbage")
    with pytest.raises(RunFileError, match="not UTF-8"):
        load_run(folder)
    assert main(["--resume", str(folder), "--out", str(tmp_path)]) == 2
    assert "run.json" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--out", "--reports"])
def test_unwritable_paths_fail_before_measuring(tmp_path, option, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for bad in (a_file, Path("/proc/esper-bench-cannot-be-here")):
        args = RUN[:-1] + [option, str(bad)] + (["--out", str(tmp_path / "r")] if option != "--out" else [])
        assert main(args) == 2
        err = capsys.readouterr().err
        assert option in err and str(bad) in err
    assert not (tmp_path / "r").exists()  # nothing was measured


def test_empty_paths_are_usage_errors(capsys):
    for option in ("--out", "--reports"):
        assert main([option, ""]) == 2
        assert f"argument {option}: expected a path; got ''" in capsys.readouterr().err


def test_bad_device_names_are_usage_errors(capsys):
    for name, message in (("tpu", "expected auto, cpu, cuda or cuda:N"),
                          ("cuda:7", "cuda")):
        assert main(["--device", name, "--findings", "B4-DRL-03"]) == 2
        assert message in capsys.readouterr().err


# --- a full disk ---------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 16 KiB tmpfs: a real full disk. Needs root (or CAP_SYS_ADMIN) to mount."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.integration
def test_full_disk_leaves_no_temp_file_and_names_device_and_file(small_disk):
    target = small_disk / "run.json"
    with pytest.raises(DiskFullError) as err:
        atomic_write_text(target, "x" * 200_000)
    message = str(err.value)
    assert message.startswith("no space left on tmpfs (mounted at ") and str(target) in message
    assert list(small_disk.iterdir()) == []  # the temp file is gone: the disk is not kept full


def test_a_signal_as_the_temp_file_is_created_leaves_no_temp_file(tmp_path, monkeypatch):
    """Ctrl-C lands where it will: here the moment the temp file exists, before anything is
    written to it (with mkstemp, its name came back only after the file existed, and a
    report interrupted there left `.report.json.PID.XXXX.tmp`). The target is untouched
    and nothing is left behind."""
    target = tmp_path / "report.json"
    target.write_text("old")
    real_open = os.open

    def open_then_interrupted(*args, **kwargs):
        os.close(real_open(*args, **kwargs))
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "open", open_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(target, "new")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    assert target.read_text() == "old"


@pytest.mark.integration
def test_run_on_a_full_disk_exits_2_with_the_file(small_disk, capsys):
    code = main(RUN + ["--out", str(small_disk)])
    assert code == 2
    err = capsys.readouterr().err
    assert "no space left on tmpfs" in err and str(small_disk) in err
    assert not [p for p in small_disk.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.integration
def test_a_disk_that_fills_while_a_trace_is_written_is_a_usage_error_naming_it(small_disk):
    """The profile of 200 small ops makes a trace larger than the 16 KiB disk: the cell
    stops with DiskFullError (exit 2 in the command) naming the trace, no temp file left."""
    from harness.findings import Case, Finding
    from harness.runner import CaseRun, RunOptions

    def make_call(variant, x):
        def call():
            for _ in range(200):
                x.add_(1.0)
            return x
        return call

    finding = Finding(id="TEST-big-trace", title="many ops", claim="-", variants=("a",),
                      baseline="a", cases=[Case.of(n=8)],
                      build=lambda case, device, seed: torch.zeros(case["n"]),
                      make_call=make_call)
    options = RunOptions(device=torch.device("cpu"), min_samples=2)
    target = small_disk / "traces" / "TEST-big-trace.json.gz"
    with pytest.raises(DiskFullError, match=f"no space left on tmpfs .* while writing {target}"):
        CaseRun(finding, Case.of(n=8), options, sampling_s=0.02).run(target)
    assert not [p for p in small_disk.rglob("*") if p.is_file()]


def test_writer_finish_rejects_unknown_status(tmp_path):
    writer = RunWriter.create(tmp_path, "x", {})
    with pytest.raises(ValueError, match="status: expected one of"):
        writer.finish("done")
