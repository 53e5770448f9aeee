"""Tests for the CI gate (harness.gate and its checks).

Counters are measured for real and compared with baselines written here; regressions
are planted by editing a baseline count or by `harness.gate.plant` (an extra allocation
in the scan GAE). Timing appears only as in-process ratios with wide margins (scan vs
the per-env loop, ~10x apart, held to 2x) or as thresholds no machine can meet.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from esper.gae import METHODS
from esper.gae.methods import DEVICE_TYPES
from harness import findings as registry
from harness.gate import ab as gate_ab, cli as gate, counters as gate_counters
from harness.gate import invariants as gate_invariants, quality as gate_quality
from harness.measure.counters import profile_call
from harness.gate.plant import allocating, planted, slowed
from harness.gate.table import GateRow, Outcome, UsageError, render_markdown, summary_line
from tests.review import MODULE as REVIEW, review_findings

REPO = Path(__file__).resolve().parents[3]
review_findings()

#: GAE methods that take no CPU tensors on this machine (`triton` where CUDA is): the gate
#: counts on the CPU, so their cells are skipped, not compared
NOT_ON_CPU = frozenset(m for m, types in DEVICE_TYPES.items() if "cpu" not in types)


def _counted(rows: list[GateRow]) -> list[GateRow]:
    """The rows of methods that run on CPU tensors; the others must read as skipped."""
    assert all(row.outcome is Outcome.SKIPPED for row in rows if row.variant in NOT_ON_CPU)
    return [row for row in rows if row.variant not in NOT_ON_CPU]


@pytest.fixture(scope="module")
def gae_cells() -> list[gate_counters.CellCounts]:
    """Counters of every quick B4-CR-03 cell on the code as it is."""
    return gate_counters.measure(["B4-CR-03"])


@pytest.fixture
def gae_baseline(tmp_path, gae_cells) -> Path:
    path = tmp_path / "counters.json"
    gate_counters.write_baseline(path, gae_cells)
    return path


def _compare(cells: list[gate_counters.CellCounts], baseline: Path) -> list[GateRow]:
    """The counters check on cells already measured (the gate measures, then compares)."""
    return gate_counters.compare(cells, gate_counters.load_baseline(baseline), ["B4-CR-03"])


def _counts_of(entry: dict, counter: str) -> dict:
    """Where `counter` of a baseline entry is: the entry (EXACT), or its one kernel path's."""
    if counter in gate_counters.EXACT:
        return entry
    (recorded,) = entry["by_kernel_path"].values()
    return recorded


def _edit_first(path: Path, variant: str, counter: str, delta: int) -> dict:
    """Add `delta` to one counter of the first baseline entry of `variant`; return the entry."""
    document = json.loads(path.read_text())
    entry = next(e for e in document["counters"] if e["variant"] == variant)
    _counts_of(entry, counter)[counter] += delta
    path.write_text(json.dumps(document))
    return entry


# --- a. counters --------------------------------------------------------------------------


@pytest.mark.integration
def test_counters_are_identical_when_measured_again(gae_baseline):
    rows = _compare(gate_counters.measure(["B4-CR-03"]), gae_baseline)
    assert len(rows) == 4 * len(METHODS)
    assert {row.outcome for row in _counted(rows)} == {Outcome.PASS}
    assert all(row.change == "=" for row in _counted(rows))


def test_counters_flag_a_count_above_the_baseline(gae_baseline, gae_cells):
    entry = _edit_first(gae_baseline, "scan", "allocations", -1)  # the code now allocates 1 more
    rows = _compare(gae_cells, gae_baseline)
    flagged = [row for row in rows if row.outcome is Outcome.REGRESSION]
    assert [(r.variant, r.case) for r in flagged] == [("scan", entry["case"])]
    assert flagged[0].change == "allocations +1"
    counted = _counted(rows)
    assert sum(row.outcome is Outcome.PASS for row in counted) == len(counted) - 1


def test_counters_report_fewer_ops_as_an_improvement(gae_baseline, gae_cells):
    _edit_first(gae_baseline, "batched", "op_calls", +5)
    rows = _compare(gae_cells, gae_baseline)
    improved = [row for row in rows if row.outcome is Outcome.IMPROVED]
    assert len(improved) == 1 and improved[0].change == "op_calls -5"
    assert not any(row.outcome.fails for row in rows)


@pytest.mark.integration
def test_counters_catch_a_planted_allocation(gae_baseline):
    with planted(registry.defaults([REVIEW]).plant, allocating):
        rows = _compare(gate_counters.measure(["B4-CR-03"]), gae_baseline)
    flagged = {(row.variant, row.change) for row in rows if row.outcome is Outcome.REGRESSION}
    # torch.empty(16): one op, one allocation, 16 float32 values, in every quick case
    assert flagged == {("scan", "op_calls +1, allocations +1, allocated_bytes +64")}
    assert sum(row.outcome is Outcome.REGRESSION for row in rows) == 4


