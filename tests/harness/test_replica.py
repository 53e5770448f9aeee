"""Every cell timed in two or more fresh processes: the workers (`harness.replica`), how a
run interleaves them with its own process, and how their rounds come back into its rows
(`harness.combine`). Real worker processes throughout; what one cannot show here (a
worker on another machine) is not claimed."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.combine import combine
from harness.replica import Worker, WorkerError, WorkerSpec, answering_order
from harness.results import load_run, read_cells
from harness.run import main
from harness.runner import RunOptions

MODULE = "tests.findings_modules.noisy_cells"


@pytest.fixture(autouse=True)
def in_a_users_folder(outside_the_repository):
    """Runs name their findings module alone, from a folder of the user's (conftest.py)."""


def _spec(**changes) -> WorkerSpec:
    options = RunOptions(device=torch.device("cpu"), quick=True, min_samples=5)
    return dataclasses.replace(WorkerSpec.of(options, 1, [MODULE], 2), **changes)


@pytest.mark.integration
def test_a_worker_times_a_cell_as_the_run_does_and_its_findings_prints_stay_out():
    worker = Worker(_spec())
    try:
        done = worker.measure("NOISE-tiny", "n=4096", False, 0.05, ["sum", "double"])
        again = worker.measure("NOISE-tiny", "n=64", True, 0.05, ["sum", "double", "placebo"])
    finally:
        worker.close()
    assert done["failed"] == {} and done["seconds"] > 0 and "time" in done["stages"]
    by_variant = {}
    for row in done["samples"]:
        assert row["process"] == 2 and row["finding"] == "NOISE-tiny" and row["case"] == "n=4096"
        by_variant.setdefault(row["variant"], []).append(row["round"])
    assert set(by_variant) == {"sum", "double"} and len(by_variant["sum"]) >= 5
    assert by_variant["sum"][:len(by_variant["double"])] == by_variant["double"]
    # the headline cell also times the placebo, as the run's own process would
    assert {r["variant"] for r in again["samples"]} == {"sum", "double", "placebo"}
    assert worker.process.returncode is not None  # ended with its input


@pytest.mark.integration
def test_a_worker_times_only_the_variants_the_runs_process_found_correct():
    worker = Worker(_spec())
    try:
        done = worker.measure("NOISE-tiny", "n=64", False, 0.02, ["sum"])
    finally:
        worker.close()
    assert {r["variant"] for r in done["samples"]} == {"sum"}


@pytest.mark.integration
@pytest.mark.slow  # builds inductor's ISA check libraries into an empty cache: 5-10 s
def test_a_worker_told_to_run_inductors_checks_runs_them_and_then_its_next_cell(
        tmp_path, monkeypatch):
    """`run_inductor_checks` (sent in a cold run once a warm-up process has ended): the
    worker builds inductor's vector-ISA check libraries into its cache while it waits, says
    nothing for it, and answers the next command as ever. (That its first compiled call
    is then seconds shorter is a timing, measured in a cold run, not here.)"""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    worker = Worker(_spec())
    try:
        worker.run_inductor_checks()
        done = worker.measure("NOISE-tiny", "n=64", False, 0.02, ["sum"])
    finally:
        worker.close()
    assert {r["variant"] for r in done["samples"]} == {"sum"} and done["failed"] == {}
    from torch._inductor.cpu_vec_isa import x86_isa_checker

    if sys.platform.startswith("linux") and x86_isa_checker():  # a CPU inductor checks
        assert list(cache.rglob("*.so")), "the worker built no ISA check library"


@pytest.mark.integration
def test_a_worker_loads_while_the_run_goes_on_and_is_ready_when_asked():
    """The run starts its worker before preparing its first cell: the worker's imports
    (seconds) overlap the run's, and nothing is timed until it is ready."""
    launched = time.perf_counter()
    worker = Worker(_spec())
    try:
        assert worker.startup_s is None  # started, not waited for
        assert select.select([worker.process.stdout], [], [], 60)[0]  # it says it is ready
        said = time.perf_counter() - launched
        time.sleep(1.0)  # the run reads the line late (it was preparing a cell)
        worker.ready()
        # the wall seconds of its start (interpreter, torch, the findings), by its own
        # clock: not the second the run took to read the line
        assert 0 < worker.startup_s <= said + 0.05
        worker.ready()  # once ready, at once
    finally:
        worker.close()


