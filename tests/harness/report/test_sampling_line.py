"""The run's one-line account of its sampling: how each timed cell ended (every word
decided to the precision, the budget spent, the round cap), and how noisy the machine was."""

import pandas as pd
import pytest

from harness.report.summary import sampling_line


def row(finding, case, variant, stopped_by, median_s=1e-3, iqr_s=1e-4, status="ok"):
    return {"finding": finding, "case": case, "variant": variant, "status": status,
            "stopped_by": stopped_by, "median_s": median_s, "iqr_s": iqr_s}


def test_counts_cells_by_how_every_timed_row_stopped_and_states_the_spread():
    rows = pd.DataFrame([
        row("A", "c1", "x", "decided"), row("A", "c1", "y", "decided"),
        # one open variant makes the whole cell a budget cell
        row("A", "c2", "x", "time_budget"), row("A", "c2", "y", "decided"),
        row("B", "c1", "x", "max_samples", iqr_s=5e-4),
        # untimed rows are no cell of sampling
        row("B", "c2", "x", None, median_s=None, iqr_s=None, status="needs_cuda"),
    ])
    line = sampling_line(rows, precision=0.03)
    assert line.startswith("sampling: 3 timed cells: 1 spent its budget, 1 hit the round cap, "
                           "1 decided every word to +-3%")
    # spreads 0.1, 0.1, 0.1, 0.1, 0.5: the median is 10%, above the 5% margin: noisy
    assert "timing spread (median IQR/median) 10%" in line
    assert "(noisy: above the 5% margin;" in line and "--budget" in line
    # what is noisy is the run's margin's to say, not a constant: at a 20% margin it is not
    assert "noisy" not in sampling_line(rows, precision=0.03, margin=0.2)


def test_a_quiet_machine_is_not_called_noisy():
    rows = pd.DataFrame([row("A", "c1", "x", "decided", iqr_s=2e-5),
                         row("A", "c1", "y", "decided", iqr_s=3e-5)])
    line = sampling_line(rows, precision=0.03)
    assert line == ("sampling: 1 timed cell: 1 decided every word to +-3%; "
                    "timing spread (median IQR/median) 2.5%")


def test_fixed_sampling_says_so():
    rows = pd.DataFrame([row("A", "c1", "x", "time_budget", iqr_s=2e-5)])
    assert sampling_line(rows, precision=0.0).startswith(
        "sampling: fixed budget (--precision 0), 1 timed cell: 1 spent its budget;")


def test_older_runs_that_stopped_at_a_precision_still_read():
    rows = pd.DataFrame([row("A", "c1", "x", "precision_reached", iqr_s=2e-5)])
    assert sampling_line(rows, precision=0.03).startswith(
        "sampling: 1 timed cell: 1 reached +-3%;")


@pytest.mark.parametrize("rows", [pd.DataFrame(), pd.DataFrame([row("B", "c2", "x", None, None, None,
                                                                   "needs_cuda")])])
def test_nothing_timed_gives_no_line(rows):
    assert sampling_line(rows, precision=0.03) is None


def test_the_process_line_says_what_the_run_measured_of_its_processes():
    from harness.report.summary import process_line

    rows = pd.DataFrame([{**row("A", "c1", "x", "decided"), "processes": 2},
                         {**row("A", "c1", "y", "decided"), "processes": 4}])
    level = {"bands": [{"upper_s": 2e-5, "sd": 0.031, "df": 11.2, "rows": 14, "own": True,
                        "worded": 14},
                       {"upper_s": 2e-3, "sd": 0.02, "df": 3.0, "rows": 20, "own": False,
                        "worded": 2},
                       {"upper_s": None, "sd": 0.02, "df": 3.0, "rows": 20, "own": False,
                        "worded": 0}],
             "calibration": {"rows": 20, "disagreeing": 6, "expected": 3, "inflation": 2.25}}
    line = process_line(rows, level)
    assert line.startswith("processes: each row timed in 2 to 4 fresh processes; a process "
                           "moved a ratio by 3.1% at calls under 20 us (11 df), 2% at the "
                           "other lengths (3 df, the run's 20 rows together)")
    assert "6 of 20 rows' processes disagreed (chance allows 3): too many, every interval " \
           "widened x1.5" in line
    slightly = {**level, "calibration": {**level["calibration"], "inflation": 1.05}}
    assert "every interval widened x1.02 " in process_line(rows, slightly)  # never "x1"
    assert process_line(rows, None) is None  # a run that assumed its process level


