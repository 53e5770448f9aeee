"""A cell's profile fits the run's budget: profiled where the run has the seconds, else
left out, said so in the row with what it would have cost."""
from __future__ import annotations

import time

import torch

from harness.findings import Case, Finding
from harness.runner import CaseRun, RunOptions


def _slow_finding(call_s: float) -> Finding:
    """Two variants, each a call of about `call_s` seconds (a sleep beside one tiny op, so
    the profiler has something to count)."""
    def make_call(variant, x):
        def call():
            time.sleep(call_s)
            return x + 1
        return call

    return Finding(
        id="SLOW", title="slow", claim="a claim", variants=("a", "b"), baseline="a",
        cases=lambda quick: [Case.of(n=4)],
        build=lambda case, device, seed: torch.zeros(case["n"]),
        make_call=make_call, check=lambda out, ref: float((out - ref).abs().max()),
        tolerance=lambda case: 0.0)


def _cell(profile_s):
    finding = _slow_finding(0.03)
    options = RunOptions(device=torch.device("cpu"), min_samples=3, precision=0.0)
    cell = CaseRun(finding, finding.cases(False)[0], options, sampling_s=0.05)
    return cell.prepare().time().finish(profile_s=profile_s)


def test_a_profile_the_budget_cannot_pay_is_left_out_and_said_with_its_cost():
    cell = _cell(profile_s=0.0)
    assert "profile" not in cell.seconds or cell.seconds["profile"] < 0.01
    for variant in ("a", "b"):
        row = cell.cells[variant]
        assert "op_calls" not in row
        assert row["profile_note"].startswith("not profiled to keep the run's budget: it had "
                                              "0 s left for this cell's profile, which takes "
                                              "about ")
        assert "a larger --budget profiles it" in row["profile_note"]


def test_a_profile_the_budget_can_pay_is_taken():
    for profile_s in (None, 60.0):
        cell = _cell(profile_s=profile_s)
        assert all(cell.cells[v]["op_calls"] >= 1 for v in ("a", "b"))
        assert all("profile_note" not in cell.cells[v] for v in ("a", "b"))


def test_a_cell_whose_share_cannot_pay_the_minimum_rounds_takes_fewer_never_below_five():
    from harness.run import FEWEST_ROUNDS, min_rounds
    assert min_rounds(share_s=10.0, round_s=0.1, wanted=8) == 8  # the share pays them
    assert min_rounds(share_s=0.65, round_s=0.1, wanted=8) == 6
    assert min_rounds(share_s=0.1, round_s=2.0, wanted=8) == FEWEST_ROUNDS == 5
    assert min_rounds(share_s=0.1, round_s=2.0, wanted=3) == 3  # never more than asked
    assert min_rounds(share_s=0.1, round_s=0.0, wanted=8) == 8  # nothing foreseen


def test_the_rounds_a_cell_takes_at_least_are_those_it_is_given():
    finding = _slow_finding(0.01)
    options = RunOptions(device=torch.device("cpu"), min_samples=8, precision=0.0)
    cell = CaseRun(finding, finding.cases(False)[0], options, sampling_s=0.001).prepare()
    assert 0.02 <= cell.round_s() < 1.0  # one call of each variant: 2 x 10 ms
    cell.min_rounds = 5
    cell.time()
    assert {m.n for m in cell.measurements.values()} == {5}