def test_a_stated_tolerance_absorbs_a_difference_and_survives_an_update(gae_baseline, gae_cells):
    document = json.loads(gae_baseline.read_text())
    entry = document["counters"][0]
    _counts_of(entry, "allocations")["allocations"] -= 2
    entry["tolerance"] = {"allocations": 2}
    gae_baseline.write_text(json.dumps(document))
    rows = _compare(gae_cells, gae_baseline)
    assert rows[0].outcome is Outcome.PASS and rows[0].change == "allocations +2 (tolerance 2)"

    gate_counters.write_baseline(gae_baseline, gae_cells)
    rewritten = json.loads(gae_baseline.read_text())["counters"][0]
    assert rewritten["tolerance"] == {"allocations": 2}
    assert _counts_of(rewritten, "allocations")["allocations"] == \
        _counts_of(entry, "allocations")["allocations"] + 2


def test_a_new_cell_fails_unless_allowed_and_a_missing_one_is_reported(gae_baseline, gae_cells):
    document = json.loads(gae_baseline.read_text())
    dropped = document["counters"].pop(0)
    document["counters"].append({**dropped, "variant": "retired-method"})
    gae_baseline.write_text(json.dumps(document))
    rows = _compare(gae_cells, gae_baseline)
    by_variant = {(row.variant, row.case): row for row in rows}
    new = by_variant[(dropped["variant"], dropped["case"])]
    assert new.outcome is Outcome.NEW and new.outcome.fails
    assert new.note == ("not in the baseline; add it with `python -m harness.gate "
                        f"--update-baseline --baseline {gae_baseline} --findings B4-CR-03`")
    assert by_variant[("retired-method", dropped["case"])].outcome is Outcome.MISSING
    assert [row.outcome for row in rows if row.outcome.fails] == [Outcome.NEW]

    allowed = gate_counters.compare(gae_cells, gate_counters.load_baseline(gae_baseline),
                                    ["B4-CR-03"], allow_new=True)
    assert {row.outcome for row in _counted(allowed)} == {Outcome.PASS, Outcome.NEW_ALLOWED,
                                                          Outcome.MISSING}
    assert not any(row.outcome.fails for row in allowed)


#: a small tensor the planted clone copies
_CLONED = torch.ones(4)


def cloning(fn):
    """`fn` after one clone of a small tensor: what a `clone()` planted in the code costs."""

    def planted_clone(*args, **kwargs):
        _CLONED.clone()  # the planted clone
        return fn(*args, **kwargs)

    return planted_clone


def _line_of(text: str) -> int:
    """The line of this file that holds `text`."""
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text in line and "_line_of" not in line)


@pytest.mark.integration
def test_a_planted_clone_reads_as_a_per_line_delta(tmp_path):
    """The baseline keeps each cell's counters split by line, so that a change reads as
    what changed where (`+N aten::clone at FILE:LINE`), not as where the counter's ops
    are now (`now 6 aten::isfinite at :40, ...`, which hid a planted clone)."""
    path = tmp_path / "counters.json"
    gate_counters.write_baseline(path, gate_counters.measure(["B4-CR-03"], attribute=True))
    baseline = gate_counters.load_baseline(path)
    with planted(registry.defaults([REVIEW]).plant, cloning):
        cells = gate_counters.measure(["B4-CR-03"])
        rows = gate_counters.explain_changes(
            gate_counters.compare(cells, baseline, ["B4-CR-03"]), cells, baseline)
    flagged = [row for row in rows if row.outcome is Outcome.REGRESSION]
    assert {row.variant for row in flagged} == {"scan"} and len(flagged) == 4
    site = (f"aten::clone at tests/harness/gate/test_gate.py:{_line_of('# the planted clone')}"
            " in planted_clone()")
    for row in flagged:
        before = baseline.entries[(row.finding, row.case, row.variant)]
        (recorded,) = before.by_kernel_path.values()
        ops = int(row.change.split("op_calls +")[1].split(",")[0])
        assert f"op calls {before.exact['op_calls']} -> {before.exact['op_calls'] + ops}: " \
               f"+{ops} {site}" in row.note, row.note
        allocations = recorded.counts["allocations"]
        assert f"allocations {allocations} -> {allocations + 1}: +1 {site}" in row.note
        assert "now" not in row.note


