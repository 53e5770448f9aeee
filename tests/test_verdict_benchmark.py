"""The verdict benchmark's reductions (`benchmarks/verdict_stability.py`): the counts its
tables print come from these functions, driven here with hand-made runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from benchmarks import verdict_stability as vs


def _row(finding, variant, verdict, ratio=1.0, placebo=False, halfwidth=0.02, **fields):
    return {"finding": finding, "case": "n=1", "variant": variant, "verdict": verdict,
            "placebo": placebo, "headline": True, "ratio": ratio,
            "ci_low": ratio * math.exp(-halfwidth), "ci_high": ratio * math.exp(halfwidth),
            "ci_level": 0.95, "status": "ok", **fields}


def _runs(log_ratios: list[list[float]], halfwidth: float) -> list[dict]:
    """Runs whose row k read exp(log_ratios[run][k]), each +-halfwidth in log."""
    return [{"seconds": 100.0, "rows": [_row("F", f"v{k}", "inconclusive", math.exp(x),
                                              halfwidth=halfwidth)
                                         for k, x in enumerate(run)]} for run in log_ratios]


def test_run_to_run_z_is_calibrated_when_the_runs_scatter_as_their_intervals_say():
    """Rows scattered from run to run with the sd their 95% intervals imply (a heavy-tailed
    t5 draw, not the normal the reduction reads the intervals by): about 5% beyond the
    level and a robust sd near 1; drawn at twice that sd, the reduction says so."""
    rng = np.random.default_rng(0)
    half = 0.02
    se = half / 1.959964
    honest = _runs((rng.standard_t(5, (12, 300)) * se / math.sqrt(5 / 3)).tolist(), half)
    s = vs.stability(honest)
    assert s["pairs"] == 11 and s["first"]["rows"] == 300 and s["later"]["rows"] == 3000
    assert 0.03 < s["later"]["beyond_level"] / 3000 < 0.08
    assert 0.85 < s["later"]["robust_sd"] < 1.15
    narrow = _runs((rng.normal(0, 2 * se, (4, 300))).tolist(), half)
    s = vs.stability(narrow)
    assert s["later"]["beyond_level"] / s["later"]["rows"] > 0.3
    assert s["later"]["robust_sd"] > 1.7


def test_the_first_pair_is_reduced_apart_from_the_later_ones():
    """A first run shifted by 10% against runs that agree: only the first pair breaks."""
    runs = _runs([[0.1] * 50] + [[0.0] * 50] * 3, 0.02)
    s = vs.stability(runs)
    assert s["first"]["beyond_level"] == 50 and s["first"]["beyond_4"] == 50
    assert s["later"]["beyond_level"] == 0 and s["later"]["rows"] == 100


def test_more_first_pairs_join_the_series_own_and_never_the_later_ones():
    """Fresh clones' pairs (a machine's first run, its second) pool with the series' first
    pair; a shifted first run in each reads beyond 4 in every pair, the later runs not."""
    runs = _runs([[0.1] * 50] + [[0.0] * 50] * 3, 0.02)
    more = [_runs([[0.0] * 50, [0.2] * 50], 0.02), _runs([[0.0] * 50, [0.0] * 50], 0.02)]
    s = vs.stability(runs, more)
    assert s["first_pairs"] == 3 and s["first"]["rows"] == 150
    assert s["first"]["beyond_4"] == 100 and s["later"]["rows"] == 100
    assert s["later"]["beyond_level"] == 0


def test_the_reference_times_at_the_threads_its_series_timed_at():
    """A series beside a busy process ran at one thread (the run leaves the busy core): its
    reference does too, not at the machine's cores; older series fall back to the
    condition's --threads, else the cores."""
    co_runner, other = vs.CONDITIONS["co-runner"], vs.CONDITIONS["other-kernels"]
    assert vs.reference_threads([{"threads": 1}], co_runner) == 1
    assert vs.reference_threads([{"rows": []}], other) == 1
    assert vs.reference_threads([{"rows": []}], co_runner) == (os.cpu_count() or 1)


def test_run_to_run_z_leaves_out_a_row_its_runs_compared_with_different_baselines():
    """One run timed the loop in a case, the next compared with a variant standing in
    for it: their ratios measure different things and give no z."""
    timed = {"rows": [_row("F", "loop", "baseline"), _row("F", "a", "faster", 0.002),
                      _row("F", "b", "faster", 0.5)]}
    stand_in = {"rows": [_row("F", "batched", "baseline"), _row("F", "a", "faster", 0.5),
                         _row("F", "b", "faster", 0.5)]}
    assert len(vs.pair_z(timed, timed)) == 2
    assert vs.pair_z(timed, stand_in) == []


