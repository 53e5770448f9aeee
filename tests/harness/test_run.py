"""harness.run end to end: schema, correctness gate, failure isolation, exit codes."""

from __future__ import annotations

import math
import os

import gzip
import json
import re
import time
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from harness import findings as registry, plan
from harness.findings import Case, Finding, Recording
from harness.isa_checks import IsaChecks
from harness.ranks import usable_cores
from harness.results import SCHEMA_VERSION, load_run
from harness.run import main

TEST_ID = "TEST-tiny"


def _tiny_finding(calls_before_interrupt: int | None = None) -> Finding:
    """Variants: `good` (baseline), `twice` (same result, double work), `wrong` (off by
    one), `boom` (raises). Optionally `good` raises KeyboardInterrupt after N calls."""
    counter = {"n": 0}

    def make_call(variant: str, x: torch.Tensor):
        def good():
            counter["n"] += 1
            if calls_before_interrupt is not None and counter["n"] > calls_before_interrupt:
                raise KeyboardInterrupt
            return (x * 2).sum()

        calls = {
            "good": good,
            "twice": lambda: ((x * 2).sum() + (x * 2).sum()) / 2,
            "wrong": lambda: (x * 2).sum() + 1,
            "boom": lambda: (_ for _ in ()).throw(RuntimeError("variant exploded")),
        }
        return calls[variant]

    return Finding(
        id=TEST_ID, title="tiny", claim="a test claim",
        variants=("good", "twice", "wrong", "boom"), baseline="good",
        cases=lambda quick: [Case.of(n=64), Case.of(n=4096)],
        build=lambda case, device, seed: torch.arange(case["n"], dtype=torch.float64, device=device),
        make_call=make_call,
        check=lambda out, ref: abs(float(out) - float(ref)),
        tolerance=lambda case: 1e-9,
    )


@pytest.fixture
def tiny(request):
    registry.FINDINGS[TEST_ID] = _tiny_finding(getattr(request, "param", None))
    yield TEST_ID
    del registry.FINDINGS[TEST_ID]


ARGS = ["--findings", TEST_ID, "--budget", "1", "--every-cell", "--device", "cpu"]


@pytest.mark.integration
def test_gate_failure_isolation_and_schema(tiny, tmp_path):
    code = main(ARGS + ["--out", str(tmp_path)])
    assert code == 1  # a mismatch and a crash: not every variant agreed
    run = load_run(None, tmp_path)
    assert (tmp_path / "latest").read_text().strip() == run.run_id
    assert run.metadata["schema_version"] == SCHEMA_VERSION and run.metadata["status"] == "complete"
    for key in ("run_id", "created", "git_commit", "git_dirty", "python", "torch", "device_name",
                "cpu_model", "threads", "command"):
        assert key in run.metadata, key

    s = run.summary.set_index(["case", "variant"])
    for case in ("n=64", "n=4096"):
        assert s.loc[(case, "good"), "verdict"] == "baseline"
        assert s.loc[(case, "wrong"), "status"] == "mismatch"
        assert s.loc[(case, "wrong"), "max_error"] == pytest.approx(1.0)
        assert pd.isna(s.loc[(case, "wrong"), "median_s"])  # not timed
        assert s.loc[(case, "boom"), "status"] == "failed"
        assert "variant exploded" in s.loc[(case, "boom"), "error"]
        assert s.loc[(case, "twice"), "status"] == "ok"
        assert s.loc[(case, "twice"), "ci_low"] <= s.loc[(case, "twice"), "ratio"] <= s.loc[(case, "twice"), "ci_high"]
        assert s.loc[(case, "good"), "allocations"] >= 1  # the profiling pass ran

    # the headline case (the first) also times the baseline against a copy of itself
    assert s.loc[("n=64", "placebo"), "placebo"] and s.loc[("n=64", "placebo"), "headline"]
    assert ("n=4096", "placebo") not in s.index
    rows = pd.read_csv(run.folder / "rows.csv")
    assert set(rows["variant"]) == {"good", "twice", "placebo"}
    assert {"round", "position"} <= set(rows.columns)
    assert {"finding", "variant", "case", "p_n", "sample", "seconds", "allocations"} <= set(rows.columns)
    assert (rows["seconds"] > 0).all()
    with gzip.open(run.folder / "traces" / f"{TEST_ID}.json.gz", "rt") as f:
        trace = json.load(f)["traceEvents"]
    assert {e["name"] for e in trace if e["name"].startswith("variant:")} == {
        "variant:good", "variant:twice"}  # the timed variants, each under its range
    assert len(rows) == len(run.rows)


@pytest.mark.parametrize("tiny", [3], indirect=True)
def test_ctrl_c_keeps_what_was_measured(tiny, tmp_path):
    code = main(ARGS + ["--out", str(tmp_path), "--no-profile"])
    assert code == 130
    document = json.loads(next(tmp_path.glob("*/run.json")).read_text())
    assert document["status"] == "interrupted"


