"""Cells measured in more than one fresh process: `Finding.between_runs`, the replica
processes (`harness.replica`) and how the runner combines their rounds."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from harness import findings as registry
from harness.findings import Case, CaseNoise, Finding
from harness.measure.estimate import PROCESS_SD_DF, ProcessNoise, paired_estimate
from harness.replica import (
    CARRIED_OPTIONS, ReplicaSpec, load_replica, replicas_for, run_replica,
)
from harness.results import load_run
from harness.run import main
from harness.runner import CaseRun, RunOptions

MODULE = "tests.findings_modules.noisy_cells"


@pytest.fixture(autouse=True)
def in_a_users_folder(outside_the_repository):
    """Runs name their findings module alone, from a folder of the user's (conftest.py)."""


def _finding(**changes) -> Finding:
    fields = dict(
        id="NOISE-unit", title="t", claim="c", variants=("sum", "double"), baseline="sum",
        cases=lambda quick: [Case.of(n=4096)],
        build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64),
        make_call=lambda v, x: (lambda: x.sum()) if v == "sum" else (lambda: (x + x).sum() / 2),
        check=registry.max_abs_difference)
    return Finding(**{**fields, **changes})


@pytest.mark.parametrize("table, field", [
    ({"n=4096": {"sd": {"triple": 0.1}}}, "between_runs['n=4096'].sd"),
    ({"n=4096": {"sd": {"double": 1.5}}}, "between_runs['n=4096'].sd['double']"),
    ({"n=4096": {"sd": {"double": float("nan")}}}, "between_runs['n=4096'].sd['double']"),
    ({"n=4096": {"sd": {}, "processes": 0}}, "between_runs['n=4096'].processes"),
    ({"n=4096": {"sd": {}, "processes": 9}}, "between_runs['n=4096'].processes"),
    ({"n=4096": {"sd": {}, "processes": True}}, "between_runs['n=4096'].processes"),
    ({"n=4096": {"sd": {}, "spread": 2}}, "between_runs['n=4096']"),
    ({"n=4096": {"processes": 2}}, "between_runs['n=4096']"),
    ({"n=4096": 0.1}, "between_runs['n=4096']"),
    ([("n=4096", 0.1)], "between_runs"),
])
def test_a_bad_between_runs_declaration_fails_at_registration_naming_the_field(table, field):
    with pytest.raises(ValueError) as caught:
        _finding(between_runs=table)
    assert f"'NOISE-unit': {field}: expected" in str(caught.value)


def test_a_between_runs_dict_becomes_case_noise():
    finding = _finding(between_runs={"n=4096": {"sd": {"double": 0.1}, "processes": 3}})
    assert finding.between_runs == {"n=4096": CaseNoise({"double": 0.1}, 3)}


def test_a_replica_measures_with_every_option_of_the_run_it_does_not_set_itself():
    options = RunOptions(device=torch.device("cpu"), quick=True, seed=7, time_budget_s=0.3,
                         min_samples=5, max_samples=40, margin=0.1, precision=0.01,
                         placebo="all", processes=3)
    spec = ReplicaSpec.of([("F", "n=1", True)], options, threads=2, findings_modules=None)
    assert {name: getattr(spec, name) for name in CARRIED_OPTIONS} == {
        name: getattr(options, name) for name in CARRIED_OPTIONS}
    assert (spec.device, spec.threads, spec.parent) == ("cpu", 2, os.getpid())
    # a new run option must be carried or named here as set by the replica itself
    set_by_the_replica = {"device", "process_noise", "profile", "sources",
                          "copy_bandwidth_bytes_per_s"}
    assert {f.name for f in dataclasses.fields(RunOptions)} == (
        set(CARRIED_OPTIONS) | set_by_the_replica)


def test_run_options_share_the_budget_and_carry_the_declared_spread():
    finding = _finding(between_runs={"n=4096": CaseNoise({"double": 0.2}, processes=2)})
    noisy, quiet = Case.of(n=4096), Case.of(n=64)
    options = RunOptions(device=torch.device("cpu"), time_budget_s=1.0)
    assert options.cell_processes(finding, noisy) == 2
    assert options.cell_processes(finding, quiet) == 1
    assert dataclasses.replace(options, processes=1).cell_processes(finding, noisy) == 1
    assert dataclasses.replace(options, processes=4).cell_processes(finding, quiet) == 1
    assert options.sampling(finding, noisy).time_budget_s == pytest.approx(0.5)
    assert options.sampling(finding, quiet).time_budget_s == pytest.approx(1.0)
    model = ProcessNoise()(1e-5)
    sampling = options.sampling(finding, noisy)
    assert sampling.process_sd("double", 1e-5) == 0.2  # declared, above the model
    assert sampling.process_sd("sum", 1e-5) == model  # not declared: the model
    assert options.sampling(finding, quiet).process_sd("double", 1e-5) == model