def test_z_reads_each_interval_at_its_own_level():
    """A 99% interval as wide as another run's 95% one carries a smaller standard error."""
    a = {"rows": [_row("F", "v", "same", 1.0, halfwidth=0.0258)]}
    b = {"rows": [{**_row("F", "v", "same", 1.05, halfwidth=0.0258), "ci_level": 0.99}]}
    (z,) = vs.pair_z(a, b)
    expected = -math.log(1.05) / math.hypot(0.0258 / 1.959964, 0.0258 / 2.575829)
    assert z == pytest.approx(expected, rel=1e-4)


def test_z_takes_the_recorded_standard_error_over_a_wider_printed_interval():
    """Runs that scatter as their standard errors say, printed at 99.3% with a t quantile
    of 5 degrees of freedom (sampling that looked often): z from the recorded log_se is
    calibrated; read back from the printed intervals as normal ones it would shrink."""
    rng = np.random.default_rng(1)
    se, t_quantile = 0.01, 4.0  # t(5) at 99.3%
    runs = [{"rows": [{**_row("F", f"v{k}", "same", math.exp(x), halfwidth=t_quantile * se),
                       "ci_level": 0.993, "log_se": se}
                      for k, x in enumerate(run)]}
            for run in rng.normal(0, se, (6, 300)).tolist()]
    s = vs.stability(runs)
    assert 0.85 < s["later"]["robust_sd"] < 1.15
    assert 0.03 < s["later"]["beyond_level"] / s["later"]["rows"] < 0.08
    for run in runs:
        for row in run["rows"]:
            del row["log_se"]
    assert vs.stability(runs)["later"]["robust_sd"] < 0.8  # what the printed intervals say


def test_words_held_counts_intervals_holding_the_reference_and_contradicted_words():
    runs = [{"rows": [_row("F", "base", "baseline"), _row("F", "a", "faster", 0.8),
                      _row("F", "b", "slower", 1.2), _row("F", "c", "same", 1.0),
                      _row("F", "d", "inconclusive", 1.01)]}]
    reference = {("F", "n=1", "a", "base"): 0.81, ("F", "n=1", "b", "base"): 0.99,
                 ("F", "n=1", "c", "base"): 1.08, ("F", "n=1", "d", "base"): 1.0}
    held = vs.words_held(runs, reference)
    assert held == {"intervals": 4, "held": 2, "decisive": 3, "contradicted": 2,
                    "other_baseline": 0}


def test_a_row_compared_with_another_baseline_than_the_references_is_left_out():
    """Where a run did not time the baseline (the loop at sizes where it takes minutes),
    its rows are ratios to the variant standing in for it: a reference timed against the
    finding's baseline measures another ratio, hundreds of times off, and is neither held
    nor missed but counted apart. A run that timed the reference's baseline is compared."""
    stand_in = {"rows": [_row("F", "batched", "baseline"), _row("F", "a", "faster", 0.5)]}
    timed = {"rows": [_row("F", "loop", "baseline"), _row("F", "a", "faster", 0.002)]}
    reference = {("F", "n=1", "a", "loop"): 0.002}
    assert vs.words_held([stand_in, timed], reference) == {
        "intervals": 1, "held": 1, "decisive": 1, "contradicted": 0, "other_baseline": 1}


def test_the_draw_is_stratified_by_call_length_and_adds_two_mode_rows():
    rows = ([_row("F", f"short{k}", "faster", median_s=1e-6) for k in range(30)]
            + [_row("F", f"mid{k}", "faster", median_s=1e-4) for k in range(30)]
            + [_row("F", f"long{k}", "faster", median_s=1e-2) for k in range(3)])
    rows[0]["process_p"] = 0.001  # its processes disagreed: drawn whatever the strata say
    rows.append(_row("F", "base", "baseline", median_s=1e-3))
    drawn = vs.draw_rows([{"rows": rows}], 12, seed=1)
    assert {baseline for *_, baseline in drawn} == {"base"}  # what the run compared with
    variants = [v for _, _, v, _ in drawn]
    assert sum(v.startswith("long") for v in variants) == 3
    assert sum(v.startswith("mid") for v in variants) >= 4
    assert "short0" in variants and len(drawn) in (12, 13) and "base" not in variants
    assert drawn == vs.draw_rows([{"rows": rows}], 12, seed=1)