@pytest.mark.integration
def test_real_findings_quick_run_agree(tmp_path, capsys):
    code = main(["--quick", "--findings", "B4-DRL-03", "B4-PT-05", "H3-stream-sync",
                 "--budget", "1", "--every-cell", "--out", str(tmp_path), "--device", "cpu"])
    assert code == 0
    # how sampling went, under the table: 3 timed cells (H3 needs CUDA and is not one),
    # where the time went, the placebos and the words
    out = capsys.readouterr().out
    assert re.search(r"\nsampling: 3 timed cells: .*timing spread", out)
    assert re.search(r"\ntime: (under a second|\d+ s (sampling|first calls|profiling))", out)
    assert re.search(r"\nnoise floor: 2 placebos ", out)  # B4-DRL-03 and B4-PT-05's headlines
    assert re.search(r"\nwords: \d+ decisive of 9, ", out)  # 2 + 1 cells x 3 variants
    summary = load_run(None, tmp_path).summary
    h3 = summary[summary["finding"] == "H3-stream-sync"]
    assert (h3["verdict"] == "needs_cuda").all() and h3["median_s"].isna().all()
    drl = summary[(summary["finding"] == "B4-DRL-03") & (summary["case"].str.contains("random"))]
    rows = drl.set_index("variant").loc[["clone", "mask"]]
    if "allocations" in rows and rows["allocations"].notna().all():
        assert (rows["allocations"] > 0).all()
    else:  # a machine slowed past the 1 s profile allowance: each row says so, with the cost
        notes = rows["profile_note"]
        assert notes.str.startswith(plan.BUDGET_UNPROFILED).all(), notes


def test_usage_errors_exit_2(capsys):
    assert main(["--findings", "NOPE"]) == 2
    err = capsys.readouterr().err
    assert "unknown id(s) NOPE" in err and "B4-CR-03" in err
    assert main(["--budget", "-1"]) == 2
    if not torch.cuda.is_available():
        assert main(["--device", "cuda"]) == 2
        assert "torch.cuda.is_available() is False" in capsys.readouterr().err


@pytest.mark.integration
def test_list_and_cli_subprocess():
    out = subprocess.run([sys.executable, "-m", "harness.run", "--list"],
                         capture_output=True, text=True, check=True).stdout
    for finding_id in ("B4-CR-03", "B4-DRL-03", "B4-PT-05", "H3-stream-sync", "E2E-iteration"):
        assert finding_id in out


@pytest.mark.integration
def test_ratio_falls_back_to_first_timed_variant_when_baseline_is_skipped(tmp_path):
    import dataclasses

    finding = dataclasses.replace(
        _tiny_finding(), variants=("good", "twice"), reference=lambda x: (x * 2).sum(),
        skip=lambda variant, case, device: "too slow here" if variant == "good" and case["n"] > 100 else None,
    )
    registry.FINDINGS[TEST_ID] = finding
    try:
        assert main(ARGS + ["--out", str(tmp_path), "--no-profile"]) == 0
    finally:
        del registry.FINDINGS[TEST_ID]
    s = load_run(None, tmp_path).summary.set_index(["case", "variant"])
    assert s.loc[("n=64", "twice"), "compared_to"] == "good"
    assert s.loc[("n=4096", "good"), "status"] == "not_timed"
    assert s.loc[("n=4096", "good"), "reason"] == "too slow here"
    assert s.loc[("n=4096", "twice"), "verdict"] == "baseline"
    assert "stands in for the baseline good" in s.loc[("n=4096", "twice"), "reason"]


def test_paired_finding_interval_over_rounds_whose_work_varies():
    """Round k of both variants does the same (varying) work, as iterations k of two
    trainers from one seed do: `sleep` of 5 (1 + k % 4) ms, twice that for `double`. The
    paired interval is taken over per-round ratios, so the 4x spread of the work cancels
    (it would dominate the spread of either variant's own samples). Sample metrics (here
    the work's size) get medians and per-round differences."""
    from harness.runner import CaseRun, RunOptions
    import time as time_module

    def build(case, device, seed):
        return {"calls": {"single": 0, "double": 0}}

    def make_call(variant, inputs):
        factor = 2 if variant == "double" else 1

        def call():
            k = inputs["calls"][variant]
            inputs["calls"][variant] += 1
            time_module.sleep(factor * (1 + k % 4) * 5e-3)
            return torch.zeros(())

        return call

    finding = Finding(
        id="TEST-paired", title="paired", claim="double takes twice as long",
        variants=("single", "double"), baseline="single",
        cases=lambda quick: [Case.of(n=1)], build=build, make_call=make_call,
        recording=Recording(paired=True, sample_metrics=lambda variant, inputs: {
            "work_ms": float((2 if variant == "double" else 1) * (1 + (inputs["calls"][variant] - 1) % 4))}),
    )
    options = RunOptions(device=torch.device("cpu"), min_samples=16,
                         max_samples=16, precision=0.0, profile=False)
    cell = CaseRun(finding, Case.of(n=1), options, sampling_s=0.01).run()
    rows = {r["variant"]: r for r in cell.summary}
    double = rows["double"]
    assert double["ci_low"] <= double["ratio"] <= double["ci_high"]
    assert 1.5 < double["ratio"] < 2.5
    m = cell.measurements
    spread = np.log(max(m["single"].samples) / min(m["single"].samples))  # about log 4
    assert math.log(double["ci_high"] / double["ci_low"]) < spread / 4
    # the sample metrics: their medians and the per-round difference (double - single)
    assert rows["single"]["work_ms"] == pytest.approx(2.5, abs=1.0)
    assert double["work_ms_diff"] == pytest.approx(rows["single"]["work_ms"], abs=1.0)
    assert double["work_ms_diff_low"] <= double["work_ms_diff"] <= double["work_ms_diff_high"]
    samples = cell.samples
    assert {"work_ms"} <= set(samples[0]) and len(samples) == 2 * m["single"].n
    # one call per sample and the same calls in the same order: rounds are aligned
    assert m["single"].number_per_sample == m["double"].number_per_sample == 1
    assert cell.inputs["calls"]["single"] == cell.inputs["calls"]["double"]