def _replica_of(cell: CaseRun, scale: float) -> dict:
    """A second process's rounds of `cell`: its own samples with the variant `scale`x
    slower, standing in for a replica process (whose real run the tests below make)."""
    samples = {v: list(m.samples) for v, m in cell.measurements.items()}
    samples["double"] = [s * scale for s in samples["double"]]
    return {"samples": samples}


def test_the_runner_combines_its_rounds_with_the_replicas_two_level(one_thread):
    finding = _finding(between_runs={"n=4096": CaseNoise({"double": 0.2}, processes=2)})
    options = RunOptions(device=torch.device("cpu"), time_budget_s=0.1, min_samples=5,
                         profile=False, placebo="none")
    alone = CaseRun(finding, Case.of(n=4096), options).run()
    replica = _replica_of(alone, 1.3)
    cell = CaseRun(finding, Case.of(n=4096), options, replicas=[replica]).run()
    (row,) = [r for r in cell.summary if r["variant"] == "double"]
    own = (cell.measurements["double"].samples,
           cell.measurements["sum"].samples[:cell.measurements["double"].n])
    other = (replica["samples"]["double"], replica["samples"]["sum"][:len(replica["samples"]["double"])])
    expected = paired_estimate([own, other], process_sd=0.2, prior_df=PROCESS_SD_DF)
    assert row["processes"] == 2 and row["process_sd"] == 0.2
    assert row["ratio"] == pytest.approx(expected.ratio)
    low, high = expected.interval(row["ci_level"])
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    # the replica read the variant 30% slower than the first run: the combined ratio lies
    # between the two processes' own estimates (the same estimator, so no load can move it)
    each = sorted(paired_estimate([rounds]).ratio for rounds in (own, other))
    assert each[0] < row["ratio"] < each[1]


def test_a_replica_that_failed_leaves_the_row_to_its_own_process_and_says_so(one_thread):
    finding = _finding(between_runs={"n=4096": CaseNoise({"double": 0.2}, processes=3)})
    options = RunOptions(device=torch.device("cpu"), time_budget_s=0.05, min_samples=5,
                         profile=False, placebo="none")
    alone = CaseRun(finding, Case.of(n=4096), options).run()
    missing_variant = {"samples": {"sum": list(alone.measurements["sum"].samples)},
                       "failed": {"double": "RuntimeError: boom"}}
    cell = CaseRun(finding, Case.of(n=4096), options,
                   replicas=[{"error": "the replica process failed (exited with 1)"},
                             missing_variant]).run()
    (row,) = [r for r in cell.summary if r["variant"] == "double"]
    assert row["processes"] == 1
    assert row["process_note"] == ("process 2: the replica process failed (exited with 1); "
                                   "process 3: RuntimeError: boom")


def test_kept_replicas_are_not_measured_again(tmp_path):
    kept = {"cells": [{"finding": "F", "case": "a", "samples": {"x": [1.0, 2.0]}, "failed": {}}]}
    (tmp_path / "replicas").mkdir()
    (tmp_path / "replicas" / "replica1.json").write_text(json.dumps(kept))

    def never(cells):
        raise AssertionError(f"a replica of {cells} was started again")

    found = replicas_for([("F", "a", False, 2), ("F", "b", False, 1)], tmp_path, never)
    assert found == {("F", "a"): [kept["cells"][0]], ("F", "b"): []}


def test_a_replica_that_cannot_start_its_findings_is_an_error_per_cell_kept_on_disk(tmp_path):
    spec = ReplicaSpec(cells=(("NOISE-tiny", "n=4096", False),),
                       findings_modules=("tests.findings_modules.no_such_module",),
                       parent=None)
    found = run_replica(spec, tmp_path / "replica1.json")
    (entry,) = found.values()
    assert entry["error"].startswith("the replica process failed (exited with 2: error: "
                                     "--findings-module tests.findings_modules.no_such_module")
    assert "no_such_module" in entry["error"]
    assert load_replica(tmp_path / "replica1.json") == found