def test_a_schema_1_baseline_compares_its_exact_counters_and_says_what_it_cannot(tmp_path,
                                                                                gae_cells):
    """A baseline written before kernel paths were recorded still loads: op calls and host
    syncs are compared (a changed one regresses, explained without lines: the file has
    none), the allocation counters are not (they may come from another machine), and the
    gate says so; `--update-baseline` rewrites it as schema 2, tolerances kept."""
    path = tmp_path / "counters.json"
    entries = [{"finding": c.finding, "case": c.case, "variant": c.variant, **c.counts}
               for c in gae_cells if c.counts is not None]
    entries[0]["allocations"] += 5  # another machine's count: never a regression
    entries[1]["op_calls"] -= 1  # the code now makes one more op call: a regression
    entries[2]["tolerance"] = {"op_calls": 1}
    path.write_text(json.dumps({"schema_version": 1,
                                "fingerprint": gate_counters.counting_fingerprint(),
                                "counters": entries}))
    baseline = gate_counters.load_baseline(path)
    rows = _counted(gate_counters.explain_changes(
        gate_counters.compare(gae_cells, baseline, ["B4-CR-03"]), gae_cells, baseline))
    assert [row.outcome for row in rows] == [Outcome.PASS, Outcome.REGRESSION] + \
        [Outcome.PASS] * (len(rows) - 2)
    assert all(row.not_compared == gate_counters.KERNEL_DEPENDENT for row in rows)
    assert rows[0].baseline.startswith("op_calls=") and "allocations" not in rows[0].baseline
    assert rows[0].note == ("allocations, allocated_bytes, peak_bytes not compared: the "
                            "baseline (schema 1) recorded them without their CPU kernel path")
    assert rows[1].change == "op_calls +1" and "op calls " in rows[1].note
    assert ("(the baseline holds no lines for this cell; `python -m harness.gate "
            "--update-baseline` records them)") in rows[1].note
    note = gate_counters.not_compared_note(rows, gate_counters.KernelMatch.of(baseline), path,
                                           "CMD")
    assert note == (f"counters: allocations, allocated_bytes, peak_bytes depend on the CPU "
                    f"kernel path and were not compared in {len(rows)} of {len(rows)} cells: "
                    f"{path} is of schema 1, which recorded them without the CPU kernel path "
                    "they were counted on; op_calls, host_syncs were compared exactly. Record "
                    "this machine's counts with `CMD` (it rewrites the file as schema 2).")

    gate_counters.write_baseline(path, gae_cells)
    document = json.loads(path.read_text())
    assert document["schema_version"] == 2 and document["counters"][2]["tolerance"] == \
        {"op_calls": 1}
    rows = _counted(_compare(gae_cells, path))
    assert {row.outcome for row in rows} == {Outcome.PASS}
    assert not any(row.not_compared for row in rows)


def test_each_kernel_path_keeps_its_own_allocation_counts(tmp_path):
    """Two machines' kernel paths in one baseline: each is held to its own allocation
    counts; a third is held to the exact counters only, and the note names the field
    that differs; counts that changed on one path drop the others' (other code)."""
    path = tmp_path / "counters.json"
    counts = {"op_calls": 10, "host_syncs": 0, "allocations": 2, "allocated_bytes": 64,
              "peak_bytes": 64}
    here = gate_counters.gate_kernel_path()
    avx2 = {**here, "env_onednn_max_cpu_isa": "AVX2"}
    xeon = {**here, "cpu_model": "Intel Xeon"}

    def cell(**changed):
        return gate_counters.CellCounts("F", "c", "v", counts={**counts, **changed})

    gate_counters.write_baseline(path, [cell()], here=here)
    update = gate_counters.write_baseline(path, [cell(allocations=3, allocated_bytes=96)],
                                          here=avx2)
    assert update.other_kernel_paths == 1 and update.stale == ()
    document = json.loads(path.read_text())
    names = [gate_counters.kernel_path_id(p) for p in (here, avx2)]
    assert document["kernel_paths"] == dict(zip(names, (here, avx2)))
    assert {name: recorded["allocations"] for name, recorded in
            document["counters"][0]["by_kernel_path"].items()} == dict(zip(names, (2, 3)))

    baseline = gate_counters.load_baseline(path)

    def outcome(kernel_path, measured):
        match = gate_counters.KernelMatch.of(baseline, kernel_path)
        (row,) = gate_counters.compare([measured], baseline, ["F"], match=match)
        return row, match

    assert outcome(here, cell())[0].outcome is Outcome.PASS
    assert outcome(avx2, cell(allocations=3, allocated_bytes=96))[0].outcome is Outcome.PASS
    assert outcome(here, cell(allocations=3, allocated_bytes=96))[0].change == \
        "allocations +1, allocated_bytes +32"
    row, match = outcome(xeon, cell(allocations=7))
    assert row.outcome is Outcome.PASS and row.not_compared == gate_counters.KERNEL_DEPENDENT
    assert row.note.endswith("this CPU kernel path is not in the baseline (cpu_model differs)")
    assert f"differs in cpu_model: here 'Intel Xeon', recorded {here['cpu_model']!r})" in \
        gate_counters.not_compared_note([row], match, path, "CMD")
    assert outcome(xeon, cell(op_calls=11))[0].outcome is Outcome.REGRESSION

    update = gate_counters.write_baseline(path, [cell(op_calls=11)], here=here)
    assert update.stale == (("F", "c", "v"),) and update.other_kernel_paths == 0
    assert list(json.loads(path.read_text())["kernel_paths"]) == names[:1]


