"""The verdict benchmark's reductions (`benchmarks/verdict_stability.py`): the counts its
tables print come from these functions, driven here with hand-made runs."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import verdict_stability as vs


def _row(finding, variant, verdict, ratio=1.0, placebo=False):
    return {"finding": finding, "case": "n=1", "variant": variant, "verdict": verdict,
            "placebo": placebo, "headline": True, "ratio": ratio, "ci_low": ratio * 0.98,
            "ci_high": ratio * 1.02, "status": "ok"}


def test_stability_counts_changed_and_moved_words_between_consecutive_runs():
    runs = [{"rows": [_row("A", "x", "faster"), _row("B", "y", "same"), _row("C", "z", "same")]},
            {"rows": [_row("A", "x", "slower"), _row("B", "y", "inconclusive"),
                      _row("C", "z", "same")]},
            {"rows": [_row("A", "x", "slower"), _row("B", "y", "same"), _row("C", "z", "same")]}]
    s = vs.stability(runs)
    assert (s["pairs"], s["compared"], s["changed"], s["moved"]) == (2, 6, 3, 1)
    assert s["moved_examples"] == ["A/n=1/x: faster -> slower"]


def test_moved_rows_are_listed_in_row_order_whatever_the_hash_seed():
    """The docs quote the list, and `docs/generate.py --check` compares it across
    processes: it must not follow a set's hash-seeded order."""
    names = [f"F{i}" for i in range(8)]
    runs = [{"rows": [_row(n, "v", "faster") for n in reversed(names)]},
            {"rows": [_row(n, "v", "slower") for n in names]}]
    assert vs.stability(runs)["moved_examples"] == [
        f"{n}/n=1/v: faster -> slower" for n in names]


def test_placebos_count_words_of_placebo_rows_only():
    rows = [_row("A", "placebo", "same", placebo=True), _row("B", "placebo", "slower", 1.07, True),
            _row("C", "placebo", "inconclusive", placebo=True), _row("A", "x", "faster", 0.5)]
    p = vs.placebos([{"rows": rows}])
    assert (p["cells"], p["same"], p["decisive"], p["inconclusive"]) == (3, 1, 1, 1)
    assert p["decisive_examples"][0].startswith("B n=1: slower 1.07")


def test_gate_chunks_merge_by_condition_and_the_table_counts_them(tmp_path):
    first = [{"check": "c", "condition": "unchanged", "expect_flag": False,
              "exit_codes": [0], "seconds": [90.0], "ranks": [0], "rows": [[]]}]
    chunk = [{"check": "c", "condition": "unchanged", "expect_flag": False,
              "exit_codes": [1, 0], "seconds": [80.0, 100.0], "ranks": [0, 0], "rows": [[], []]},
             {"check": "c", "condition": "scan 1.15x slower", "expect_flag": True,
              "exit_codes": [1], "seconds": [70.0], "ranks": [0], "rows": [[]]}]
    merged = vs._merge_gate(first, chunk)
    assert [s["exit_codes"] for s in merged] == [[0, 1, 0], [1]]
    assert all(len(s["rows"]) == len(s["exit_codes"]) for s in merged)
    (tmp_path / "gate-runs.json").write_text(json.dumps(merged))
    table = vs.markdown("gate-power", tmp_path)
    assert "| unchanged | at most 1 in 60 | 3 | 1 (33%) | 6-79% | 90 |" in table
    assert "| scan 1.15x slower | at least 90% | 1 | 1 (100%) | 21-100% | 70 |" in table
    # by slowdown, unchanged first, whatever order the chunks saved them in
    merged.append({**merged[1], "condition": "scan 1.05x slower"})
    order = [r["condition"] for r in vs.gate_table(merged)]
    assert order == ["unchanged", "scan 1.05x slower", "scan 1.15x slower"]


def test_a_second_gate_call_goes_on_to_each_slowdowns_own_count():
    """Saved: 60 unchanged runs, 10 at 1.15x, 1 at 1.10x; a second call asking 3 runs of
    1.05, 1.10 (spelt twice) and 1.15 has 1.05 and 1.10 left (a chunk runs at most 2 of
    each, the fewer runs either lacks) and no run of 1.15."""
    counts = {"unchanged": 60, "scan 1.15x slower": 10, "scan 1.1x slower": 1}
    assert vs._gate_plan(counts, 60, 3, "1.05,1.10,1.1,1.15") == (0, 2, ["1.05", "1.10"])
    assert vs._gate_plan(counts, 62, 10, "1.15") == (2, 0, [])
    assert vs._gate_plan({}, 6, 1, "1.15") == (6, 1, ["1.15"])
    for bad in ("0.9", "x", ""):
        with pytest.raises(SystemExit, match="--slowdowns"):
            vs._gate_plan(counts, 60, 3, bad)


def test_every_table_says_what_to_run_when_nothing_was_measured(tmp_path):
    for kind in vs.TABLES:
        assert "not measured: run `" in vs.markdown(kind, tmp_path)


def test_duet_table_gives_each_modes_ratio_width_and_spread_against_its_errors():
    """Two processes of each mode: per-round ratios near 0.5 (interleaved, noisy) and near
    0.8 and 0.88 (duet, quiet, a 10% offset between its processes); the table reads each
    mode's ratios, the duet's narrower interval, and its processes' spread, many of their
    standard errors where the interleaved ones' is within a few."""
    import random

    rng = random.Random(0)
    row = vs.DUET_ROWS[0]

    def run(mode, process, ratio, noise):
        base = [1e-3 * (1 + rng.gauss(0, noise)) for _ in range(200)]
        return {"row": list(row), "mode": mode, "process": process, "baseline": base,
                "variant": [b * ratio * (1 + rng.gauss(0, noise)) for b in base]}

    document = [run("interleaved", 0, 0.5, 0.05), run("interleaved", 1, 0.5, 0.05),
                run("duet", 0, 0.8, 0.005), run("duet", 1, 0.88, 0.005)]
    table = {r["mode"]: r for r in vs.duet_table(document)}
    assert [round(x, 2) for x in table["interleaved"]["ratios"]] == [0.5, 0.5]
    assert [round(x, 2) for x in table["duet"]["ratios"]] == [0.8, 0.88]
    assert table["duet"]["spread_over_se"] > 10 > 4 > table["interleaved"]["spread_over_se"]
    assert table["duet"]["half_width"] < table["interleaved"]["half_width"] / 5
    assert table["duet"]["rounds"] == 200 and table["duet"]["processes"] == 2


def _noisy_runs(ratios: dict[str, list[float]], halfwidth: float = 0.02) -> list[dict]:
    """Runs whose row `variant` read ratios[variant][k] in run k, each +-`halfwidth`."""
    count = len(next(iter(ratios.values())))
    return [{"rows": [{**_row("F", v, "inconclusive", r[k]), "ci_low": r[k] * (1 - halfwidth),
                       "ci_high": r[k] * (1 + halfwidth)} for v, r in ratios.items()]}
            for k in range(count)]
