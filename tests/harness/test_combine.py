"""A run's rows worded from all their processes (`harness.combine`) and the budget shared
out as the run goes (`harness.plan`): pure functions over synthetic rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.combine import combine, row_processes
from harness.measure.estimate import RowProcesses, pool_spread, row_estimate
from harness.plan import (
    FINISH_S, FLOOR_S, GUESS_FIXED_S, GUESS_REPORT_S, REPORT_MAX_SHARE, RESERVE_SHARE, Plan,
    affordable, report_s,
)
from harness.report.summary import compiled_line
from harness.results import worded

INFO = {"F": {"margin": 0.05, "claim_factor": None, "peers": [], "claim_tolerance": 0.25}}


def _cell(case: str, ratio: float, offsets: dict[int, float], rng, rounds: int = 30,
          threads: dict[int, int] | None = None):
    """The summary rows and sample rows of one cell of finding F: `variant` against
    `base`, timed in each process of `offsets` (process -> log offset of the ratio)."""
    summary = [{"finding": "F", "case": case, "variant": "base", "status": "ok",
                "verdict": "baseline", "compared_to": "base", "placebo": False},
               {"finding": "F", "case": case, "variant": "variant", "status": "ok",
                "verdict": "inconclusive", "compared_to": "base", "placebo": False,
                "ci_level": 0.95, "median_s": 1e-4 * ratio, "lean": "faster"}]
    samples = []
    for process, offset in offsets.items():
        base = 1e-4 * np.exp(rng.normal(0, 0.02, rounds))
        variant = base * ratio * math.exp(offset) * np.exp(rng.normal(0, 0.02, rounds))
        for name, values in (("base", base), ("variant", variant)):
            samples += [{"finding": "F", "case": case, "variant": name, "process": process,
                         "round": k, "seconds": float(v),
                         "threads": (threads or {}).get(process, 2)}
                        for k, v in enumerate(values)]
    return summary, samples


def _run(rng, cells: int = 12, process_sd: float = 0.01, **kwargs):
    summary, samples = [], []
    for index in range(cells):
        offsets = {1: rng.normal(0, process_sd), 2: rng.normal(0, process_sd)}
        rows, taken = _cell(f"n={index}", 0.8, offsets, rng, **kwargs)
        summary += rows
        samples += taken
    return summary, samples


def test_each_row_is_the_estimate_of_all_its_processes_under_the_runs_spread():
    rng = np.random.default_rng(1)
    summary, samples = _run(rng)
    combined = combine(summary, samples, INFO, 0.05, threads=2)
    rows = row_processes(summary, samples)
    spread = pool_spread(list(rows.values()))
    for row in combined.summary:
        if row["variant"] != "variant":
            continue
        expected = row_estimate(rows[("F", row["case"], "variant")], spread)
        assert row["ratio"] == pytest.approx(expected.ratio)
        assert row["processes"] == 2 and row["verdict"] == "faster"
        assert "lean" not in row  # the single process's provisional fields are gone
        assert row["process_sd"] == pytest.approx(math.sqrt(spread.band(1e-4).tau2))
    assert combined.noise()["calibration"]["rows"] == 12


def test_the_placebo_is_worded_but_does_not_inform_the_spread():
    rng = np.random.default_rng(2)
    summary, samples = _run(rng)
    placebo_rows, placebo_samples = _cell("n=0", 1.0, {1: 0.3, 2: -0.3}, rng)
    for row in placebo_rows:
        row["variant"] = "placebo" if row["variant"] == "variant" else row["variant"]
        row["placebo"] = row["variant"] == "placebo"
    for row in placebo_samples:
        row["variant"] = "placebo" if row["variant"] == "variant" else row["variant"]
    summary += [r for r in placebo_rows if r["variant"] == "placebo"]
    samples += [r for r in placebo_samples if r["variant"] == "placebo"]
    rows = row_processes(summary, samples)
    assert rows[("F", "n=0", "placebo")].pooled is False
    combined = combine(summary, samples, INFO, 0.05, threads=2)
    assert combined.noise()["calibration"]["rows"] == 12


def test_rows_at_one_thread_word_their_own_fields_beside_the_runs():
    rng = np.random.default_rng(3)
    summary, samples = _run(rng, process_sd=0.0)  # no row held to its own spread
    _, alone = _cell("n=0", 1.3, {101: 0.0, 102: 0.0}, rng, threads={101: 1, 102: 1})
    combined = combine(summary, samples + alone, INFO, 0.05, threads=2)
    (row,) = [r for r in combined.summary if (r["case"], r["variant"]) == ("n=0", "variant")]
    assert row["verdict"] == "faster" and row["one_thread_verdict"] == "slower"
    assert row["one_thread_ci_low"] < 1.3 < row["one_thread_ci_high"]
    assert row["processes"] == 2  # the one-thread processes are not the row's


def test_an_undecided_row_whose_processes_disagree_is_wanted_again():
    rng = np.random.default_rng(4)
    summary, samples = _run(rng, cells=20)
    split_rows, split = _cell("n=split", 1.02, {1: 0.0, 2: 0.25}, rng)
    combined = combine(summary + split_rows, samples + split, INFO, 0.05, threads=2)
    (row,) = [r for r in combined.summary if (r["case"], r["variant"]) == ("n=split", "variant")]
    assert row["verdict"] == "inconclusive" and row["processes_to_decide"] > 2
    assert combined.undecided(max_processes=6) == [("F", "n=split", "variant")]


def test_a_lone_row_that_more_processes_would_decide_is_wanted_again():
    """A user's one claim: one row, its two processes 0.055 and 0.085 (a process moved it
    by 40%), sampled with many looks (its interval at 99.3%). With one degree of
    freedom for the process level no interval can decide it, however clear the 14x; more
    processes can, so it is wanted again even though two cannot show that they disagree."""
    rng = np.random.default_rng(5)
    summary, samples = _cell("n=1", 0.07, {1: math.log(0.055 / 0.07),
                                           2: math.log(0.085 / 0.07)}, rng)
    summary[1]["ci_level"] = 0.993  # its sampling looked often: the level its checks used
    combined = combine(summary, samples, INFO, 0.05, threads=2)
    (row,) = [r for r in combined.summary if r["variant"] == "variant"]
    assert row["verdict"] == "inconclusive" and row["process_df"] <= 1
    assert 2 < row["processes_to_decide"] <= 6
    assert combined.undecided(max_processes=6) == [("F", "n=1", "variant")]
    assert combined.undecided(max_processes=3) == []  # more than it may take


def test_a_row_more_processes_would_not_decide_is_not_wanted_again():
    rng = np.random.default_rng(6)
    summary, samples = _cell("n=1", 1.05, {1: -0.02, 2: 0.02}, rng)  # at the margin's edge
    combined = combine(summary, samples, INFO, 0.05, threads=2)
    (row,) = [r for r in combined.summary if r["variant"] == "variant"]
    assert row["verdict"] == "inconclusive"
    assert not 2 < (row.get("processes_to_decide") or 0) <= 6
    assert combined.undecided(max_processes=6) == []


def test_a_run_made_before_it_measured_processes_keeps_its_recorded_words():
    rng = np.random.default_rng(5)
    summary, samples = _run(rng)
    cells = [{"summary": summary, "samples": samples}]
    old, level = worded(cells, {"time_budget_s": 1.0, "finding_info": INFO})
    assert old == summary and level is None
    new, level = worded(cells, {"budget_s": 30.0, "finding_info": INFO, "threads": 2,
                                "margin": 0.05})
    assert new != summary and level["calibration"]["rows"] == 12


def test_a_first_call_that_compiled_is_said():
    import pandas as pd

    rows = pd.DataFrame([{"finding": "F", "variant": "compiled", "first_output_s": 14.2,
                          "median_s": 2e-5},
                         {"finding": "F", "variant": "loop", "first_output_s": 0.01,
                          "median_s": 2e-3}])
    line = compiled_line(rows)
    assert line.startswith("compiled in this run: 1 first call took 14 s (F compiled)")
    # it cannot tell a cold cache from a warm one: a cached torch.compile took 4.4 s here
    assert "cold" not in line and "or loading what an earlier run compiled" in line
    assert compiled_line(rows[rows.variant == "loop"]) is None


def test_the_plan_shares_sampling_by_weight_and_learns_the_runs_pace():
    plan = Plan(100.0, {("A", "1"): 1.0, ("B", "1"): 3.0}, processes=2,
                known_fixed_s={("A", "1"): 4.0, ("B", "1"): 4.0})
    left = 100.0 * (1 - RESERVE_SHARE) - 8.0
    assert plan.share(("B", "1")) == pytest.approx(3 * plan.share(("A", "1")), rel=1e-3)
    assert plan.share(("A", "1")) == pytest.approx(left / 4 / 2, rel=0.01)
    # the first cell cost four times what the earlier run said: the rest will too
    plan.measured(("A", "1"), fixed_s=16.0, sampling_s=0.0)
    plan.started -= 16.0  # as if those 16 s had passed
    assert plan.remaining_fixed_s() == pytest.approx(16.0)
    assert plan.share(("B", "1")) == pytest.approx((left + 8.0 - 16.0 - 16.0) / 2, rel=0.01)


def test_the_plan_says_what_a_cell_may_spend_beyond_its_sampling():
    """What the cell being measured may still spend (its profile, say) without the run
    ending past its budget: the budget less the reserve, what has passed, and the fixed
    costs and least sampling of the cells still to come."""
    plan = Plan(100.0, {("A", "1"): 1.0, ("B", "1"): 1.0}, processes=2,
                known_fixed_s={("A", "1"): 10.0, ("B", "1"): 20.0})
    expected = 100.0 * (1 - RESERVE_SHARE) - 20.0 - FLOOR_S * 2
    assert plan.spare_s(("A", "1")) == pytest.approx(expected, abs=0.5)
    plan.started -= 60.0  # a minute has passed
    assert plan.spare_s(("A", "1")) == pytest.approx(expected - 60.0, abs=0.5)
    plan.measured(("A", "1"), fixed_s=10.0, sampling_s=50.0)
    assert plan.spare_s(("B", "1")) == pytest.approx(100.0 * (1 - RESERVE_SHARE) - 60.0, abs=0.5)
    plan.started -= 100.0  # past the budget: nothing spare, never a negative figure
    assert plan.spare_s(("B", "1")) == 0.0


def test_the_plan_never_shares_out_nothing_and_guesses_unknown_cells():
    plan = Plan(1.0, {("A", "1"): 1.0}, processes=2)
    assert plan.share(("A", "1")) == FLOOR_S
    assert plan.remaining_fixed_s() == GUESS_FIXED_S * 2
    assert "a guess" in plan.describe() and "each timed in 2 processes" in plan.describe()


def test_the_report_keeps_what_the_last_one_took_a_finding_else_a_guess():
    assert report_s(None, 10, 100.0) == pytest.approx(FINISH_S + 10 * GUESS_REPORT_S)
    earlier = {"import_s": 1.2, "render_s": 3.0, "findings": 12}  # its import once
    assert report_s(earlier, 6, 100.0) == pytest.approx(FINISH_S + 1.2 + 1.5)
    # a one-finding report's import is not charged to each of 20 findings
    one = {"import_s": 1.2, "render_s": 0.3, "findings": 1}
    assert report_s(one, 20, 100.0) == pytest.approx(FINISH_S + 1.2 + 6.0)
    assert report_s(one, 20, 20.0) == pytest.approx(REPORT_MAX_SHARE * 20.0)  # at most
    assert report_s(earlier, 0, 100.0) == FINISH_S  # no report: the rows are still combined


def test_the_cells_end_before_the_reports_seconds():
    plan = Plan(100.0, {("A", "1"): 1.0}, processes=2, known_fixed_s={("A", "1"): 4.0},
                report_s=20.0)
    assert plan.end_s() == pytest.approx(100.0 * (1 - RESERVE_SHARE) - 20.0)
    assert plan.share(("A", "1")) == pytest.approx((plan.end_s() - 4.0) / 2, rel=0.01)
    assert plan.describe().endswith("and 20 s to combine the rows and report them")


def test_a_plan_whose_guess_spends_the_budget_says_so_rather_than_0_s_of_sampling():
    plan = Plan(35.0, {(str(i), "1"): 1.0 for i in range(21)}, processes=2)
    said = plan.describe()
    assert "0 s of sampling" not in said and "more than the budget" in said


def test_one_more_process_takes_only_the_cells_its_start_and_costs_leave_time_for():
    """A fresh process for undecided cells pays its start first (interpreter, torch, the
    findings: seconds), then each cell; a run 1 s from its deadline starts none (a quick
    run's third process took 7.7 s past its 35 s budget), and a cell too dear is skipped
    for cheaper ones after it."""
    costs = {("A", "1"): 2.0, ("B", "1"): 9.0, ("C", "1"): 1.0}
    assert affordable(costs, start_s=3.0, left_s=1.0) == []
    assert affordable(costs, start_s=3.0, left_s=3.5) == []
    assert affordable(costs, start_s=3.0, left_s=4.0) == [("C", "1")]
    assert affordable(costs, start_s=3.0, left_s=6.5) == [("A", "1"), ("C", "1")]
    assert affordable(costs, start_s=3.0, left_s=15.0) == [("A", "1"), ("B", "1"), ("C", "1")]


def test_rows_without_a_second_round_in_a_process_are_left_to_the_others():
    rng = np.random.default_rng(6)
    summary, samples = _cell("n=0", 0.9, {1: 0.0, 2: 0.0}, rng)
    samples = [s for s in samples if not (s["process"] == 2 and s["round"] > 0)]
    rows = row_processes(summary, samples)
    assert rows[("F", "n=0", "variant")].processes == 1
    assert isinstance(rows[("F", "n=0", "variant")], RowProcesses)