def test_baseline_problems_name_the_command_that_fixes_them(tmp_path):
    missing = tmp_path / "nowhere.json"
    with pytest.raises(UsageError, match=r"--update-baseline --baseline .*nowhere\.json"):
        gate_counters.load_baseline(missing)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 0, "counters": []}))
    with pytest.raises(UsageError, match="schema_version: expected one of 1, 2; got 0"):
        gate_counters.load_baseline(old)
    other_torch = tmp_path / "other.json"
    other_torch.write_text(json.dumps({"schema_version": 1, "counters": [],
                                       "fingerprint": {"torch": "1.0", "device": "cpu",
                                                       "threads": 1}}))
    with pytest.raises(UsageError, match="fingerprint: expected .* got .*'1.0'"):
        gate_counters.load_baseline(other_torch)
    bad_count = tmp_path / "bad.json"
    bad_count.write_text(json.dumps({
        "schema_version": 1, "fingerprint": gate_counters.counting_fingerprint(),
        "counters": [{"finding": "F", "case": "c", "variant": "v", "op_calls": "many",
                      "host_syncs": 0, "allocations": 0, "allocated_bytes": 0,
                      "peak_bytes": 0}]}))
    with pytest.raises(UsageError, match=r"counters\[0\].*integers >= 0.*'op_calls': 'many'"):
        gate_counters.load_baseline(bad_count)


# --- the CLI ------------------------------------------------------------------------------