def _logged_run(tmp_path: Path, monkeypatch, variable: str, threads: int) -> list[list[str]]:
    """A small run of the noisy-cells module (results in tmp_path/out) with its log
    `variable` set: the lines the run's processes logged, split."""
    log = tmp_path / f"{variable}.log"
    monkeypatch.setenv(variable, str(log))
    assert main(["--findings-module", MODULE, "--budget", "4", "--every-cell", "--device", "cpu",
                 "--no-report", "--no-profile", "--threads", str(threads), "--out",
                 str(tmp_path / "out")]) == 0
    return [line.split() for line in log.read_text().splitlines()]


@pytest.mark.integration
def test_a_worker_leaves_extra_metrics_to_the_runs_process(tmp_path, monkeypatch):
    """A worker's samples are all the run reads of it: only the run's own process computes
    a finding's extra metrics (a copy count under a dispatch mode took 11 s a process)."""
    calls = _logged_run(tmp_path, monkeypatch, "NOISE_EXTRA_LOG", threads=1)
    assert {pid for pid, _ in calls} == {str(os.getpid())}, calls  # the run runs in-process
    assert sorted(variant for _, variant in calls) == ["double", "double", "sum", "sum"]
    summary = [r for c in read_cells(load_run(None, tmp_path / "out").folder) for r in c["summary"]]
    assert {r["elements"] for r in summary if r["variant"] != "placebo"} == {64.0, 4096.0}


@pytest.mark.integration
def test_a_worker_prepares_a_cell_before_it_is_told_which_variants_to_time():
    """The run's process and its worker prepare a cell at once (first calls: compiling
    takes seconds); the worker times only what the run's process then found correct, and
    its seconds leave out the wait in between."""
    worker = Worker(_spec())
    try:
        began = time.perf_counter()
        worker.prepare("NOISE-tiny", "n=64", True, 1)
        assert set(worker.prepared()) == {"prepared"}
        time.sleep(1.0)  # the run's process checks and times meanwhile
        done = worker.measure_prepared(0.02, ["sum", "placebo"], 5)
        wall = time.perf_counter() - began
        worker.prepare("NOISE-tiny", "n=5", False, 1)  # a case the worker has not
        refused = worker.prepared()
        nothing = worker.measure_prepared(0.02, ["sum"])
        worker.prepare("NOISE-tiny", "n=64", False, 1)  # and on after it
        worker.prepared()
        released = worker.measure_prepared(0.02, [])
    finally:
        worker.close()
    assert (done["finding"], done["case"]) == ("NOISE-tiny", "n=64") and done["failed"] == {}
    assert {r["variant"] for r in done["samples"]} == {"sum", "placebo"}
    assert len([r for r in done["samples"] if r["variant"] == "sum"]) >= 5
    assert 0 < done["seconds"] < wall - 1.0, (done["seconds"], wall)
    assert refused == {"error": "ValueError: NOISE-tiny has no case 'n=5' here",
                       "finding": "NOISE-tiny", "case": "n=5"}
    assert nothing == {"error": "the worker has no prepared cell"}
    assert released["samples"] == [] and released["failed"] == {}


@pytest.mark.integration
def test_a_worker_that_cannot_load_its_findings_says_why():
    worker = Worker(_spec(findings_modules=("tests.findings_modules.no_such_module",)))
    with pytest.raises(WorkerError, match=r"worker 2 could not start: .*tests\.findings_modules"
                                          r"\.no_such_module"):
        worker.ready()
    assert worker.process.poll() is not None  # closed with it