def test_the_reference_is_the_median_process(tmp_path):
    document = {"rows": [["F", "n=1", "a", "base"]],
                "processes": [{"F/n=1/a": x} for x in (0.9, 1.3, 0.95, 0.92, 5.0)]}
    assert vs.reference_ratios(document) == {("F", "n=1", "a", "base"): 0.95}
    with pytest.raises(ValueError, match=r"expected \[finding, case, variant, baseline\]"):
        vs.reference_ratios({"rows": [["F", "n=1", "a"]], "processes": []})


def test_a_condition_table_gives_its_bars_and_what_was_measured(tmp_path):
    rng = np.random.default_rng(3)
    runs = _runs(rng.normal(0, 0.01, (5, 40)).tolist(), 0.02)
    for run in runs:
        run["calibration"] = {"rows": 40, "disagreeing": 2, "expected": 5, "inflation": 1.0}
    (tmp_path / "series-here.json").write_text(json.dumps(
        {"condition": "here", "commit": "0123456789abcdef", "runs": runs}))
    table = vs.markdown("condition", tmp_path, "here")
    assert "5 default runs of 0123456789" in table
    assert "| robust sd of z (IQR / 1.349), consecutive runs after the first (3 pairs) |" in table
    assert "| rows whose processes disagreed (the runs' own A/A test, 5% level) | about 5% | " \
           "10 of 200 (5.0%); 0 of 5 runs widened their intervals |" in table
    assert "not measured: run `reference --condition here`" in table


def test_a_series_says_the_cpu_its_runs_measured_on_where_they_recorded_it(tmp_path):
    assert vs.machine_label({"cpu_model": "Intel(R) Xeon(R) Processor",
                             "aten_cpu_capability": "AVX512"}) == \
        "Intel(R) Xeon(R) Processor, AVX512"
    assert vs.machine_label({"threads": 2}) is None
    runs = _runs(np.zeros((3, 10)).tolist(), 0.02)
    document = {"condition": "here", "commit": "c" * 12, "runs": runs}
    (tmp_path / "series-here.json").write_text(json.dumps(document))
    assert "3 default runs of cccccccccc, the first" in vs.markdown("condition", tmp_path, "here")
    for run in runs:
        run["cpu"] = "Intel(R) Xeon(R) Processor, AVX512"
    (tmp_path / "series-here.json").write_text(json.dumps(document))
    assert "3 default runs of cccccccccc on Intel(R) Xeon(R) Processor, AVX512, the first" in \
        vs.markdown("condition", tmp_path, "here")


def test_another_machines_sets_have_their_own_rows_and_tables(tmp_path):
    """Sets copied into machines/<name>/ stand beside the folder's own: a row of the
    conditions table for each series measured there, named with its CPU, and its own
    condition table; a condition not measured there adds no row."""
    rng = np.random.default_rng(5)
    own = _runs(rng.normal(0, 0.01, (3, 20)).tolist(), 0.02)
    (tmp_path / "series-here.json").write_text(json.dumps(
        {"condition": "here", "commit": "a" * 12, "runs": own}))
    other = _runs(rng.normal(0, 0.01, (4, 20)).tolist(), 0.02)
    for run in other:
        run["cpu"] = "Intel(R) Xeon(R) Processor, AVX512"
    (tmp_path / "machines" / "xeon").mkdir(parents=True)
    (tmp_path / "machines" / "xeon" / "series-here.json").write_text(json.dumps(
        {"condition": "here", "commit": "d" * 12, "runs": other}))
    rows = vs.markdown("conditions", tmp_path).splitlines()
    assert [r.split(" | ")[:2] for r in rows if r.startswith("| here")] == [
        ["| here", "3 default"],
        ["| here, xeon (Intel(R) Xeon(R) Processor, AVX512)", "4 default"]]
    assert not any(r.startswith("| co-runner, xeon") for r in rows)
    table = vs.markdown("condition", tmp_path, "here", "xeon")
    assert "4 default runs of dddddddddd on Intel(R) Xeon(R) Processor, AVX512" in table
    assert "3 default runs" not in table
    # gate runs too: the machine's own table, the folder's (none here) apart
    (tmp_path / "machines" / "xeon" / "gate-runs.json").write_text(json.dumps([
        {"check": "c", "condition": "unchanged", "expect_flag": False, "exit_codes": [0, 0],
         "seconds": [110.0, 114.0], "ranks": [0, 0], "rows": [[], []],
         "commits": ["e" * 40] * 2}]))
    assert "| unchanged | at most 5% | 2 | 0 (0%) |" in vs.markdown("gate-power", tmp_path,
                                                                   "xeon")
    assert vs.markdown("gate-power", tmp_path) == "(not measured: run `gate`)"