@pytest.mark.integration
def test_cli_missing_baseline_exits_2_with_the_command(tmp_path):
    """Subprocess smoke test: the real entry point, its stderr and exit status."""
    missing = tmp_path / "counters.json"
    done = subprocess.run(
        [sys.executable, "-m", "harness.gate", "--counters", "--baseline", str(missing)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert f"create it with `python -m harness.gate --update-baseline --baseline {missing}`" \
        in done.stderr
    assert done.stdout == ""


@pytest.mark.integration
def test_cli_update_then_check_then_flag(tmp_path, capsys):
    baseline = tmp_path / "counters.json"
    args = ["--baseline", str(baseline), "--findings", "B4-DRL-03"]
    assert gate.main(["--update-baseline", *args]) == 0
    assert "8 cells of B4-DRL-03" in capsys.readouterr().out

    assert gate.main(["--counters", *args, "--json", str(tmp_path / "rows.json")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("| check | finding | variant | case | baseline | current | "
                                   "change | verdict |")
    assert out.rstrip().endswith("PASS: 8 pass")
    saved = json.loads((tmp_path / "rows.json").read_text())
    assert saved["schema_version"] == 1 and len(saved["rows"]) == 8

    _edit_first(baseline, "clone", "host_syncs", -3)
    assert gate.main(["--counters", *args]) == 1
    out = capsys.readouterr().out
    # the note names where the cell's host syncs come from now (the baseline has counts only)
    row = next(line for line in out.splitlines() if "| regression" in line)
    assert "host_syncs +3 | regression: host syncs " in row
    assert " aten::is_nonzero at esper/gae/loop.py:" in row and " in _reviewed_lines()" in row
    assert out.rstrip().endswith("FAIL: 1 regression, 7 pass")


@pytest.mark.parametrize("argv, message", [
    (["--findings", "NOPE-1"], "unknown id(s) NOPE-1"),
    (["--update-baseline", "--counters"], "--update-baseline: expected on its own"),
    (["--invariants", "--config", "missing.json"], "no invariants config at missing.json"),
    (["--against", "no-such-revision-xyz"], "--against: expected a commit, branch or tag"),
    (["--against", "HEAD", "--sessions", "1"], "--sessions: expected an integer >= 3"),
    (["--counters", "--threads", "2"], "--threads: expected with --against REV or the "
                                       "invariants check"),
    (["--against", "HEAD", "--threads", "0"], "--threads: expected an integer >= 1"),
])
def test_cli_usage_errors_exit_2(argv, message, capsys):
    assert gate.main(argv) == 2
    assert message in capsys.readouterr().err


# --- b. invariants ------------------------------------------------------------------------


def _config(tmp_path, **invariant) -> gate_invariants.InvariantConfig:
    entry = {"id": "scan-vs-loop", "finding": "B4-CR-03",
             "case": {"num_envs": 4, "max_steps": 25, "dones": "episode"},
             "fast": "scan", "slow": "loop", "min_speedup": 2, "measured_speedup": 10}
    entry.update(invariant)
    document = {"schema_version": 1,
                "sampling": {"threads": 1, "min_samples": 10, "max_samples": 40,
                             "time_budget_s": 0.5, "min_sample_time": 0.001},
                "invariants": [entry]}
    path = tmp_path / "invariants.json"
    path.write_text(json.dumps(document))
    return gate_invariants.load_config(path)


def test_invariant_holds_with_a_wide_margin(tmp_path):
    # scan is ~10x faster than the loop here; 2x leaves a wide margin for noise
    [row] = gate_invariants.check_invariants(_config(tmp_path))
    assert row.outcome is Outcome.PASS, row
    assert row.ci.low >= 2 and row.threshold == 2


def test_invariant_fails_when_the_interval_lies_below_an_impossible_threshold(tmp_path):
    [row] = gate_invariants.check_invariants(_config(tmp_path, min_speedup=1e6))
    assert row.outcome is Outcome.REGRESSION
    assert row.ci.high < 1e6


def test_cli_invariants_exit_1_on_an_impossible_threshold(tmp_path, capsys):
    _config(tmp_path, min_speedup=1e6)
    assert gate.main(["--invariants", "--config", str(tmp_path / "invariants.json")]) == 1
    assert "| invariant scan-vs-loop | B4-CR-03 | scan vs loop |" in capsys.readouterr().out


def test_invariant_on_a_method_missing_here_is_skipped_with_the_methods_listed(tmp_path):
    [row] = gate_invariants.check_invariants(_config(tmp_path, fast="not-a-method"))
    assert row.outcome is Outcome.SKIPPED
    assert "'not-a-method' is not available on this machine" in row.note
    assert ", ".join(METHODS) in row.note


@pytest.mark.parametrize("change, message", [
    ({"min_speedup": "3"}, r"invariants\[0\].min_speedup: expected a number; got '3'"),
    ({"min_speedup": -1}, r"invariants\[0\].min_speedup: expected a finite number > 0; got -1"),
    ({"case": {"num_envs": 5}}, r"case: expected one of the quick cases of B4-CR-03 .* got"),
    ({"finding": "NOPE"}, r"invariant scan-vs-loop: finding: .*unknown id\(s\) NOPE"),
])
def test_bad_invariant_config_names_the_field(tmp_path, change, message):
    with pytest.raises(UsageError, match=message):
        gate_invariants.check_invariants(_config(tmp_path, **change))


def test_invariant_missing_field_is_named(tmp_path):
    with pytest.raises(UsageError, match=r"invariants\[0\].slow: .*the field is missing"):
        gate_invariants.parse_config(
            {"schema_version": 1,
             "sampling": {"threads": 1, "min_samples": 5, "max_samples": 5,
                          "time_budget_s": 1, "min_sample_time": 0.001},
             "invariants": [{"id": "x", "finding": "B4-CR-03", "case": {}, "fast": "scan",
                             "min_speedup": 2, "measured_speedup": 6}]}, "cfg")


def test_timing_checks_use_the_runs_thread_count_unless_told_otherwise(tmp_path):
    """The run times at torch's thread count (the cores shared out under torchrun); the
    gate's timing checks do the same by default, so that the gate guards the regime the
    run reports (a claim's word can depend on it); the counters stay at one thread."""
    config = _config(tmp_path)
    document = json.loads((tmp_path / "invariants.json").read_text())
    del document["sampling"]["threads"]
    unpinned = gate_invariants.parse_config(document, "invariants.json")
    assert unpinned.sampling.threads is None
    assert gate_invariants.timing_threads_of(unpinned) == torch.get_num_threads()
    assert gate_invariants.timing_threads_of(unpinned, 3) == 3
    assert gate_invariants.timing_threads_of(config) == config.sampling.threads == 1
    assert gate_ab.ABOptions().threads == torch.get_num_threads()
    assert gate.ab_options(gate.parse(["--against", "HEAD", "--threads", "3"]))[0].threads == 3
    assert gate.ab_options(gate.parse(["--against", "HEAD"]))[0].threads == \
        torch.get_num_threads()
    assert gate_counters.THREADS == 1


def test_committed_invariants_name_quick_cases_and_keep_wide_margins():
    config = gate_invariants.load_config(registry.defaults([REVIEW]).invariants)
    assert config.invariants
    assert config.sampling.threads is None  # timed at the run's thread count
    for invariant in config.invariants:
        assert invariant.margin >= 2.5, invariant
        finding = gate_invariants.registry.select([invariant.finding])[0]
        assert invariant.case in [dict(c.params) for c in finding.cases(True)]
        assert {invariant.fast, invariant.slow} <= set(finding.variants), invariant


# --- c. paired A/B ------------------------------------------------------------------------


def test_holm_rejects_in_order_until_the_first_p_that_fails():
    # m = 4 at alpha 0.05: thresholds 0.0125, 0.0167, 0.025, 0.05 for the sorted p-values
    assert gate_ab.holm([0.01, 0.04, 0.015, 0.03], 0.05) == [True, False, True, False]
    assert gate_ab.holm([0.01, 0.04, 0.015, 0.02], 0.05) == [True, True, True, True]
    assert gate_ab.holm([0.01, 0.2, 0.02, 0.03], 0.05) == [True, False, False, False]
    assert gate_ab.holm([0.02, 0.5], 0.05) == [True, False]
    assert gate_ab.holm([0.03, 0.5], 0.05) == [False, False]


def test_holm_answers_as_statsmodels_does():
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    rng = np.random.default_rng(3)
    # each statsmodels Holm call collects garbage (0.2 s to 0.5 s in a process holding
    # torch; next to nothing with the objects there frozen): a few sizes, one of them a
    # single test, each with a spread of small p-values
    gc.freeze()
    try:
        for m in (1, 2, 7, 19, 38):
            p = rng.uniform(0, 1, m) ** rng.uniform(1, 6)  # many small p-values, ties unlikely
            alpha = float(rng.choice([0.01, 0.05, 0.1]))
            assert gate_ab.holm(p.tolist(), alpha) == \
                multipletests(p, alpha, method="holm")[0].tolist()
    finally:
        gc.unfreeze()


def _synthetic_sessions(rng, cells: int, sessions: int, slowdowns: dict[int, float],
                        rounds: int = 20) -> list[dict]:
    """Worker outputs of a gate run on a synthetic clock: per session and cell, rounds of
    the two trees sharing a drift, with their own noise and a per-process offset of the
    ratio; cell i of the current tree `slowdowns.get(i, 1.0)` times slower."""
    out = []
    for _ in range(sessions):
        cells_out = []
        for index in range(cells):
            offset = rng.normal(0.0, 0.01)
            drift = np.cumsum(rng.normal(0.0, 0.01, rounds))
            against = 2e-4 * np.exp(drift + rng.normal(0.0, 0.04, rounds))
            current = (2e-4 * slowdowns.get(index, 1.0) * np.exp(
                offset + drift + rng.normal(0.0, 0.04, rounds)))
            cells_out.append({"finding": "F", "case": f"c{index}", "variant": "v",
                              "samples": [current.tolist(), against.tolist()]})
        out.append({"findings": ["current", "against"], "cells": cells_out})
    return out


@pytest.mark.slow  # 400 simulated gate runs: 10 s
def test_ab_false_alarms_over_a_whole_gate_run_stay_at_alpha_and_a_7_5_percent_slowdown_is_caught():
    """Simulated with a synthetic clock: 36 cells a run (B4-CR-03's quick cells), 6
    sessions, per-process offsets of 1%. Unchanged code: at most 5% of gate runs flag
    any cell. Four cells planted 7.5% slower: the gate fails at least 80% of runs; 3%
    slower (under the margin): at most 10%."""
    rng = np.random.default_rng(7)
    options = gate_ab.ABOptions()
    flagged = {1.0: 0, 1.03: 0, 1.075: 0}
    runs = 100
    for _ in range(runs):
        for slowdown in flagged:
            planted = _synthetic_sessions(rng, 36, 6, {i: slowdown for i in range(4)})
            flagged[slowdown] += any(row.outcome.fails
                                     for row in gate_ab.compare(planted, options, "HEAD"))
    assert flagged[1.0] / runs <= 0.05, flagged
    assert flagged[1.03] / runs <= 0.10, flagged
    assert flagged[1.075] / runs >= 0.80, flagged


def _session(cells: list[tuple[str, float | dict]], jitter: float) -> dict:
    """A worker's output: per variant, the current/against time ratio (3 rounds at a
    1 ms baseline, every sample scaled by `jitter`) or the cell's fields as given."""
    out = []
    for variant, value in cells:
        cell = {"finding": "F", "case": "c", "variant": variant}
        if isinstance(value, dict):
            cell.update(value)
        else:
            against = [1e-3 * jitter * k for k in (1.0, 1.5, 1.1)]
            cell["samples"] = [[value * t for t in against], against]
        out.append(cell)
    return {"findings": ["current/findings", "against/findings"], "cells": out}


def test_ab_a_significant_slowdown_beyond_the_margin_regresses_though_its_interval_reaches_it():
    """A cell 7% slower whose interval reaches below +5% regresses: it is surely slower,
    and by more than the margin as far as the data say. (Asking its interval to clear
    +5% after Holm passed a planted 7.5% slowdown, measured 1.07-1.08.) A cell surely 3%
    slower passes: under the margin."""
    jitters = (1.0, 1.02, 0.98, 1.03, 0.97, 1.0)
    sessions = [_session([("seven", 1.07 * r), ("three", 1.03 * r), ("steady", r)], jitter=r)
                for r in jitters]
    rows = {row.variant: row for row in gate_ab.compare(sessions, gate_ab.ABOptions(), "HEAD")}
    assert {v: row.outcome for v, row in rows.items()} == {
        "seven": Outcome.REGRESSION, "three": Outcome.PASS, "steady": Outcome.PASS}
    assert rows["seven"].ci.low < 1.05 < rows["seven"].ci.ratio
    assert rows["three"].ci.low > 1.0  # surely slower, not by what matters
    assert "a regression is significantly slower and more than +5%" in rows["three"].note
    faster = [_session([("quicker", r / 1.07)], jitter=r) for r in jitters]
    (row,) = gate_ab.compare(faster, gate_ab.ABOptions(), "HEAD")
    assert row.outcome is Outcome.IMPROVED


def test_ab_compare_flags_slower_and_reports_faster_and_incomparable_cells():
    sessions = [_session([("slow", 1.3 * r), ("fast", 0.5), ("steady", r),
                          ("broken", {"errors": ["RuntimeError: boom", None]}),
                          ("theirs-broken", {"errors": [None, "RuntimeError: old"]}),
                          ("new", {"absent": [False, True]}), ("old", {"absent": [True, False]})],
                         jitter=r)
                for r in (1.0, 1.01, 0.99, 1.02, 0.98, 1.03)]
    rows = gate_ab.compare(sessions, gate_ab.ABOptions(), "main (abc)")
    outcome = {row.variant: row.outcome for row in rows}
    assert outcome == {"slow": Outcome.REGRESSION, "fast": Outcome.IMPROVED,
                       "steady": Outcome.PASS, "broken": Outcome.ERROR,
                       "theirs-broken": Outcome.NOT_COMPARABLE,
                       "new": Outcome.NOT_COMPARABLE, "old": Outcome.NOT_COMPARABLE}
    slow = rows[0]
    # the sessions' estimates averaged on the log scale; their spread (1.9%) is the
    # variance (it exceeds the 0.4% per-process offset a 1 ms call is given)
    ratios = np.log([1.3 * r for r in (1.0, 1.01, 0.99, 1.02, 0.98, 1.03)])
    assert slow.ci.ratio == pytest.approx(float(np.exp(ratios.mean())))
    half = np.std(ratios, ddof=1) / np.sqrt(6) * 2.5706  # t(5) at 97.5%
    assert (slow.ci.low, slow.ci.high) == pytest.approx(
        (float(np.exp(ratios.mean() - half)), float(np.exp(ratios.mean() + half))), rel=1e-4)
    assert slow.change.startswith("+30.")
    assert slow.check == "A/B vs main (abc)" and slow.threshold == pytest.approx(1.05)
    assert "Holm over 3 cells at 5%" in slow.note
    notes = {row.variant: row.note for row in rows}
    assert notes["broken"] == "RuntimeError: boom"
    assert notes["theirs-broken"] == "fails on main (abc): RuntimeError: old"
    assert notes["new"] == "not on main (abc)" and notes["old"] == "only on main (abc)"


def test_ab_options_need_enough_sessions_for_the_interval():
    with pytest.raises(UsageError, match="--sessions: expected an integer >= 3"):
        gate_ab.ABOptions(sessions=2)
    for bad in (-0.1, 0.0, float("inf"), float("nan")):
        with pytest.raises(UsageError, match="--margin: expected a fraction in"):
            gate_ab.ABOptions(margin=bad)
    with pytest.raises(UsageError, match="confidence: expected a fraction in"):
        gate_ab.ABOptions(confidence=1.0)


def test_worktree_checks_out_a_revision_and_removes_it():
    commit = gate_ab.resolve_revision(REPO, "HEAD")
    with gate_ab.worktree(REPO, commit) as tree:
        assert (tree / "esper" / "gae" / "methods.py").is_file()
        listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list"],
                                capture_output=True, text=True).stdout
        assert str(tree) in listed
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(REPO), "worktree", "list"],
                            capture_output=True, text=True).stdout
    assert str(tree) not in listed


@pytest.fixture(scope="module")
def tree_failing_clone(tmp_path_factory) -> Path:
    """A copy of this tree whose per-env loop GAE raises when asked for clone resets."""
    tree = tmp_path_factory.mktemp("ab") / "tree"
    gate_quality._copy_tree(REPO, tree)
    with open(tree / "esper" / "gae" / "methods.py", "a") as handle:
        handle.write(
            "\n_loop = METHODS['loop']\n\n"
            "def _planted_failure(*args, reset, **kwargs):\n"
            "    if reset == 'clone':\n"
            "        raise RuntimeError('planted failure')\n"
            "    return _loop(*args, reset=reset, **kwargs)\n\n"
            "METHODS['loop'] = _planted_failure\n"
        )
    return tree


@pytest.mark.integration
def test_sessions_time_both_trees_in_one_process_and_keep_their_modules_apart(tree_failing_clone):
    options = gate_ab.ABOptions(findings=("B4-DRL-03",), min_rounds=3, variant_budget_s=0.0,
                                findings_modules=(REVIEW,))
    sessions = gate_ab.run_sessions(REPO, tree_failing_clone, options)
    assert len(sessions) == 6
    for session in sessions:  # every other session ran the trees in the other order
        assert session["modules"] == [[str(REPO / REVIEW / "__init__.py")],
                                      [str(tree_failing_clone / REVIEW / "__init__.py")]]
        cells = {(c["case"], c["variant"]): c for c in session["cells"]}
        assert {variant for _, variant in cells} == {"clone", "mask", "assign", "restructured"}
        assert len(cells) == 8
        for (_, variant), cell in cells.items():
            if variant == "clone":  # only the copy raises, and only there
                assert cell["errors"] == [None, "RuntimeError: planted failure"]
            else:
                current, against = cell["samples"]
                assert len(current) == len(against) >= 3 and min(current + against) > 0
    rows = gate_ab.compare(sessions, options, "copy")
    assert {r.variant: r.outcome for r in rows if r.variant == "clone"} == {
        "clone": Outcome.NOT_COMPARABLE}
    assert all(r.ci is not None for r in rows if r.variant == "mask")


# --- plants and the table -----------------------------------------------------------------


def test_slowed_makes_every_call_last_factor_times_its_own_time():
    """Each call once, each one 1.25x as long as it took: a plant that repeated every fourth
    call made samples of few calls two-mode, and the trimmed mean read 1.1 as about 1.09."""
    inner = []

    def work():
        started = time.perf_counter()
        time.sleep(0.004)
        inner.append(time.perf_counter() - started)
        return len(inner)

    fn = slowed(work, 1.25)
    outer = []
    for call in range(1, 7):
        started = time.perf_counter()
        assert fn() == call
        outer.append(time.perf_counter() - started)
    assert len(inner) == 6
    for took, own in zip(outer, inner):
        assert 1.25 * own <= took <= 1.25 * own + 0.003, (took, own)
    with pytest.raises(ValueError, match="factor: expected a finite number >= 1; got 0.9"):
        slowed(work, 0.9)


def test_allocating_adds_one_allocation_per_call():
    import torch

    def work():
        return torch.ones(8) * 2

    plain, planted_counts = profile_call(work), profile_call(allocating(work))
    assert planted_counts.allocations == plain.allocations + 1
    assert planted_counts.allocated_bytes == plain.allocated_bytes + 64


def test_planted_restores_the_method():
    original = METHODS["scan"]
    with planted(registry.defaults([REVIEW]).plant, allocating):
        assert METHODS["scan"] is not original
    assert METHODS["scan"] is original


def test_markdown_escapes_pipes_and_summary_counts_outcomes():
    rows = [GateRow("counters", "F", "a|b", "c", "1", "2", "+1", Outcome.REGRESSION),
            GateRow("counters", "F", "v", "c", "1", "same", "=", Outcome.PASS, note="ok")]
    table = render_markdown(rows).splitlines()
    assert table[2] == "| counters | F | a\\|b | c | 1 | 2 | +1 | regression |"
    assert table[3].endswith("| pass: ok |")
    assert summary_line(rows) == "FAIL: 1 regression, 1 pass"


# --- gate_quality -------------------------------------------------------------------------


@pytest.mark.usefixtures("cores_alone")
def test_busy_processes_spin_while_inside_and_are_gone_after():
    with gate_quality.busy_processes(2) as spinners:
        assert len(spinners) == 2 and all(s.poll() is None for s in spinners)
    assert all(s.poll() is not None for s in spinners)


@pytest.mark.parametrize("argv, message", [
    (["--busy", "-1"], "--busy: expected an integer >= 0; got '-1'"),
    (["--ab-runs", "-2"], "--ab-runs: expected an integer >= 0; got '-2'"),
])
def test_gate_quality_usage_errors_exit_2(argv, message, capsys):
    assert gate_quality.main(argv) == 2
    assert message in capsys.readouterr().err


def test_quality_times_the_cells_the_gate_itself_times():
    """Check c's false-alarm and power rates describe `harness.gate --against` only when
    quality's gate runs time the same findings: the findings modules' `ab_findings` (here
    B4-CR-03), not every finding (57 cells, 2.4x the seconds, another gate)."""
    gate_options, _ = gate.ab_options(gate.parse(["--against", "HEAD"]))
    assert gate_quality.ab_options([])[0].findings == gate_options.findings == ("B4-CR-03",)