@pytest.mark.integration
def test_the_processes_preparing_a_cell_at_once_share_the_cores(tmp_path, monkeypatch):
    """The run's process and its worker build and first-call each cell at the same time:
    at 2 torch threads each on 2 cores, a training iteration's first calls took 40 s
    where they take 5. Each prepares at 2 // 2 = 1 thread; the timing keeps its 2."""
    builds = _logged_run(tmp_path, monkeypatch, "NOISE_THREADS_LOG", threads=2)
    # the run's process and its worker, each preparing both cells (later processes, such
    # as the one-thread ones, time a cell alone)
    pair = list(dict.fromkeys(pid for pid, _ in builds))[:2]
    prepared = [threads for pid, threads in builds if pid in pair]
    assert len(prepared) == 4 and set(prepared) == {"1"}, builds
    (run,) = (f.parent for f in (tmp_path / "out").glob("*/run.json"))
    assert load_run(run).metadata["threads"] == 2  # what it timed at


@pytest.mark.integration
def test_a_cell_the_worker_cannot_run_is_that_cells_error():
    worker = Worker(_spec())
    try:
        done = worker.measure("NOISE-tiny", "n=5", False, 0.02, ["sum"])
        still = worker.measure("NOISE-tiny", "n=64", False, 0.02, ["sum"])
    finally:
        worker.close()
    assert done["error"] == "ValueError: NOISE-tiny has no case 'n=5' here"
    assert still["samples"]