def test_rows_that_carry_a_warning_are_named_for_the_run_metadata():
    from esper_review.findings.e2e import stream_fields
    from harness.run import row_warnings

    rows = [{"finding": "E2E-iteration", "case": "num_envs=48", "variant": "original",
             **stream_fields(env_streams=32, num_envs=48)},
            {"finding": "E2E-iteration", "case": "num_envs=4", "variant": "original",
             **stream_fields(env_streams=4, num_envs=4)},
            {"finding": "B4-CR-03", "case": "x", "variant": "scan", "p_num_envs": 64}]
    assert row_warnings(rows) == [{"finding": "E2E-iteration", "case": "num_envs=48",
                                   "variant": "original",
                                   "warning": "48 envs ran on 32 CUDA streams: envs sharing "
                                              "a stream serialise"}]


@pytest.mark.integration
def test_long_findings_run_only_when_named_or_with_all(tmp_path, capsys,
                                                      outside_the_repository):
    module = ["--findings-module", "tests.findings_modules.long_and_short"]
    quick = ["--budget", "1", "--every-cell", "--no-profile", "--no-report"]
    assert main([*module, "--list"]) == 0
    listed = capsys.readouterr().out
    assert ("TEST-long" in listed and "TEST-short" in listed
            and "long: runs when named or with --all; about 20 s quick, 600 s default" in listed)
    assert main([*module, *quick, "--out", str(tmp_path / "default")]) == 0
    assert set(load_run(None, tmp_path / "default").summary["finding"]) == {"TEST-short"}
    assert main([*module, *quick, "--findings", "TEST-long", "--out", str(tmp_path / "named")]) == 0
    assert set(load_run(None, tmp_path / "named").summary["finding"]) == {"TEST-long"}
    assert main([*module, *quick, "--all", "--out", str(tmp_path / "all")]) == 0
    assert set(load_run(None, tmp_path / "all").summary["finding"]) == {"TEST-short", "TEST-long"}
    assert main([*module, "--all", "--findings", "TEST-long"]) == 2
    assert "--all: expected without --findings" in capsys.readouterr().err


def test_calls_over_the_findings_profile_limit_get_no_counters_and_say_why():
    import dataclasses
    import time as time_module

    from harness.runner import CaseRun, RunOptions

    finding = dataclasses.replace(
        _tiny_finding(), variants=("good", "twice"), recording=Recording(profile_max_s=0.02),
        make_call=lambda variant, x: ((lambda: (x * 2).sum()) if variant == "good"
                                      else (lambda: (time_module.sleep(0.03), (x * 2).sum())[1])),
    )
    options = RunOptions(device=torch.device("cpu"), min_samples=3)
    rows = {r["variant"]: r for r in CaseRun(finding, Case.of(n=64), options,
                                             sampling_s=0.05).run().summary}
    assert rows["good"]["op_calls"] >= 1 and "profile_note" not in rows["good"]
    assert "op_calls" not in rows["twice"] and rows["twice"]["status"] == "ok"
    assert rows["twice"]["profile_note"].startswith("not profiled: one call takes 0.03")


def test_a_cell_samples_its_share_of_seconds_and_stops_there():
    import dataclasses
    import time as time_module

    from harness.runner import CaseRun, RunOptions

    def make_call(variant, x):
        return lambda: (time_module.sleep(2e-3), (x * 2).sum())[1]

    finding = dataclasses.replace(_tiny_finding(), variants=("good", "twice"), make_call=make_call)
    options = RunOptions(device=torch.device("cpu"), min_samples=3, precision=0.0, profile=False)
    rounds = {}
    for share in (0.05, 0.4):
        cell = CaseRun(finding, Case.of(n=64), options, sampling_s=share).run()
        (row,) = [r for r in cell.summary if r["variant"] == "twice"]
        assert row["stopped_by"] == "time_budget"
        rounds[share] = row["n"]
    # ~4 ms a round: 0.05 s holds a handful of rounds, 0.4 s several times as many
    assert rounds[0.4] >= 3 * rounds[0.05], rounds