def test_a_rows_sampling_cell_names_its_processes_and_the_time_line_its_workers():
    from harness.report.data import sampling_cell
    from harness.report.summary import time_line

    assert sampling_cell({"n": 40, "stopped_by": "time_budget", "processes": 2}) == (
        "40 (budget spent; 2 processes)")
    assert sampling_cell({"n": 40, "stopped_by": "time_budget", "processes": 1}) == (
        "40 (budget spent)")
    cells = [{"seconds": {"time": 10.0, "check": 2.0}}]
    assert time_line(cells) == "time: 10 s sampling, 2 s first calls and checks"
    workers = [{"seconds": {"time": 10.0, "check": 2.0, "worker_time": 9.0,
                            "worker_other": 3.0}}]
    assert time_line(workers) == ("time: 19 s sampling, 2 s first calls and checks, 3 s of "
                                  "the workers' inputs and first calls")
    from harness.plan import BUDGET_UNPROFILED
    unprofiled = [{"seconds": {"time": 10.0}, "summary": [
        {"variant": v, "profile_note": f"{BUDGET_UNPROFILED}: it had 0 s left"}
        for v in ("a", "b")]}, {"seconds": {"time": 1.0}, "summary": [{"variant": "a"}]}]
    assert time_line(unprofiled) == ("time: 11 s sampling; 1 cell not profiled to keep the "
                                     "budget (a larger --budget profiles it)")


def test_the_load_line_names_the_cells_timed_beside_another_jobs_load():
    """Cells whose threads shared their cores with other processes (`timed_beside_load`)
    are counted and named once per cell; cells timed on free cores are counted as timed;
    a run with none, or one recorded before the watch, has no such line."""
    from harness.report.summary import load_line

    def watched(case, variant, others, beside):
        return {**row("A", case, variant, "decided"), "others_busy_cores": others,
                "timed_beside_load": beside}

    rows = pd.DataFrame([watched("c1", "x", 0.1, False), watched("c1", "y", 0.1, False),
                         watched("c2", "x", 1.0, True), watched("c2", "y", 1.0, True),
                         watched("c3", "x", 1.2, True),
                         row("B", "c1", "x", None, median_s=None, iqr_s=None,
                             status="needs_cuda")])
    line = load_line(rows)
    assert line.startswith("load: other processes kept 1.1 cores busy (median) while 2 of 3 "
                           "timed cells ran (A c2, A c3)")
    assert "--threads 1" in line
    assert load_line(rows[~rows.case.isin(["c2", "c3"])]) is None
    assert load_line(pd.DataFrame([row("A", "c1", "x", "decided")])) is None


def test_the_load_line_names_headline_cells_whose_one_thread_processes_were_loaded():
    """A headline cell timed again at one thread while every core was busy
    (`one_thread_beside_load`) is named apart from the cells loaded at the run's threads:
    its one-thread word is a loaded machine's, its main word not."""
    from harness.report.summary import load_line

    def watched(case, others, beside, alone=None):
        return {**row("A", case, "x", "decided"), "others_busy_cores": others,
                "timed_beside_load": beside, "one_thread_beside_load": alone}

    only_alone = pd.DataFrame([watched("c1", 0.1, False, True), watched("c2", 0.0, False)])
    assert load_line(only_alone).startswith(
        "load: other processes kept every core busy while the one-thread processes of 1 "
        "headline cell ran (A c1), leaving fewer free cores")
    both = pd.DataFrame([watched("c1", 0.1, False, True), watched("c2", 1.0, True),
                         watched("c3", 1.4, True, True)])
    assert load_line(both).startswith(
        "load: other processes kept 1.2 cores busy (median) while 2 of 3 timed cells ran "
        "(A c2, A c3) and every core busy while the one-thread processes of 2 headline "
        "cells ran (A c1, A c3)")
    assert load_line(pd.DataFrame([watched("c1", 0.1, False, False)])) is None