def test_a_condition_with_default_and_quick_series_shows_both(tmp_path):
    """Each kind of series measured for a condition has its own table and its own row of
    the conditions table, the default runs' first, each with its own run times."""
    rng = np.random.default_rng(4)
    for quick, seconds in ((False, 140.0), (True, 34.0)):
        runs = _runs(rng.normal(0, 0.01, (3, 20)).tolist(), 0.02)
        for run in runs:
            run["seconds"] = seconds
        (tmp_path / f"series-here{'-quick' * quick}.json").write_text(json.dumps(
            {"condition": "here", "commit": ("b" if quick else "a") * 12, "runs": runs}))
    table = vs.markdown("condition", tmp_path, "here")
    default, quick = table.index("3 default runs of aaaaaaaaaa"), table.index(
        "3 `--quick` runs of bbbbbbbbbb")
    assert default < quick
    assert "| run time, report included | at most 150 s | first 140 s" in table[:quick]
    assert "| run time, report included | at most 40 s | first 34 s" in table[quick:]
    rows = [line for line in vs.markdown("conditions", tmp_path).splitlines()
            if line.startswith("| here |")]
    assert [row.split(" | ")[1] for row in rows] == ["3 default", "3 `--quick`"]
    assert rows[0].endswith("| 140 s first, 140 s |") and rows[1].endswith("| 34 s first, 34 s |")


def test_gate_chunks_merge_by_condition_and_the_table_counts_them(tmp_path):
    first = [{"check": "c", "condition": "unchanged", "expect_flag": False,
              "exit_codes": [0], "seconds": [90.0], "ranks": [0], "rows": [[]]}]
    chunk = [{"check": "c", "condition": "unchanged", "expect_flag": False,
              "exit_codes": [1, 0], "seconds": [80.0, 100.0], "ranks": [0, 0], "rows": [[], []]},
             {"check": "c", "condition": "scan 1.15x slower", "expect_flag": True,
              "exit_codes": [1], "seconds": [70.0], "ranks": [0], "commits": ["abcdef0123456"],
              "rows": [[{"variant": "scan", "ci": {"ratio": 1.12, "low": 1.08, "high": 1.16}},
                        {"variant": "scan", "ci": {"ratio": 1.10, "low": 1.06, "high": 1.14}},
                        {"variant": "loop", "ci": {"ratio": 1.0, "low": 0.9, "high": 1.1}}]]}]
    merged = vs._merge_gate(first, chunk)
    assert [s["exit_codes"] for s in merged] == [[0, 1, 0], [1]]
    assert all(len(s["rows"]) == len(s["exit_codes"]) for s in merged)
    (tmp_path / "gate-runs.json").write_text(json.dumps(merged))
    table = vs.markdown("gate-power", tmp_path)
    # the runs saved without their commit are said to be of an earlier one
    assert "Gate runs of abcdef0123 (3 of them of an earlier commit)." in table
    assert "| unchanged | at most 5% | 3 | 1 (33%) | 6-79% | - | - | 90 |" in table
    # the planted variant's cells measured 1.10 and 1.12: their median, not the plant's
    # 1.15, and the scenario is held to the bar of the slowdown nearest what it measured
    assert ("| scan 1.15x slower | at least 95% | 1 | 1 (100%) | 21-100% | 1.110 | - | 70 |"
            in table)
    slight = [{**merged[1], "condition": "scan 1.06x slower", "rows": [[
        {"variant": "scan", "ci": {"ratio": 1.077, "low": 1.05, "high": 1.1}}]]}]
    (tmp_path / "gate-runs.json").write_text(json.dumps(slight))
    assert "| scan 1.06x slower | at least 80% | 1 |" in vs.markdown("gate-power", tmp_path)
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
        arguments = ("co-runner",) if kind == "condition" else ()
        assert "not measured: run `" in vs.markdown(kind, tmp_path, *arguments)