@pytest.mark.integration
def test_a_paired_findings_placebo_steps_in_lockstep_with_the_baseline(tmp_path):
    """A paired finding's calls advance state (E2E-iteration: one training iteration a
    call), and round k pairs the k-th timed call of each side. The placebo, on its own
    inputs, must have made as many calls as the baseline before timing starts, or every
    round pairs iterations one apart (the placebo was once never given the baseline's
    first, checked call)."""
    def build(case, device, seed):  # each variant's own state, as E2E's trainers
        return {"a": {"calls": 0}, "b": {"calls": 0}}

    def make_call(variant, states):
        def step():
            states[variant]["calls"] += 1
            return torch.tensor(float(states[variant]["calls"]))
        return step

    finding = Finding(
        id="TEST-paired", title="paired", claim="a paired claim",
        variants=("a", "b"), baseline="a", cases=lambda quick: [Case.of(n=1)],
        build=build, make_call=make_call, check=lambda out, ref: abs(float(out) - float(ref)),
        tolerance=lambda case: 0.0, recording=Recording(
            paired=True,
            sample_metrics=lambda variant, states: {"calls_so_far": float(states[variant]["calls"])}),
    )
    registry.FINDINGS[finding.id] = finding
    try:
        assert main(["--findings", finding.id, "--quick", "--out", str(tmp_path), "--no-report",
                     "--no-profile", "--budget", "1", "--every-cell"]) == 0
    finally:
        del registry.FINDINGS[finding.id]
    rows = load_run(None, tmp_path).rows
    calls = rows.pivot_table(index="round", columns="variant", values="calls_so_far")
    assert len(calls) >= 5
    assert (calls["placebo"] == calls["a"]).all() and (calls["b"] == calls["a"]).all(), calls
    # no warm-up beyond the timed first call: the prepared cell's first (checked) call, the
    # timed first, then round 0 (two more calls were 10 s a process of training iterations)
    assert set(rows[rows["round"] == 0].calls_so_far) == {3.0}, rows


@pytest.mark.parametrize("paired", [False, True])
def test_the_placebo_shares_the_variants_inputs_unless_its_finding_is_paired(paired):
    """Every variant of a cell is timed on one build's inputs, so the placebo is too: on a
    second copy of its own, H4-bootstrap-tensor's placebo read 1-2% slower than the
    baseline in-process and 4-12% in runs (batch-1 forwards of a second policy whose
    weights were cold in the caches the variants kept warm for theirs), a bias no
    variant's ratio has. A paired finding's placebo keeps its own copy: its calls advance
    state, in lockstep with the baseline's (the test above)."""
    from harness.runner import PLACEBO, CaseRun, RunOptions

    builds, called_on = [], []

    def build(case, device, seed):
        builds.append(seed)
        return {"x": torch.arange(8.0)}

    def make_call(variant, inputs):
        called_on.append(id(inputs))
        return lambda: inputs["x"].sum()

    finding = Finding(
        id="TEST-placebo-inputs", title="placebo inputs", claim="a claim",
        variants=("a", "b"), baseline="a", cases=lambda quick: [Case.of(n=1)],
        build=build, make_call=make_call, check=lambda out, ref: abs(float(out) - float(ref)),
        tolerance=lambda case: 0.0, recording=Recording(paired=paired))
    options = RunOptions(device=torch.device("cpu"), min_samples=3, profile=False)
    cell = CaseRun(finding, Case.of(n=1), options, headline=True, sampling_s=0.02).run()
    assert cell.cells[PLACEBO].get("status", "ok") == "ok", cell.cells[PLACEBO]
    assert any(r["variant"] == PLACEBO for r in cell.summary)
    assert len(builds) == (2 if paired else 1)
    assert len(set(called_on)) == len(builds)


def _sized(finding_id: str, sizes: tuple[int, ...], headline: int | None = None) -> Finding:
    """A finding of a sum over n elements at each of `sizes`; its headline the case of
    `headline` (None: the first)."""
    return Finding(
        id=finding_id, title="sum", claim="a sum", variants=("sum", "double"), baseline="sum",
        cases=lambda quick: [Case.of(n=n) for n in sizes],
        build=lambda case, device, seed: torch.ones(case["n"]),
        make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum" else (
            lambda: (x + x).sum() / 2),
        check=lambda out, ref: abs(float(out) - float(ref)), tolerance=lambda case: 1e-6,
        reading=registry.Reading(headline_case=None if headline is None else (
            lambda cases: next(c for c in cases if c["n"] == headline))))


@pytest.mark.integration
def test_a_run_keeps_what_its_last_report_took_out_of_its_budget(tmp_path, capsys):
    """A run records what its report took beside the report; the next run keeps that much
    at the end of its budget (its import once, its figures per finding, a second to combine
    the rows: `report_s`), never more than a quarter of the budget, and a run without a
    report keeps the second only."""
    finding = _sized("TEST-report", (64,))
    registry.FINDINGS[finding.id] = finding
    args = ["--findings", finding.id, "--quick", "--out", str(tmp_path / "results"),
            "--no-profile", "--budget", "40"]
    try:
        assert main(args) == 0
        first = load_run(None, tmp_path / "results")
        recorded = tmp_path / "reports" / first.run_id / "render.json"
        document = json.loads(recorded.read_text())
        assert document["findings"] == 1 and 0 < document["import_s"] + document["render_s"] < 40
        capsys.readouterr()
        for render_s, extra, kept in ((50.0, ["--no-report"], "1 s"), (50.0, [], "10 s")):
            recorded.write_text(json.dumps({"import_s": 1.0, "render_s": render_s,
                                            "findings": 1}))
            assert main(args + extra) == 0
            plan_line = next(line for line in capsys.readouterr().err.splitlines()
                             if line.startswith("plan: "))
            assert plan_line.endswith(f"and {kept} to combine the rows and report them")
            if not extra:  # the newest report: the next run reads it
                recorded = (tmp_path / "reports" / load_run(None, tmp_path / "results").run_id
                            / "render.json")
    finally:
        del registry.FINDINGS[finding.id]


