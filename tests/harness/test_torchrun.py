"""Scale-out with torchrun: one run sharded over ranks, merged into one result and one report.

Real launches of `torchrun --standalone --nproc-per-node 2 -m harness.run` on the CPU
(two gloo ranks on this machine), against a single-process run of the same cells; and the
pieces (launch detection, the cell assignment) as units.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ranks, spawn
from harness.gate.table import Outcome
from harness.plan import BUDGET_UNPROFILED
from harness.results import load_run, read_cells
from harness.run import main

#: real launches of the harness (torchrun, fresh processes): `pytest -m integration`
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
QUICK = ["--quick", "--device", "cpu", "--threads", "1", "--budget", "1", "--every-cell",
         "--findings", "B4-DRL-03", "B4-PT-05"]
COUNTERS = ["op_calls", "host_syncs", "allocations", "allocated_bytes"]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TORCHRUN, "-m", "harness.run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def _by_cell(summary):
    return summary.set_index(["finding", "case", "variant"]).sort_index()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded") / "results"
    done = _torchrun(*QUICK, "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return load_run(None, out), done


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "results"
    assert main(QUICK + ["--out", str(out), "--no-report"]) == 0
    return load_run(None, out)


def test_sharded_run_has_the_cells_results_and_counters_of_one_process(sharded, single):
    run, _ = sharded
    a, b = _by_cell(run.summary), _by_cell(single.summary)
    assert list(a.index) == list(b.index)
    assert (a["status"] == b["status"]).all()
    assert (a["max_error"].fillna(-1) == b["max_error"].fillna(-1)).all()
    # equal counts where both runs profiled the cell (the placebo is not profiled, and a
    # profile the 1 s budget could not pay is left out, depending on the run's pace)
    both = a["op_calls"].notna() & b["op_calls"].notna()
    assert set(a[both].index.get_level_values(0)) >= {"B4-DRL-03"}
    assert (a.loc[both, COUNTERS].fillna(-1) == b.loc[both, COUNTERS].fillna(-1)).all().all()
    assert run.metadata["status"] == "complete" and run.metadata["world_size"] == 2


def test_each_cell_is_measured_once_by_one_rank(sharded):
    run, _ = sharded
    cells = read_cells(run.folder)
    keys = [(c["finding"], c["case"]) for c in cells]
    assert len(keys) == len(set(keys)) == run.metadata["cells_total"] == 3
    assert {c["rank"] for c in cells} == {0, 1}  # both ranks measured
    assert {r["rank"] for r in run.metadata["ranks"]} == {0, 1}
    for cell in cells:  # every row carries who measured it
        assert {row["rank"] for row in cell["summary"]} == {cell["rank"]}
        assert all(row["host"] and row["device_name"] for row in cell["summary"])


def test_sharded_run_renders_one_report(sharded):
    run, done = sharded
    page = run.folder.parent.parent / "reports" / run.run_id / "index.html"
    assert page.is_file() and "B4-PT-05" in page.read_text()
    assert done.stdout.count("results: ") == 1  # rank 0 alone writes the result


def test_each_trace_names_the_rank_that_recorded_it(sharded):
    run, _ = sharded
    case0 = {}  # a finding's trace is recorded at its first case, by that cell's rank,
    # where the run's budget paid its profile (this run's budget is 1 s)
    for cell in read_cells(run.folder):
        if cell["order"][1] == 0 and not any(
                str(row.get("profile_note", "")).startswith(BUDGET_UNPROFILED)
                for row in cell["summary"]):
            case0[cell["finding"]] = cell["rank"]
    assert "B4-DRL-03" in case0
    traces = sorted((run.folder / "traces").glob("*.json.gz"))
    assert {t.name.removesuffix(".json.gz") for t in traces} == set(case0)
    for trace in traces:
        with gzip.open(trace, "rt") as f:
            info = json.load(f)["distributedInfo"]
        assert info["world_size"] == 2
        assert info["rank"] == case0[trace.name.removesuffix(".json.gz")]


def test_a_failing_rank_marks_its_cells_and_the_others_are_kept(tmp_path):
    out = tmp_path / "results"
    done = _torchrun("--findings-module", "tests.findings_modules.rank_failure",
                     "--findings", "RANK-failure", "--device", "cpu", "--threads", "1",
                     "--budget", "1", "--every-cell", "--no-profile", "--no-report", "--out", str(out))
    assert done.returncode != 0  # rows failed: every rank exits 1, and torchrun says so
    run = load_run(None, out)
    assert run.metadata["status"] == "complete"
    failed = {r["rank"]: r for r in run.metadata["ranks"]}
    assert "planted failure on rank 1" in failed[1]["error"] and failed[0]["error"] is None
    rows = run.summary[~run.summary["placebo"].astype(bool)]  # the finding's own rows
    by_rank = dict(tuple(rows.groupby("rank")))
    assert (by_rank[0]["status"] == "ok").all() and len(by_rank[0]) == 4
    assert (by_rank[1]["status"] == "failed").all() and len(by_rank[1]) == 4
    assert by_rank[1]["error"].str.contains("not run: rank 1 failed").all()


@pytest.mark.long  # a gate over ranks; CI shards a run over them
def test_gate_against_spreads_its_sessions_over_the_ranks(tmp_path):
    """`torchrun -m harness.gate --against REV` on a user's repository: the six A/B
    sessions are shared out over two ranks (each pairs both trees in one process, as
    without torchrun), rank 0 gathers them and reports once, and the 30x slower commit
    is still a regression while the unchanged variants pass."""
    from tests.harness.test_user_findings import MYLIB, REPO_FINDINGS, SLOWER, _git

    repo = tmp_path / "repo"
    (repo / "mylib").mkdir(parents=True)
    (repo / "mylib" / "__init__.py").write_text("")
    (repo / "mylib" / "ops.py").write_text(MYLIB)
    (repo / "bench_findings.py").write_text(REPO_FINDINGS)
    (repo / "pyproject.toml").write_text('[tool.esper-bench]\nfindings-modules = ["bench_findings"]\n')
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "mylib")
    (repo / "mylib" / "ops.py").write_text(MYLIB.replace(*SLOWER))
    _git(repo, "commit", "-qam", "row_sums, slower")
    done = subprocess.run([*TORCHRUN, "-m", "harness.gate", "--against", "HEAD~1",
                           "--json", str(tmp_path / "rows.json")], cwd=repo,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode != 0, done.stderr[-2000:]  # a regression: every rank exits 1
    said = done.stdout + done.stderr
    assert "(rank 0)" in said and "(rank 1)" in said  # both ranks ran sessions
    assert done.stdout.count("| check |") == 1  # rank 0 alone reports
    rows = {r["variant"]: r for r in json.loads((tmp_path / "rows.json").read_text())["rows"]}
    assert rows["rows"]["outcome"] == "regression"
    # the unchanged variant is no regression (noise may leave its interval off 1.0)
    assert not Outcome(rows["cols"]["outcome"]).fails, rows  # unchanged: pass (or faster)


@pytest.mark.long  # a gate over ranks; CI shards a run over them
def test_gate_quality_spreads_its_runs_over_the_ranks(tmp_path):
    out = tmp_path / "quality.json"
    done = subprocess.run([*TORCHRUN, "-m", "harness.gate.quality", "--counters-runs", "0",
                           "--invariant-runs", "2", "--ab-runs", "0", "--ab-planted-runs", "0",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    scenarios = json.loads(out.read_text())
    assert [s["condition"] for s in scenarios][0] == "unchanged" and len(scenarios) == 3
    for scenario in scenarios:  # two runs each, one on each rank, in run order
        assert scenario["ranks"] == [0, 1] and len(scenario["exit_codes"]) == 2
    assert scenarios[0]["exit_codes"] == [0, 0]  # unchanged code passes
    assert scenarios[2]["exit_codes"] == [1, 1]  # the planted 5x slowdown is caught
    assert done.stdout.count("| check | condition | runs |") == 1  # rank 0 alone reports


# --- units ------------------------------------------------------------------------------

def test_launch_reads_torchrun_environment():
    launch = ranks.Launch.from_environment({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1",
                                            "LOCAL_WORLD_SIZE": "2"})
    assert (launch.distributed, launch.leader, launch.device("cuda")) == (True, False, "cuda:1")
    assert ranks.Launch.from_environment({}) == ranks.Launch()
    assert not ranks.Launch().distributed and ranks.Launch().device("cuda:3") == "cuda:3"
    with pytest.raises(ValueError, match="RANK: expected 0 to 1; got 2"):
        ranks.Launch.from_environment({"WORLD_SIZE": "2", "RANK": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE: expected an integer"):
        ranks.Launch.from_environment({"WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="would put 2 ranks on one GPU"):
        ranks.Launch(2, 0, 0, 2).device("cuda:0")


def test_assignment_is_deterministic_longest_first_and_balanced():
    seconds = [5.0, 1.0, 4.0, 1.0, 3.0, 2.0, 2.0]
    assigned = ranks.assign(seconds, 2)
    assert assigned == ranks.assign(seconds, 2)
    # longest first: 5 -> r0, 4 -> r1, 3 -> r1, 2 -> r0, 2 -> r0 (tie: lower rank), 1 -> r1, 1 -> r1
    assert assigned == [0, 1, 1, 1, 1, 0, 0]
    load = [sum(s for s, r in zip(seconds, assigned) if r == rank) for rank in (0, 1)]
    assert load == [9.0, 9.0]
    assert ranks.assign(seconds, 1) == [0] * len(seconds)
    assert sorted(set(ranks.assign([1.0] * 8, 8))) == list(range(8))  # one each
    with pytest.raises(ValueError, match="world_size: expected an integer >= 1"):
        ranks.assign(seconds, 0)
    with pytest.raises(ValueError, match="expected_seconds: expected seconds >= 0"):
        ranks.assign([1.0, float("nan")], 2)


def test_a_child_process_does_not_inherit_the_launch():
    environ = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500",
               "LOCAL_RANK": "1", "PATH": "/bin", "TORCHELASTIC_RUN_ID": "x"}
    assert spawn.solo_environment(environ) == {"PATH": "/bin"}
    assert not ranks.Launch.from_environment(spawn.solo_environment(environ)).distributed


def test_a_command_exits_without_finalization():
    """After a command's work is written, it ends with os._exit: its status and its
    flushed output, but no atexit handlers or C++ static destructors (where leaving ranks
    aborted, and where torch.compile's worker pool took 1.5-2 s)."""
    code = ("import atexit, sys\n"
            "from harness import ranks\n"
            "atexit.register(lambda: print('finalized'))\n"
            "print('measured', end='')\n"
            "sys.stderr.write('said')\n"
            "ranks.exit_process(5)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 5
    assert done.stdout == "measured" and done.stderr == "said"