def test_unchanged_gate_cells_are_counted_by_whether_their_interval_holds_1():
    document = [{"condition": "unchanged (co-runner)", "exit_codes": [0, 0], "seconds": [1, 1],
                 "rows": [[{"ci": {"ratio": 1.0, "low": 0.98, "high": 1.02}},
                           {"ci": {"ratio": 1.05, "low": 1.01, "high": 1.09}}],
                          [{"ci": None}, {"ci": {"ratio": 1.0, "low": 0.9, "high": 1.1}}]]}]
    (row,) = vs.gate_table(document)
    assert (row["cells"], row["excluding"]) == (3, 1)
    assert vs._slowdown("unchanged (co-runner)") == 1.0


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


@pytest.mark.integration
@pytest.mark.usefixtures("cores_calm")
def test_the_reference_worker_times_a_quick_series_rows_at_their_quick_cases():
    """A quick series' rows name quick cases (the training iteration's 2 envs x 5 steps
    exists only there): the reference times them at those cases, one ratio per row, the
    placebo at 1, each against the baseline its row names."""
    gae = ["B4-CR-03", "num_envs=4,max_steps=25,dones=episode", "batched"]
    rows = [["E2E-iteration", "num_envs=2,max_steps=5", "reviews", "original"],
            ["E2E-iteration", "num_envs=2,max_steps=5", "placebo", "original"],
            [*gae, "batched"], [*gae[:2], "scan", "loop"]]
    done = subprocess.run([sys.executable, "-c", vs.REFERENCE_WORKER, json.dumps(rows), "1",
                           "quick"], cwd=vs.REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ratios = json.loads(done.stdout.strip().splitlines()[-1])
    assert ratios["E2E-iteration/num_envs=2,max_steps=5/placebo"] == 1.0
    assert 0.2 < ratios["E2E-iteration/num_envs=2,max_steps=5/reviews"] < 5.0
    # batched against itself; scan against the 300-read Python loop (about 10x faster). A
    # median of 5 calls of ~0.7 ms beside the other test workers reads 1 +- half: a row timed
    # against the wrong baseline (the loop) would read about 0.1
    assert 0.5 < ratios["B4-CR-03/num_envs=4,max_steps=25,dones=episode/batched"] < 2.0
    assert ratios["B4-CR-03/num_envs=4,max_steps=25,dones=episode/scan"] < 0.5


def test_the_reference_times_at_the_threads_it_is_given_and_leaves_out_its_loop():
    """torch.utils.benchmark's Timer runs at one thread unless told: the reference's calls
    see the thread count of the condition. The loop's own cost (an empty call: well under
    10 us) is taken from each call's time, never below 5% of it."""
    seen = []

    def call():  # 20 ms at least; a busy machine's late wake-ups add to it, never take
        seen.append(torch.get_num_threads())
        time.sleep(0.02)

    assert vs.reference_per_call(call, 2, 0.0, min_run_time=0.05) >= 0.02
    assert set(seen) == {2}
    assert 0 < vs.reference_loop_s(1, min_run_time=0.02) < 1e-5
    kept = vs.reference_per_call(call, 1, 0.019, min_run_time=0.05)  # 20 ms less 19
    assert 0.001 <= kept < 0.015  # 0.015: a sleep 14 ms late
    floor = vs.reference_per_call(call, 1, 1.0, min_run_time=0.05)  # a loop dearer than it
    assert 0.05 * 0.02 <= floor < 0.05 * 0.1


def test_a_fresh_clones_caches_include_the_temp_dir_where_inductor_keeps_its_headers(tmp_path):
    """Inductor keeps its precompiled headers under the temp dir, whatever
    TORCHINDUCTOR_CACHE_DIR says: a run given `compile_caches` has its temp dir (and so
    inductor's default cache folder) in the caches folder, empty for each fresh clone."""
    environment = {**os.environ, **vs.compile_caches(tmp_path / "caches")}
    done = subprocess.run(
        [sys.executable, "-c", "import tempfile; from torch._inductor.runtime.cache_dir_utils "
         "import default_cache_dir; print(tempfile.gettempdir()); print(default_cache_dir())"],
        capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    temp, inductor_default = done.stdout.split()
    assert temp == str(tmp_path / "caches" / "tmp")
    assert inductor_default.startswith(temp)
