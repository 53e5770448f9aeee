"""Every reported number is checked for sense: the report and the GAE targets refuse to
print a floor a call beats, a word against its own interval, a "faster" ratio above 1,
or a NaN where a number is shown; each is exit 3 with the problem named."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.report.cli import render_runs
from harness.report.sense import problems, row_problems
from harness.results import Run
from esper_review.gae_tools.targets import versus

GOOD = {"finding": "F", "case": "c", "variant": "fast", "status": "ok", "verdict": "faster",
        "median_s": 1e-3, "ratio": 0.5, "ci_low": 0.45, "ci_high": 0.55, "interval": "paired",
        "margin": 0.05, "floor_s": 1e-4}


@pytest.mark.parametrize(("changes", "problem"), [
    ({"floor_s": 2e-3}, "faster than its floor"),  # the 0.84x-the-floor case
    ({"ratio": 1.2, "ci_low": 1.1, "ci_high": 1.3}, "'faster' at a time ratio of 1.2"),
    ({"verdict": "slower", "ratio": 0.5}, "'slower' at a time ratio of 0.5"),
    ({"verdict": "same"}, "the word 'same' against its own interval [0.45, 0.55], which says "
                          "'faster'"),
    ({"ratio": 0.7}, "ratio 0.7 outside its own interval"),
    ({"median_s": float("nan")}, "timed, but its median time is nan"),
    ({"ci_low": float("nan")}, "ratio 0.5 with interval [nan, 0.55]"),
])
def test_each_kind_of_nonsense_is_found(changes, problem):
    assert row_problems(GOOD) == []
    found = row_problems({**GOOD, **changes})
    assert len(found) == 1 and problem in found[0] and found[0].startswith("F c fast:")


def test_the_report_refuses_to_print_a_run_with_nonsense(tmp_path, capsys):
    summary = pd.DataFrame([{**GOOD, "variant": "slow", "verdict": "baseline", "ratio": None,
                             "ci_low": None, "ci_high": None, "baseline": True},
                            {**GOOD, "floor_s": 2e-3, "baseline": False}])
    run = Run(folder=tmp_path / "run", metadata={"run_id": "r", "status": "complete"},
              summary=summary, rows=pd.DataFrame())
    with pytest.raises(Exception) as info:
        render_runs(run, None, tmp_path / "out")
    assert type(info.value).__name__ == "Nonsense"
    assert "report of r: refused to print numbers that make no sense" in str(info.value)
    assert not (tmp_path / "out").exists()
    assert problems(summary) == [p for p in info.value.problems]


@pytest.mark.parametrize(("ours", "peer", "text"), [
    (1e-3, 3.2e-3, "3.2x faster"), (7.5e-3, 1e-3, "7.5x slower"), (None, 1e-3, "-")])
def test_the_targets_say_slower_when_a_peer_beats_ours(ours, peer, text):
    assert versus(ours, peer) == text