def test_a_fresh_process_is_expected_to_pay_its_findings_first_calls_again():
    """A worker paid B4-CR-03's compiles in its first cell of it (6 s) and 0.02 s in the
    next: a fresh process that takes only the next cell pays the 6 s there (a quick
    run's third process, told 0.02 s, took 8 s past a budget with 1.6 s left)."""
    from harness.run import fresh_costs
    from harness.runner import RunOptions
    entries = {("A", "first"): {"seconds": {"worker_other": 6.0, "worker_time": 0.8}},
               ("A", "next"): {"seconds": {"worker_other": 0.02, "worker_time": 0.2}},
               ("B", "only"): {"seconds": {"worker_other": 0.5, "worker_time": 0.1}},
               ("B", "left out"): {},
               ("C", "unknown"): {}}
    options = RunOptions(device=torch.device("cpu"), processes=2)
    costs = fresh_costs([("A", "next"), ("B", "only"), ("C", "unknown")], entries, options, 0.3)
    assert costs == {("A", "next"): pytest.approx(6.3), ("B", "only"): pytest.approx(0.8),
                     ("C", "unknown"): pytest.approx(plan.GUESS_FIXED_S + 0.3)}
    three = RunOptions(device=torch.device("cpu"), processes=3)  # the mean over 2 workers
    costs = fresh_costs([("A", "next"), ("C", "unknown")], entries, three, 0.05)
    assert costs == {("A", "next"): pytest.approx(3.1),
                     ("C", "unknown"): pytest.approx(plan.GUESS_FIXED_S + 0.05)}
    failed = {("D", "1"): {"seconds": {"worker_other": 0.0, "worker_time": 0.0}}}
    assert fresh_costs([("D", "1")], failed, options, 0.3) == {
        ("D", "1"): pytest.approx(plan.GUESS_FIXED_S + 0.3)}


def test_one_thread_processes_are_expected_to_compile_what_the_warm_up_built_for_more():
    """A finding warmed from empty caches (24 s here) had its code built for the run's
    threads; two processes at one thread compile their own: that cost is foreseen, once;
    a finding whose warm-up failed, or that was not warmed, costs its fresh processes'."""
    from harness.run import one_thread_costs
    from harness.runner import RunOptions
    entries = {("A", "h"): {"seconds": {"worker_other": 6.0, "worker_time": 0.8}},
               ("B", "h"): {"seconds": {"worker_other": 0.5, "worker_time": 0.1}},
               ("C", "h"): {"seconds": {"worker_other": 0.5, "worker_time": 0.1}}}
    options = RunOptions(device=torch.device("cpu"), processes=2)
    costs = one_thread_costs([("A", "h"), ("B", "h"), ("C", "h")], entries, options, 0.3,
                             {"A": 24.0, "B": "the warm-up process could not start"})
    assert costs == {("A", "h"): pytest.approx(2 * 6.8 + 24.0),
                     ("B", "h"): pytest.approx(2 * 0.8), ("C", "h"): pytest.approx(2 * 0.8)}


@pytest.mark.integration
def test_a_cell_whose_least_sampling_would_end_past_the_budget_is_left_out_after_its_first_calls(
        tmp_path, capsys):
    """A case of 0.5 s calls: its first calls show that its least rounds (5 rounds of two
    variants in two processes: 10 s) would end past a 12 s budget, so it is left out there,
    its rows saying why; the headline before it is measured."""
    def call(variant, x):
        if x.numel() > 64:
            return lambda: (time.sleep(0.5), x.sum())[1]
        return lambda: x.sum()

    finding = Finding(
        id="TEST-slow-case", title="sum", claim="a sum", variants=("sum", "again"),
        baseline="sum", cases=lambda quick: [Case.of(n=64), Case.of(n=128)],
        build=lambda case, device, seed: torch.ones(case["n"]), make_call=call,
        check=lambda out, ref: abs(float(out) - float(ref)), tolerance=lambda case: 1e-6)
    rows = _quick_run(finding, tmp_path, "12")
    assert set(rows[rows.status == "ok"].case) == {"n=64"}
    slow = rows[rows.case == "n=128"]
    assert set(slow.status) == {"not_timed"} and len(slow) == 2
    assert all(r.startswith("left out to keep the run's budget of 12 s: its least sampling (5 "
                            "rounds of 1 s in 2 processes) would end") for r in slow.reason)
    assert re.search(r"\[2/2\] TEST-slow-case n=128: [\d.]+ s, left out \(budget\)",
                     capsys.readouterr().err)


def _quick_run(finding: Finding, out, budget: str) -> pd.DataFrame:
    """The summary of a quick run of `finding` alone (registered for it) within `budget`
    seconds, without profile or report; the run must exit 0."""
    registry.FINDINGS[finding.id] = finding
    try:
        assert main(["--findings", finding.id, "--quick", "--out", str(out), "--no-report",
                     "--no-profile", "--budget", budget]) == 0
    finally:
        del registry.FINDINGS[finding.id]
    return load_run(None, out).summary


def test_every_findings_headline_is_measured_first_then_the_others_in_turn():
    """Where the budget ends a run early, the cells it leaves out are the last in this
    order: each finding's headline answered, the rest spread over the findings."""
    from harness.run import headline_label, measuring_order
    from harness.runner import RunOptions
    a, b = _sized("A", (1, 2, 3)), _sized("B", (1, 2), headline=2)
    cells = [(f, c, (fi, ci)) for fi, f in enumerate((a, b)) for ci, c in enumerate(f.cases(True))]
    options = RunOptions(device=torch.device("cpu"), quick=True)
    order = measuring_order(cells, {f.id: headline_label(f, options) for f in (a, b)})
    assert [(f.id, c["n"]) for f, c, _ in order] == [("A", 1), ("B", 2), ("A", 2), ("B", 1), ("A", 3)]