def test_a_run_measures_a_declared_cell_in_a_replica_and_combines_it(tmp_path, capsys):
    code = main(["--findings-module", MODULE, "--time-budget", "0.1", "--device", "cpu",
                 "--no-report", "--threads", "1", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    run = load_run(None, tmp_path)
    assert "replica 1 of 1: 1 cells in a fresh process" in capsys.readouterr().err
    rows = run.summary.set_index(["case", "variant"])
    assert rows.loc[("n=4096", "double"), "processes"] == 2
    assert rows.loc[("n=4096", "double"), "process_sd"] == 0.2
    assert rows.loc[("n=64", "double"), "processes"] == 1  # not declared: one process
    (kept,) = load_replica(run.folder / "replicas" / "replica1.json").values()
    assert kept["case"] == "n=4096" and len(kept["samples"]["double"]) >= 5
    # the row is the two processes' estimate: its own rounds (journaled) and the replica's
    samples = run.rows[run.rows["case"] == "n=4096"]
    own = [samples[samples["variant"] == v].sort_values("round")["seconds"].to_numpy()
           for v in ("double", "sum")]
    other = [np.asarray(kept["samples"][v]) for v in ("double", "sum")]
    expected = paired_estimate([(own[0], own[1][:len(own[0])]),
                                (other[0], other[1][:len(other[0])])], process_sd=0.2,
                               prior_df=PROCESS_SD_DF)
    assert rows.loc[("n=4096", "double"), "ratio"] == pytest.approx(expected.ratio)
    assert run.metadata["processes"] is None


def test_processes_one_measures_every_cell_in_the_runs_own_process(tmp_path):
    code = main(["--findings-module", MODULE, "--time-budget", "0.05", "--device", "cpu",
                 "--no-report", "--processes", "1", "--out", str(tmp_path)])
    assert code == 0
    run = load_run(None, tmp_path)
    assert not (run.folder / "replicas").exists()
    assert set(run.summary["processes"].dropna()) == {1}
    assert run.metadata["processes"] == 1


@pytest.mark.parametrize("value", ["0", "9", "two"])
def test_a_bad_processes_option_exits_2_naming_it(value, capsys):
    assert main(["--findings-module", MODULE, "--processes", value, "--no-report"]) == 2
    assert "--processes: expected an integer" in capsys.readouterr().err


def test_kept_seconds_reads_each_replicas_wall_time(tmp_path):
    from harness.replica import kept_seconds

    (tmp_path / "replicas").mkdir()
    (tmp_path / "replicas" / "replica1.json").write_text(json.dumps({"cells": [], "seconds": 7.5}))
    (tmp_path / "replicas" / "replica2.json").write_text("{not json")
    assert kept_seconds(tmp_path) == [7.5]
    assert kept_seconds(tmp_path / "nowhere") == []


def test_a_replica_with_too_few_rounds_adds_nothing_and_says_so(one_thread):
    finding = _finding(between_runs={"n=4096": CaseNoise({"double": 0.2}, processes=2)})
    options = RunOptions(device=torch.device("cpu"), time_budget_s=0.05, min_samples=5,
                         profile=False, placebo="none")
    short = {"samples": {"sum": [1e-5, 1e-5, 1e-5], "double": [2e-5]}}
    cell = CaseRun(finding, Case.of(n=4096), options, replicas=[short]).run()
    (row,) = [r for r in cell.summary if r["variant"] == "double"]
    assert row["processes"] == 1
    assert row["process_note"] == "process 2: 1 rounds, against 3 of sum"


def _replicas_of(pid: int) -> list[int]:
    """Pids of live `harness.replica` processes whose parent is `pid` (from /proc)."""
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
def test_a_run_stopped_while_its_replica_measures_leaves_no_replica_behind(tmp_path, signum):
    """SIGTERM: the run kills the replica's process group and exits 143; SIGKILL: the
    kernel kills the replica with its parent (PR_SET_PDEATHSIG). Either way a resumed run
    measures the replica again and completes."""
    run = subprocess.Popen(
        [sys.executable, "-m", "harness.run", "--findings-module", MODULE, "--time-budget", "1",
         "--device", "cpu", "--no-report", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    replicas = []
    while not replicas and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
        replicas = _replicas_of(run.pid)
    assert replicas, "no replica process started"
    time.sleep(0.5)
    run.send_signal(signum)
    out, err = run.communicate(timeout=60)
    assert run.returncode == (143 if signum == signal.SIGTERM else -signal.SIGKILL), err
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in replicas) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in replicas), "the replica outlived its run"
    assert main(["--resume", "latest", "--out", str(tmp_path)]) == 0
    resumed = load_run(None, tmp_path)
    assert resumed.metadata["status"] == "complete"
    assert resumed.summary.set_index(["case", "variant"]).loc[("n=4096", "double"), "processes"] == 2


@pytest.mark.parametrize("argv, message", [
    ([], "expected one argument, a replica spec as JSON"),
    (["{not json"], "SPEC_JSON: expected the fields of harness.replica.ReplicaSpec"),
    (['{"cells": [], "colour": 1}'], "SPEC_JSON: expected the fields"),
    (['{"seed": 1}'], "SPEC_JSON: expected the fields"),
])
def test_a_bad_replica_spec_exits_2_naming_it(argv, message, capsys):
    from harness.replica import main as replica_main

    assert replica_main(argv) == 2
    assert message in capsys.readouterr().err
