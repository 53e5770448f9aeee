"""esper_review.gae_tools.targets: the target table and checks from a run's summary rows."""

from __future__ import annotations

import pandas as pd

from esper_review.gae_tools.targets import TARGET_ENVS, TARGET_STEPS, check_targets, markdown, target_cells


def _summary(ours_s: float, peer_s: float, floor_s: float) -> pd.DataFrame:
    """Summary rows as harness.run writes them: numba and sb3_numpy in every target cell,
    plus a failed row and a random-terminals row that must be ignored."""
    rows = []
    for envs in TARGET_ENVS:
        for steps in TARGET_STEPS:
            base = dict(finding="B4-CR-03", p_num_envs=envs, p_max_steps=steps,
                        p_dones="episode", floor_s=floor_s)
            rows += [
                {**base, "variant": "numba", "status": "ok", "median_s": ours_s},
                {**base, "variant": "scan", "status": "failed", "median_s": None},
                {**base, "variant": "sb3_numpy", "status": "ok", "median_s": peer_s},
                {**base, "p_dones": "random0.05", "variant": "sb3_numpy", "status": "ok",
                 "median_s": ours_s / 10},
            ]
    return pd.DataFrame(rows)


def test_targets_met_when_ours_is_fastest_near_the_floor_and_quick():
    cells = target_cells(_summary(ours_s=30e-6, peer_s=90e-6, floor_s=20e-6))
    assert len(cells) == len(TARGET_ENVS) * len(TARGET_STEPS)
    assert all(c.ours == "numba" and c.peer == "sb3_numpy" for c in cells)
    assert [met for _, met, _ in check_targets(cells)] == [True, True, True]
    assert "| 3x faster |" in markdown(cells)


def test_each_target_can_fail():
    slow = target_cells(_summary(ours_s=100e-6, peer_s=90e-6, floor_s=20e-6))
    results = {name: (met, text) for name, met, text in check_targets(slow)}
    assert [met for met, _ in results.values()] == [False, False, False]
    assert "loses at 4x25" in results["faster than every peer in every cell"][1]
    assert "5.00x the floor" in results["within 3x of the bandwidth floor at 1024x256"][1]


def test_missing_cells_are_named():
    summary = _summary(ours_s=30e-6, peer_s=90e-6, floor_s=20e-6)
    summary = summary[summary["p_max_steps"] != 128]
    met, text = check_targets(target_cells(summary))[0][1:]
    assert not met and "4x128" in text and "1024x128" in text