@pytest.mark.integration
def test_a_run_past_its_budget_answers_each_headline_and_leaves_the_rest_out_saying_so(
        tmp_path, capsys):
    """A budget the first cell spends: that cell, the finding's headline, is measured; the
    others are journaled as left out (not a failure: exit 0), each row saying why and
    what measures it, and the run's time line counts them."""
    rows = _quick_run(_sized("TEST-budget", (64, 128, 256)), tmp_path, "0.01")
    measured = rows[rows.status == "ok"]
    assert set(measured.case) == {"n=64"}
    left = rows[rows.case != "n=64"]
    assert len(left) == 4 and set(left.status) == {"not_timed"}
    assert all(r.startswith("left out to keep the run's budget of 0.01 s") and
               "--findings TEST-budget" in r for r in left.reason)
    said = capsys.readouterr()
    assert "2 cells left out to keep the budget" in said.out
    assert said.err.count("left out (budget)") == 2


@pytest.mark.integration
@pytest.mark.parametrize("grouped", [False, True], ids=["one-process", "a-process-a-group"])
def test_cold_caches_are_filled_in_a_process_of_their_own_before_anything_is_timed(
        tmp_path, capsys, monkeypatch, outside_the_repository, grouped):
    """Where a finding says its compile caches are cold, its first cell is prepared once in
    a process that times nothing (one per compile group, at once), so every process that
    times it loads, as in a later run; where they are warm (the second run), no such
    process starts."""
    finding = "COMPILES-grouped" if grouped else "COMPILES-first-call"
    monkeypatch.setenv("COMPILES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COMPILES_LOG", str(tmp_path / "log"))
    if grouped and usable_cores() >= 2:  # the groups' processes overlap, whatever they took to start
        monkeypatch.setenv("COMPILES_MEET", str(tmp_path / "meet"))
    module = "compiles_grouped" if grouped else "compiles"
    command = ["--findings-module", f"tests.findings_modules.{module}", "--quick", "--budget",
               "8", "--every-cell", "--no-profile", "--no-report"]

    def first_calls() -> list[tuple[int, str, str, float, float]]:
        rows = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
        return [(int(p), v, s, float(began), float(ended)) for p, v, s, began, ended, _ in rows]

    # each ISA's answer is kept in the process: the run's checks then end at once and hold
    # no core, so the groups compile at once (a CPU run's second group otherwise waits for
    # them: test_a_cold_cpu_runs_later_compile_group_starts_once_inductors_isa_checks...)
    assert IsaChecks().wait() is None
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list  # the lazy list, installed

    assert getattr(valid_vec_isa_list, "lazy", False) == (os.uname().machine == "x86_64")
    valid_vec_isa_list.cache_clear()  # whatever this process answered before
    assert main([*command, "--out", str(tmp_path / "cold")]) == 0
    # inductor's CPU build checks ran in the run's own process, beside the warm-up
    assert valid_vec_isa_list.cache_info().currsize == 1
    calls = [call[:3] for call in first_calls()]
    compiled = {(pid, variant) for pid, variant, state in calls if state == "compiled"}
    warmer = {pid for pid, _ in compiled}
    assert {v for _, v in compiled} == {"sum", "cumsum"} and len(compiled) == 2
    assert len(warmer) == (2 if grouped else 1)
    if grouped and usable_cores() >= 2:  # the groups compiled at once
        (_, _, _, began_a, ended_a), (_, _, _, began_b, ended_b) = [
            c for c in first_calls() if c[2] == "compiled"]
        assert began_a < ended_b and began_b < ended_a
    timing = {pid for pid, _, _ in calls} - warmer
    # the run's process, its worker and the one-thread processes: all loaded
    assert os.getpid() in timing and len(timing) >= 2 and warmer.isdisjoint(timing)
    assert {state for pid, _, state in calls if pid in timing} == {"loaded"}
    err = capsys.readouterr().err
    assert f"compile caches empty for {finding}" in err
    assert f"{finding} warmed in" in err
    run = json.loads(next((tmp_path / "cold").glob("*/run.json")).read_text())
    assert set(run["warmed_s"]) == {finding}
    assert load_run(None, tmp_path / "cold").summary.status.eq("ok").all()

    (tmp_path / "log").unlink()
    valid_vec_isa_list.cache_clear()
    assert main([*command, "--out", str(tmp_path / "warm")]) == 0
    assert valid_vec_isa_list.cache_info().currsize == 0  # no warm step, no checks
    assert {state for _, _, state, _, _ in first_calls()} == {"loaded"}
    assert "compile caches" not in capsys.readouterr().err  # no process of its own
    assert "warmed_s" not in json.loads(
        next((tmp_path / "warm").glob("*/run.json")).read_text())


@pytest.mark.integration
@pytest.mark.skipif(usable_cores() < 2, reason="one warm-up process at a time: no core "
                    "is idle while another compiles")