@pytest.mark.integration
def test_a_run_times_every_cell_in_two_processes_and_words_each_row_from_both(tmp_path, capsys):
    assert main(["--findings-module", MODULE, "--budget", "6", "--every-cell", "--device", "cpu",
                 "--no-report", "--threads", "1", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "plan: 2 cells, each timed in 2 processes, within 6 s" in err
    run = load_run(None, tmp_path)
    cells = read_cells(run.folder)
    for cell in cells:
        assert {s["process"] for s in cell["samples"]} >= {1, 2}
    rows = run.summary.set_index(["case", "variant"])
    assert (rows.loc[("n=4096", "double"), "processes"] >= 2
            and rows.loc[("n=64", "double"), "processes"] >= 2)
    # the row is the words of all its processes, as the run's files give them
    again = combine([r for c in cells for r in c["summary"]],
                    [r for c in cells for r in c["samples"]],
                    run.metadata["finding_info"], run.metadata["margin"])
    (row,) = [r for r in again.summary if (r["case"], r["variant"]) == ("n=4096", "double")]
    assert rows.loc[("n=4096", "double"), "ratio"] == pytest.approx(row["ratio"])
    level = run.metadata["process_level"]
    assert level["calibration"]["rows"] >= 2 and len(level["bands"]) == 3
    assert run.metadata["budget_s"] == 6.0 and run.metadata["seconds"] > 0


@pytest.mark.integration
def test_processes_three_times_every_cell_in_three(tmp_path):
    assert main(["--findings-module", MODULE, "--budget", "6", "--every-cell", "--device", "cpu",
                 "--no-report", "--processes", "3", "--out", str(tmp_path)]) == 0
    run = load_run(None, tmp_path)
    assert set(run.rows["process"]) >= {1, 2, 3}
    assert run.summary["processes"].dropna().min() >= 3


@pytest.mark.parametrize("value", ["0", "1", "7", "two"])
def test_a_bad_processes_option_exits_2_naming_it(value, capsys):
    assert main(["--findings-module", MODULE, "--processes", value, "--no-report"]) == 2
    assert "--processes: expected an integer" in capsys.readouterr().err


def _workers_of(pid: int) -> list[int]:
    """The pids of live worker processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"harness.replica" in command and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_stopped_while_its_worker_measures_leaves_no_worker_behind(tmp_path, signum):
    """SIGTERM: the run kills its workers' groups and exits 143; SIGKILL: the kernel kills
    each worker with its parent (PR_SET_PDEATHSIG). Either way a resumed run completes,
    every cell in two processes."""
    run = subprocess.Popen(
        [sys.executable, "-m", "harness.run", "--findings-module", MODULE, "--budget", "20", "--every-cell",
         "--device", "cpu", "--no-report", "--out", str(tmp_path)],
        # the finding prints in every call: a pipe nobody reads yet would fill and block it
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"), text=True)
    deadline = time.monotonic() + 60
    workers = []
    # a worker starts with the run's imports (a spare, `harness.spawn`): the signal comes
    # once the run has journaled a cell, its worker measuring the next
    while (not workers or not list(tmp_path.glob("*/cells/*.json"))) \
            and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
        workers = _workers_of(run.pid)
    assert workers, "no worker process started"
    assert list(tmp_path.glob("*/cells/*.json")), "no cell was journaled"
    run.send_signal(signum)
    run.wait(timeout=60)
    err = (tmp_path / "stderr").read_text()
    assert run.returncode == (143 if signum == signal.SIGTERM else -signal.SIGKILL), err
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in workers), "a worker outlived its run"
    assert main(["--resume", "latest", "--out", str(tmp_path)]) == 0
    resumed = load_run(None, tmp_path)
    assert resumed.metadata["status"] == "complete"
    assert resumed.summary["processes"].dropna().min() >= 2


@pytest.mark.parametrize("argv, message", [
    ([], "expected one argument, a worker spec as JSON"),
    (["{not json"], "SPEC_JSON: expected the fields of harness.replica.WorkerSpec"),
    (['{"colour": 1}'], "SPEC_JSON: expected the fields"),
])
def test_a_bad_worker_spec_exits_2_naming_it(argv, message, capsys):
    from harness.replica import main as replica_main

    assert replica_main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_worker_spec_carries_the_runs_sampling_options():
    options = RunOptions(device=torch.device("cpu"), quick=True, seed=7, min_samples=4,
                         max_samples=9, margin=0.1, precision=0.0, placebo="all")
    spec = WorkerSpec.of(options, 3, ["a.b"], 2)
    assert json.loads(json.dumps(spec.__dict__))["threads"] == 3
    carried = spec.options()
    for name in ("quick", "seed", "min_samples", "max_samples", "margin", "precision",
                 "placebo"):
        assert getattr(carried, name) == getattr(options, name), name
    assert carried.profile is False


@pytest.mark.integration
@pytest.mark.parametrize("module", ["harness.run", "harness.replica"])
def test_the_measuring_path_loads_no_statistics_library_before_its_first_cell(module):
    """The run's process and each worker import what timing a cell needs, not scipy.stats
    or statsmodels (seconds each on a 2-core machine): the words that need them are made
    after the cells are measured."""
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print(*sorted(m for m in sys.modules "
                               "if m.startswith(('scipy.stats', 'statsmodels'))))"],
        capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


def test_a_worker_imports_only_the_modules_that_registered_the_runs_findings():
    """A run of one user's finding does not make its workers import every module the
    project names (the review's imports torch's compiler: seconds per worker)."""
    from harness import findings as registry
    for module in ("esper_review", "tests.findings_modules.tiny"):
        registry.load_findings_module(module)
    both = ["esper_review", "tests.findings_modules.tiny"]
    assert registry.owners(["TINY-sums"], both) == ("tests.findings_modules.tiny",)
    assert registry.owners(["TINY-sums", "B4-CR-03"], both) == tuple(both)
    assert registry.owners(["NOPE"], both) == ()


def test_answers_are_taken_in_the_order_they_come_not_the_order_asked():
    """Three processes (standing in for workers: only their answer pipes are read) answer
    after 4 s, at once, and never (they end): the second and third come first (an end
    can be read at once), then the first."""
    scripts = ["import time; time.sleep(4); print('{}', flush=True)",
               "print('{}', flush=True)", "pass"]
    workers = [dataclasses.make_dataclass("Answering", ["process"])(subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True))
        for script in scripts]
    try:
        order = []
        for index in answering_order(workers):
            order.append(index)
            workers[index].process.stdout.readline()
        assert sorted(order[:2]) == [1, 2] and order[2] == 0, order
    finally:
        for worker in workers:
            worker.process.kill()
            worker.process.wait()
            worker.process.stdout.close()