@pytest.mark.parametrize("report", [True, False], ids=["report", "no-report"])
def test_a_cold_run_loads_its_reports_modules_while_a_warm_up_process_still_compiles(
        tmp_path, outside_the_repository, report):
    """Two compile groups warm at once; once the first has ended, a core is idle while the
    other compiles, and the run's process imports the report's modules then (a second or
    more), not after its last cell: its first calls, right after the warm step, find them
    imported. The report records that import's seconds for the next run's reserve (not
    the near 0 its own import then takes). A run with --no-report imports none."""
    env = {**os.environ, "COMPILES_CACHE": str(tmp_path / "cache"),
           "COMPILES_LOG": str(tmp_path / "log")}
    run = subprocess.Popen(
        [sys.executable, "-m", "harness.run", "--findings-module",
         "tests.findings_modules.compiles_grouped", "--quick", "--budget", "20",
         "--no-profile", "--out", str(tmp_path / "results"),
         *([] if report else ["--no-report"])],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-2000:]
    rows = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    loaded = {}  # pid -> whether the report's modules were imported at its first calls
    for pid, _, _, _, _, imported in rows:
        loaded.setdefault(int(pid), imported)
    # the run's own process found them (with a report); no other process ever loads them
    assert loaded[run.pid] == ("1" if report else "0"), rows
    assert {v for pid, v in loaded.items() if pid != run.pid} == {"0"}, rows
    if report:
        (render,) = (tmp_path / "reports").glob("*/render.json")
        assert json.loads(render.read_text())["import_s"] > 0.2
    else:
        assert not (tmp_path / "reports").exists()


@pytest.mark.integration
@pytest.mark.skipif(usable_cores() < 2, reason="one warm-up process at a time: no core "
                    "is idle while another compiles")
def test_report_modules_that_cannot_load_during_the_warm_step_leave_the_run_to_measure(
        tmp_path, outside_the_repository):
    """A report module that raises ImportError (jinja2 shadowed by a broken one) while the
    warm step loads them: said, and the run measures every cell as without the early
    load; the report then meets the same error and is not written, which the run says
    without failing (exit 0: a report problem never fails the run; it ended with an
    internal error, 3, before)."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "jinja2.py").write_text("raise ImportError('a broken jinja2')\n")
    env = {**os.environ, "COMPILES_CACHE": str(tmp_path / "cache"),
           "COMPILES_LOG": str(tmp_path / "log"),
           "PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "harness.run", "--findings-module",
         "tests.findings_modules.compiles_grouped", "--quick", "--budget", "20", "--every-cell",
         "--no-profile", "--out", str(tmp_path / "results")],
        env=env, capture_output=True, text=True, timeout=300)
    assert "the report's modules did not load (a broken jinja2)" in done.stderr, done.stderr[-2000:]
    run = load_run(None, tmp_path / "results")
    assert run.metadata["status"] == "complete" and run.summary.status.eq("ok").all()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "report not written: its modules did not load (a broken jinja2)" in done.stderr
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").glob("*/"))


@pytest.mark.integration
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_the_report_import_records_its_cpu_seconds_not_its_wall_time_beside_busy_processes():
    """The seconds a run records for importing the report's modules (the next run keeps
    them of its budget) are what the import costs, not the wall time it took sharing its
    core: in a fresh interpreter on one core beside two busy processes, the import took
    about three times as long as its CPU seconds, and the recorded seconds are those."""
    code = """if True:
        import os, subprocess, sys, time
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        from harness.run import load_report_modules
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            time.sleep(0.5)
            wall = time.perf_counter()
            recorded = load_report_modules()
            wall = time.perf_counter() - wall
        finally:
            for process in busy:
                process.kill()
        print(recorded, wall)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    recorded, wall = map(float, done.stdout.split())
    assert 0.05 < recorded < 0.6 * wall, (recorded, wall)


@pytest.mark.integration
@pytest.mark.skipif(usable_cores() < 2, reason="one warm-up process at a time")
@pytest.mark.long  # a cold compile to see an order; CI fills cold caches in other tests
def test_a_cold_cpu_runs_later_compile_group_starts_once_inductors_isa_checks_have_ended(
        tmp_path, outside_the_repository):
    """On 2 cores inductor's vector-ISA checks (run by the run's process from an empty
    inductor cache) hold one core until they end: the first compile group's process starts
    at once, the second's first calls only after the checks' last library was built (it
    started beside them before, and the three slowed the first group's compile, which
    waits for the checks)."""
    inductor = tmp_path / "inductor"
    env = {**os.environ, "COMPILES_CACHE": str(tmp_path / "cache"),
           "COMPILES_LOG": str(tmp_path / "log"), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    done = subprocess.run(
        [sys.executable, "-m", "harness.run", "--findings-module",
         "tests.findings_modules.compiles_grouped", "--quick", "--budget", "20", "--device",
         "cpu", "--no-profile", "--no-report", "--out", str(tmp_path / "results")],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    began = {variant: float(start) for _, variant, state, start, _, _ in
             (line.split() for line in (tmp_path / "log").read_text().splitlines())
             if state == "compiled"}
    checks_built = [path.stat().st_mtime for path in inductor.rglob("*.so")]
    assert checks_built, "the checks built nothing in an empty inductor cache"
    assert began["sum"] < began["cumsum"]
    assert began["cumsum"] >= max(checks_built), (began, max(checks_built))


def test_a_runs_budget_counts_from_before_its_imports():
    """The budget counts the run's wall seconds from the process's start: the seconds of
    importing torch, pandas and the harness, which the user waits for as for the rest,
    are spent from it. In a fresh interpreter, the run's clock starts in the first tenth
    of the seconds its module takes to import (it started at their end before)."""
    code = ("import time; t0 = time.perf_counter(); import harness.run as r; "
            "t1 = time.perf_counter(); print(r.STARTED - t0, t1 - t0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before_clock, importing = map(float, done.stdout.split())
    assert importing > 0
    assert 0 <= before_clock < 0.1 * importing, (before_clock, importing)


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")
@pytest.mark.usefixtures("cores_alone")
def test_load_that_appears_after_the_run_chose_its_threads_is_named_with_the_cells_it_shared(
        tmp_path, outside_the_repository):
    """Another job's busy process starts as the run builds its second cell, after the run
    chose its threads (here all the cores, --threads): that cell is marked timed beside
    load, the CLI's load line names it and warns, and the report says so too. (The first
    cell is not asserted quiet: the test's neighbours may load it as well.)"""
    env = {**os.environ, "LOADED_STARTED": str(tmp_path / "started"),
           "LOADED_STOP": str(tmp_path / "stop")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "harness.run", "--findings-module",
             "tests.findings_modules.loaded", "--quick", "--budget", "8", "--every-cell",
             "--no-profile", "--threads", str(usable_cores()), "--out",
             str(tmp_path / "results")],
            env=env, capture_output=True, text=True, timeout=300)
    finally:
        (tmp_path / "stop").touch()  # the spinner ends
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "started").exists()
    run = load_run(None, tmp_path / "results")
    second = run.summary[run.summary.case == "n=512"]
    assert len(second) == 2 and second.timed_beside_load.eq(True).all()
    assert (second.others_busy_cores >= 0.5).all()
    assert "load: other processes kept" in done.stdout and "LOADED-co-runner n=512" in done.stdout
    assert "loaded: cells were timed while other processes kept their cores busy" in done.stderr
    index = next((tmp_path / "reports").glob("*/index.html")).read_text()
    assert "load: other processes kept" in index


@pytest.mark.integration
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")
@pytest.mark.skipif(usable_cores() < 2, reason="one thread is the run's own on one core")
@pytest.mark.usefixtures("cores_alone")
def test_load_while_the_headline_is_timed_again_at_one_thread_marks_that_word(
        tmp_path, outside_the_repository):
    """Busy processes on every core (twice as many as cores) start as the headline cell
    is built again after every cell was timed (by its one-thread processes): its rows
    record `one_thread_beside_load`, and the load line names it as a one-thread timing.
    (The cells' own timing is not asserted quiet: the test's neighbours may load it.)"""
    env = {**os.environ, "LOADED_STARTED": str(tmp_path / "started"),
           "LOADED_STOP": str(tmp_path / "stop"),
           "LOADED_AFTER_CELLS": str(tmp_path / "results"),
           "LOADED_SPINNERS": str(2 * usable_cores())}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "harness.run", "--findings-module",
             "tests.findings_modules.loaded", "--quick", "--budget", "40", "--no-profile",
             "--no-report", "--placebo", "none", "--precision", "0.5",  # the cells end early:
             "--threads", str(usable_cores()), "--out",  # time is left for one thread
             str(tmp_path / "results")],
            env=env, capture_output=True, text=True, timeout=300)
    finally:
        (tmp_path / "stop").touch()  # the spinners end
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "started").exists(), done.stderr[-2000:]  # a one-thread process ran
    run = load_run(None, tmp_path / "results")
    headline = run.summary[run.summary.case == "n=256"]
    assert headline[headline.variant == "cumsum"].one_thread_verdict.notna().all()
    assert len(headline) == 2 and headline.one_thread_beside_load.eq(True).all()
    assert "the one-thread processes of 1 headline cell ran (LOADED-co-runner n=256)" \
        in done.stdout
    assert "loaded: cells were timed" in done.stderr


def test_a_later_timing_joins_its_load_to_the_cells_rows():
    """More processes at the run's threads: the most cores other processes kept busy over
    the cell's timings, and beside load where any was; one-thread processes mark only
    the one-thread word; a watch that could not say changes nothing."""
    from harness.run import joined_load

    rows = [{"variant": "a", "others_busy_cores": 0.1, "timed_beside_load": False},
            {"variant": "b", "others_busy_cores": 1.0, "timed_beside_load": True}]
    quiet = {"others_busy_cores": 0.05, "timed_beside_load": False}
    loaded = {"others_busy_cores": 1.3, "timed_beside_load": True}
    assert joined_load(rows, quiet) == [{**rows[0], "others_busy_cores": 0.1}, rows[1]]
    assert [(r["others_busy_cores"], r["timed_beside_load"]) for r in joined_load(rows, loaded)] \
        == [(1.3, True), (1.3, True)]
    alone = joined_load(rows, loaded, one_thread=True)
    assert [r["one_thread_beside_load"] for r in alone] == [True, True]
    assert [(r["others_busy_cores"], r["timed_beside_load"]) for r in alone] \
        == [(0.1, False), (1.0, True)]
    assert joined_load(rows, {}) is rows and joined_load(rows, {}, one_thread=True) is rows
    assert joined_load([{"variant": "a"}], quiet) == [{"variant": "a", **quiet}]
