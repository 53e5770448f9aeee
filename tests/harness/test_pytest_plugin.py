"""The pytest plugin: a claim stated in a test (`harness.pytest_plugin`, the `claim` fixture).

The fast tests hold the plugin's parts to what they promise: it loads through the entry
point pyproject.toml declares without importing torch, registers its fixture, option, ini
key and marker, refuses a claim's bad arguments before any run (the field, the expected and
the received value), and judges a run's rows (the word, an inconclusive word, a FAIL, the
counters, a variant that needs CUDA). The integration tests run a user's test file in a
pytest of its own (pytester, in a subprocess), each claim a real `python -m harness.run`:
claims that hold and claims that do not, and a claim interrupted by Ctrl-C. The wheel's
entry point is tested in tests/test_wheel.py.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch

from harness import findings as registry
from harness.findings import Case, Finding, max_abs_difference
from harness.pytest_plugin import (
    WORDS, Expectation, check_registered, child_environment, folder_for_test, how_to_decide,
    import_root, judge, with_registered,
)

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
FOLDER = Path("/results/20261127-153450-cpu")
INFO = {"variants": ["row_loop", "sum_dim"], "baseline": "row_loop", "peers": [],
        "proposed": None, "cases": ["rows=16"]}


@pytest.fixture
def plugin_only(monkeypatch):
    """Inner pytest sessions load this plugin by `-p` and nothing through entry points:
    the same session whether or not the environment has the plugin installed."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


# ------------------------------------------------------------------------ loading

def test_the_entry_point_names_the_module_and_it_defines_the_fixture(pytester, plugin_only):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {
        "esper-bench": "harness.pytest_plugin"}
    listed = pytester.runpytest("-p", "harness.pytest_plugin", "--fixtures")
    listed.stdout.fnmatch_lines(["*fixtures defined from harness.pytest_plugin*",
                                 "claim*", "*State a performance claim and assert it*"])
    helped = pytester.runpytest("-p", "harness.pytest_plugin", "--help")
    helped.stdout.fnmatch_lines(["*--esper-bench-results=DIR*", "*esper_bench_results*"])


def test_loading_the_plugin_imports_neither_torch_nor_pandas():
    """A pytest session that states no claim pays nothing for the plugin."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys, harness.pytest_plugin; print(*sorted(m for m in "
         "sys.modules if m.split('.')[0] in ('torch', 'pandas', 'numpy', 'scipy')))"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_tests_that_state_claims_carry_the_marker(pytester, plugin_only):
    pytester.makepyfile(test_marked="""
        def test_states_a_claim(claim):
            pass

        def test_states_none():
            pass
    """)
    chosen = pytester.runpytest("-p", "harness.pytest_plugin", "--collect-only", "-q",
                                "-m", "esper_bench")
    chosen.stdout.fnmatch_lines(["test_marked.py::test_states_a_claim", "*1 deselected*"])
    assert "test_states_none" not in chosen.stdout.str()


# ---------------------------------------------------------------- the claim's arguments

@pytest.mark.parametrize("arguments, message", [
    (dict(word="quicker"), "claim: word: expected one of faster, slower, same, or None for "
                           "counters alone; got 'quicker'"),
    (dict(word="inconclusive"), "word: expected .*; got 'inconclusive' \\(an inconclusive word "
                                "decides nothing"),
    (dict(word=None), "word: expected a word to assert .*, or counters to assert; got None"),
    (dict(word="faster", counters={"alocations": 1}),
     "counters: expected counter names among op_calls, host_syncs, allocations, "
     "allocated_bytes, peak_bytes, kernel_launches; got 'alocations'"),
    (dict(word="faster", counters={"allocations": -1}),
     "counters\\['allocations'\\]: expected an exact count \\(an int >= 0\\); got -1"),
    (dict(word="faster", counters={"allocations": True}),
     "counters\\['allocations'\\]: expected an exact count .*; got True"),
    (dict(word="faster", budget=0), "budget: expected the run's wall seconds .*; got 0"),
    (dict(word="faster", budget=float("inf")), "budget: .*; got inf"),
    (dict(word="faster", quick="yes"), "quick: expected True or False; got 'yes'"),
    (dict(word="faster", case=[]), "case: expected a case label .*; got \\[\\]"),
    (dict(word="faster", options=["--out", "elsewhere"]),
     "options: expected harness.run options the claim does not set itself .*; got '--out'"),
    (dict(word="faster", options=["--budget=3"]), "options: .*; got '--budget=3'"),
    (dict(word="faster", options="--margin 0.1"), "options: expected a list .*"),
])
def test_bad_arguments_name_the_field_the_expected_and_the_received(arguments, message):
    with pytest.raises(pytest.UsageError, match=message):
        Expectation.of("MY-rowsums", **arguments)


def test_a_bad_argument_fails_its_test_naming_the_field_and_runs_nothing(pytester,
                                                                         plugin_only):
    pytester.makepyfile(test_bad_claim="""
        def test_bad_word(claim):
            claim("MY-rowsums", word="quicker")

        def test_bad_counter(claim):
            claim("MY-rowsums", word="faster", counters={"host_sync": 0})
    """)
    kept = pytester.path / "kept-runs"
    result = pytester.runpytest("-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
                                f"--esper-bench-results={kept}")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*UsageError: claim: word: expected one of faster, slower, same, or None for "
        "counters alone; got 'quicker'",
        "*UsageError: claim: counters: expected counter names among op_calls, host_syncs, *; "
        "got 'host_sync'"])
    assert not kept.exists()  # refused before harness.run was started


def test_the_arguments_become_harness_runs_command_line(tmp_path):
    expected = Expectation.of("MY-rowsums", word="faster", budget=5, device="cpu",
                              processes=3, module="my_findings",
                              options=["--margin", "0.1"])
    assert expected.arguments(tmp_path) == [
        "--findings", "MY-rowsums", "--out", str(tmp_path), "--no-report", "--every-cell",
        "--quick",
        "--budget", "5.0", "--device", "cpu", "--processes", "3",
        "--findings-module", "my_findings", "--margin", "0.1"]
    assert "--quick" not in Expectation.of("X", word="same", quick=False).arguments(tmp_path)
    from harness.run import build_parser  # every option the claim writes is harness.run's

    parsed = build_parser().parse_args(expected.arguments(tmp_path))
    assert (parsed.findings, parsed.quick, parsed.budget, parsed.processes, parsed.margin) == (
        ["MY-rowsums"], True, 5.0, 3, 0.1)


def _rowsums(variants=("row_loop", "sum_dim"), id="PLUGIN-rowsums") -> Finding:
    return Finding(
        id=id, title="rows", claim="sum(dim=1) is faster than a loop",
        variants=variants, baseline="row_loop",
        cases=lambda quick: [Case.of(rows=16)] if quick else [Case.of(rows=16), Case.of(rows=256)],
        build=lambda case, device, seed: torch.rand(case["rows"], 8),
        make_call=lambda variant, x: lambda: x.sum(dim=1),
        check=max_abs_difference)


@pytest.mark.parametrize("arguments, message", [
    (dict(variant="sum_dims"), "variant: expected one of PLUGIN-rowsums's variants other than "
                               "its baseline: sum_dim; got 'sum_dims'"),
    (dict(variant="row_loop"), "variant: expected a variant of PLUGIN-rowsums other than its "
                               "baseline row_loop .*; got 'row_loop'"),
    (dict(case="rows=256"), "case: expected one of PLUGIN-rowsums's cases with quick=True: "
                            "rows=16; got 'rows=256'"),
])
def test_a_registered_findings_variant_and_case_are_checked_before_any_run(arguments, message):
    with pytest.raises(pytest.UsageError, match=message):
        check_registered(Expectation.of("PLUGIN-rowsums", word="faster", **arguments),
                         _rowsums())
    check_registered(Expectation.of("PLUGIN-rowsums", word="faster", variant="sum_dim",
                                    case="rows=256", quick=False), _rowsums())


def test_the_run_loads_the_module_that_registered_the_finding_or_every_one_for_an_unknown_id(
        monkeypatch):
    monkeypatch.setitem(registry.FINDINGS, "PLUGIN-rowsums", _rowsums())
    monkeypatch.setitem(registry.ORIGINS, "PLUGIN-rowsums", __name__)
    found = with_registered(Expectation.of("PLUGIN-rowsums", word="faster"))
    assert found.modules == (__name__,)
    named = with_registered(Expectation.of("PLUGIN-rowsums", word="faster", module="other"))
    assert named.modules == ("other",)
    with pytest.raises(pytest.UsageError, match="variant: .*got 'nope'"):
        with_registered(Expectation.of("PLUGIN-rowsums", word="faster", variant="nope"))
    unknown = with_registered(Expectation.of("PLUGIN-rowsum", word="faster"))
    assert __name__ in unknown.modules  # the run's unknown-id error then names the nearest
    assert all(m in sys.modules for m in unknown.modules)


def test_the_run_finds_the_modules_and_the_harness_this_process_imported(tmp_path, monkeypatch):
    (tmp_path / "claims_pkg").mkdir()
    (tmp_path / "claims_pkg" / "__init__.py").write_text("")
    (tmp_path / "claims_pkg" / "claims_here.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("claims_pkg.claims_here")

        assert import_root("claims_pkg.claims_here") == tmp_path
        assert import_root("claims_pkg") == tmp_path
        assert import_root("harness") == REPO
        assert import_root("not_imported_anywhere") is None
        monkeypatch.setenv("PYTHONPATH", "/elsewhere")
        path = child_environment(["claims_pkg.claims_here"])["PYTHONPATH"].split(os.pathsep)
        assert path[:2] == [str(tmp_path), str(REPO)] and path[-1] == "/elsewhere"
    finally:
        for name in ("claims_pkg.claims_here", "claims_pkg"):
            sys.modules.pop(name, None)


def test_runs_go_to_the_tests_tmp_path_or_the_folder_the_option_or_ini_key_names(
        pytester, plugin_only):
    pytester.makepyfile(test_where="""
        def test_here(claim, tmp_path):
            print("RUNS", claim.results_dir(), "TMP", tmp_path)
    """)

    def runs_dir(*args: str) -> tuple[Path, Path]:
        result = pytester.runpytest("-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
                                    "-s", *args)
        result.assert_outcomes(passed=1)
        ((runs, tmp),) = re.findall(r"RUNS (\S+) TMP (\S+)", result.stdout.str())
        return Path(runs), Path(tmp)

    runs, tmp = runs_dir()
    assert runs == tmp
    pytester.makeini("[pytest]\nesper_bench_results = ini-runs\n")
    assert runs_dir()[0] == pytester.path / "ini-runs" / "test_where.py-test_here"
    assert runs_dir("--esper-bench-results=given")[0] == (
        pytester.path / "given" / "test_where.py-test_here")


def test_each_test_gets_a_folder_name_of_its_own():
    assert folder_for_test("tests/test_x.py::test_a[rows=16]") == "tests-test_x.py-test_a-rows-16"
    long_a, long_b = (folder_for_test(f"t.py::test_{'x' * 200}[{i}]") for i in (1, 2))
    assert len(long_a) <= 120 and long_a != long_b


# ------------------------------------------------------------------- judging a run's rows

def _row(variant="sum_dim", case="rows=16", **fields) -> dict:
    """A summary row as `load_run` reads it (the fields of a real quick run's row)."""
    row = {"finding": "MY-rowsums", "case": case, "variant": variant, "baseline": False,
           "placebo": False, "status": "ok", "verdict": "faster", "op_calls": 3.0,
           "host_syncs": 0.0, "allocations": 1.0, "n": 200.0, "ratio": 0.0547,
           "ci_low": 0.0381, "ci_high": 0.0784, "ci_level": 0.9928571428571429,
           "margin": 0.05, "compared_to": "row_loop", "kernel_launches": float("nan")}
    return {**row, **fields}


def _baseline(case="rows=16") -> dict:
    return {"finding": "MY-rowsums", "case": case, "variant": "row_loop", "baseline": True,
            "placebo": False, "status": "ok", "verdict": "baseline", "op_calls": 131.0,
            "host_syncs": 0.0, "allocations": 17.0, "n": 200.0}


def test_a_claim_that_holds_says_so_in_one_line():
    expected = Expectation.of("MY-rowsums", word="faster",
                              counters={"host_syncs": 0, "allocations": 1})
    judged = judge(expected, [_baseline(), _row()], INFO, FOLDER)
    assert judged.holds and judged.problems == ()
    assert judged.line == (
        "MY-rowsums sum_dim vs row_loop at rows=16: ratio 0.0547 [0.0381-0.0784] (99.3% "
        "interval) faster, expected faster; host_syncs 0 (expected 0), allocations 1 "
        f"(expected 1); holds; run {FOLDER}")


@pytest.mark.parametrize("measured", [w for w in WORDS if w != "faster"])
def test_another_word_does_not_hold(measured):
    judged = judge(Expectation.of("MY-rowsums", word="faster"),
                   [_baseline(), _row(verdict=measured, ratio=1.0, ci_low=0.99, ci_high=1.01)],
                   INFO, FOLDER)
    assert not judged.holds
    assert judged.problems == (f"rows=16: {measured}, not faster",)
    assert f"{measured}, expected faster; does not hold; run {FOLDER}" in judged.line


def test_an_inconclusive_word_never_holds_and_says_how_to_decide_it():
    row = _row(verdict="inconclusive", lean="faster", rounds_to_decide=765.0, ratio=0.946,
               ci_low=0.89, ci_high=1.01)
    judged = judge(Expectation.of("MY-rowsums", word="faster"), [_baseline(), row], INFO,
                   FOLDER)
    assert not judged.holds
    assert "inconclusive (leans faster), expected faster; does not hold" in judged.line
    assert judged.problems == (
        "rows=16: inconclusive, not faster: it leans faster; about 765 rounds would decide "
        "it (this run took 200): give the claim a larger budget=, more processes=, or a "
        "quieter machine",)
    edge = how_to_decide({**row, "rounds_to_decide": float("nan")})
    assert "sits on the margin's edge (±5%): no number of rounds would decide it" in edge


def test_a_variant_that_disagrees_with_its_reference_or_raises_fails_the_claim_by_name():
    rows = [_baseline(), _row(),
            {"finding": "MY-rowsums", "case": "rows=16", "variant": "off_by_one",
             "placebo": False, "status": "mismatch", "verdict": "mismatch",
             "reason": "max error 1 > tolerance 0.0001"},
            {"finding": "MY-rowsums", "case": "rows=16", "variant": "raises",
             "placebo": False, "status": "failed", "verdict": "failed",
             "error": "first call: RuntimeError: boom (at bad_findings.py:12)"}]
    info = {**INFO, "variants": ["row_loop", "sum_dim", "off_by_one", "raises"]}
    judged = judge(Expectation.of("MY-rowsums", word="faster", variant="sum_dim"), rows, info,
                   FOLDER)
    assert judged.problems == (
        "FAIL: off_by_one disagreed with its reference at rows=16 (max error 1 > tolerance "
        "0.0001)",
        "ERROR: raises raised at rows=16: first call: RuntimeError: boom (at bad_findings.py:12)")
    failed = judge(Expectation.of("MY-rowsums", word="faster", variant="off_by_one"), rows,
                   info, FOLDER)
    assert "at rows=16: FAIL, expected faster" in failed.line and not failed.holds


def test_counters_are_compared_exactly_naming_counter_expected_and_measured():
    judged = judge(Expectation.of("MY-rowsums", word=None,
                                  counters={"allocations": 0, "host_syncs": 0,
                                            "kernel_launches": 0}),
                   [_baseline(), _row()], INFO, FOLDER)
    assert judged.problems == (
        "allocations: expected 0, measured 1 at rows=16",
        "kernel_launches: expected 0, not counted at rows=16 (the run counted nothing for "
        "this row)")
    assert "; allocations 1 (expected 0), host_syncs 0 (expected 0)" in judged.line
    assert "expected faster" not in judged.line


def test_every_case_is_judged_unless_one_is_named():
    rows = [_baseline(), _row(), _baseline("rows=256"),
            _row(case="rows=256", verdict="same", ratio=1.0, ci_low=0.98, ci_high=1.02)]
    info = {**INFO, "cases": ["rows=16", "rows=256"]}
    every = judge(Expectation.of("MY-rowsums", word="faster"), rows, info, FOLDER)
    assert every.problems == ("rows=256: same, not faster",)
    assert "at rows=16: ratio" in every.line and "; at rows=256: ratio 1 [0.98-1.02]" in every.line
    named = judge(Expectation.of("MY-rowsums", word="faster", case="rows=16"), rows, info,
                  FOLDER)
    assert named.holds and "rows=256" not in named.line
    with pytest.raises(pytest.UsageError, match="case: expected one of the cases of "
                                                 "MY-rowsums the run measured: rows=16, "
                                                 "rows=256; got 'rows=64'"):
        judge(Expectation.of("MY-rowsums", word="faster", case="rows=64"), rows, info, FOLDER)


def test_the_variant_is_the_proposed_one_or_the_only_other_else_it_must_be_named():
    rows = [_baseline(), _row(), _row(variant="stacked", verdict="slower")]
    assert judge(Expectation.of("MY-rowsums", word="faster"), rows[:2], INFO, FOLDER).holds
    several = {**INFO, "variants": ["row_loop", "sum_dim", "stacked"]}
    with pytest.raises(pytest.UsageError, match="variant: expected one of MY-rowsums's "
                                                 "variants sum_dim, stacked .*; got None"):
        judge(Expectation.of("MY-rowsums", word="faster"), rows, several, FOLDER)
    proposed = judge(Expectation.of("MY-rowsums", word="faster"), rows,
                     {**several, "proposed": "stacked"}, FOLDER)
    assert proposed.problems == ("rows=16: slower, not faster",)


def test_a_variant_that_needs_cuda_everywhere_skips_rather_than_passes():
    row = _row(status="needs_cuda", verdict="needs_cuda", ratio=None)
    judged = judge(Expectation.of("MY-rowsums", word="faster"), [_baseline(), row], INFO,
                   FOLDER)
    assert not judged.holds and judged.problems == ()
    assert judged.skip.startswith("MY-rowsums sum_dim needs CUDA at every case")


# ------------------------------------------------------------------ a user's test file

FINDINGS_MODULE = '''
import torch
from harness import Case, Finding, max_abs_difference, register


def make_call(variant, x):
    if variant == "row_loop":
        return lambda: torch.stack([row.sum() for row in x])
    if variant == "off_by_one":
        return lambda: x.sum(dim=1) + 1
    return lambda: x.sum(dim=1)


register(Finding(
    id="MY-rowsums", title="Row sums: a loop over rows vs one sum(dim=1)",
    claim="sum(dim=1) is faster than a loop over rows",
    variants=("row_loop", "sum_dim"), baseline="row_loop",
    cases=lambda quick: [Case.of(rows=64)],
    build=lambda case, device, seed: torch.rand(
        case["rows"], 64, generator=torch.Generator().manual_seed(seed)).to(device),
    make_call=make_call,
    reference=lambda x: x.double().sum(dim=1), check=max_abs_difference, tolerance=1e-4,
))
register(Finding(
    id="MY-wrong", title="a variant that is wrong", claim="off_by_one is faster",
    variants=("row_loop", "off_by_one"), baseline="row_loop",
    cases=[Case.of(rows=64)],
    build=lambda case, device, seed: torch.rand(case["rows"], 64),
    make_call=make_call,
    reference=lambda x: x.double().sum(dim=1), check=max_abs_difference, tolerance=1e-4,
))
'''

USER_TESTS = '''
import torch
from harness import Case, Finding, max_abs_difference, register

import my_findings  # noqa: F401  (registers MY-rowsums and MY-wrong)

# a finding registered by the test module itself
register(Finding(
    id="LOCAL-twins", title="one sum against the same sum", claim="b is faster than a",
    variants=("a", "b"), baseline="a", cases=[Case.of(n=4096)],
    build=lambda case, device, seed: torch.rand(case["n"]),
    make_call=lambda variant, x: (lambda: x.sum()),
    check=max_abs_difference, tolerance=1e-6,
))


def test_holds(claim):
    # four processes, as a single-row claim needs on a busy machine (tests/test_wheel.py)
    claimed = claim("MY-rowsums", variant="sum_dim", word="faster", budget=5, processes=4,
                    counters={"host_syncs": 0, "allocations": 1})
    assert [row["variant"] for row in claimed.rows] == ["row_loop", "sum_dim"]


def test_wrong_word(claim):
    claim("MY-rowsums", variant="sum_dim", word="slower", budget=5)


def test_counter_does_not_hold(claim):
    claim("MY-rowsums", word=None, budget=5, counters={"allocations": 0})


def test_twins_are_not_faster(claim):
    claim("LOCAL-twins", word="faster", budget=5)


def test_wrong_variant_fails(claim):
    claim("MY-wrong", word="faster", budget=5)


def test_unknown_id(claim):
    claim("MY-rowsum", word="faster", budget=5)
'''


@pytest.mark.integration  # five real runs of harness.run, each in a process of its own
@pytest.mark.usefixtures("cores_calm")
def test_a_users_claims_pass_and_fail_as_harness_run_measures_them(pytester, plugin_only):
    pytester.makepyfile(my_findings=FINDINGS_MODULE, test_user_claims=USER_TESTS)
    kept = pytester.path / "kept-runs"
    result = pytester.runpytest_subprocess("-p", "harness.pytest_plugin", "-p",
                                           "no:cacheprovider", f"--esper-bench-results={kept}",
                                           timeout=580)
    output = result.stdout.str()
    result.assert_outcomes(passed=1, failed=5)
    result.stdout.fnmatch_lines([
        # the claim that holds, its line in the summary
        "*= esper-bench claims =*",
        "PASSED MY-rowsums sum_dim vs row_loop at rows=64: ratio * (9*% interval) faster, "
        "expected faster; host_syncs 0 (expected 0), allocations 1 (expected 1); holds; run "
        f"{kept}/test_user_claims.py-test_holds/*-cpu",
    ])
    # a wrong word, a counter that does not hold, twins said faster, a FAIL: each fails
    # with its line and what failed
    for expected in (
            # the word the run measured (faster, or inconclusive on a busy machine) is not
            # the one claimed: either way the claim fails
            "*AssertionError: MY-rowsums sum_dim vs row_loop at rows=64: ratio *, "
            "expected slower; does not hold; run *",
            "*- rows=64: *, not slower*",
            "*- allocations: expected 0, measured 1 at rows=64",
            "*AssertionError: LOCAL-twins b vs a at n=4096: ratio * expected faster; does not "
            "hold; run *",
            "*- FAIL: off_by_one disagreed with its reference at rows=64 (max error * > "
            "tolerance 0.0001)",
            "*UsageError: claim('MY-rowsum'): harness.run refused it: --findings: unknown "
            "id(s) MY-rowsum (did you mean MY-rowsums?); known: *"):
        result.stdout.fnmatch_lines([expected])
    assert "- n=4096: faster, not faster" not in output  # twins read same or inconclusive

    # the kept run is harness.run's own: its options, its rows, readable by its loader
    from harness.results import load_run

    (folder,) = [p for p in (kept / "test_user_claims.py-test_holds").iterdir() if p.is_dir()]
    run = load_run(folder)
    assert run.metadata["status"] == "complete"
    assert run.metadata["options"]["findings"] == ["MY-rowsums"]
    assert run.metadata["options"]["quick"] is True
    assert run.metadata["options"]["budget"] == 5.0
    assert run.metadata["options"]["findings_module"] == ["my_findings"]
    row = run.summary.set_index("variant").loc["sum_dim"]
    assert row["verdict"] == "faster" and row["processes"] >= 2
    assert json.loads((folder / "run.json").read_text())["run_id"] == folder.name


LONG_CLAIM = """
import torch
from harness import Case, Finding, max_abs_difference, register

register(Finding(
    id="MY-many", title="row sums at eight sizes", claim="sum(dim=1) is faster",
    variants=("row_loop", "sum_dim"), baseline="row_loop",
    cases=[Case.of(rows=16 * k) for k in range(1, 9)],
    build=lambda case, device, seed: torch.rand(case["rows"], 64),
    make_call=lambda variant, x: (lambda: torch.stack([row.sum() for row in x]))
                                 if variant == "row_loop" else (lambda: x.sum(dim=1)),
    check=max_abs_difference, tolerance=1e-4,
))


def test_long(claim):
    claim("MY-many", word="faster", budget=300, options=["--precision", "0"])
"""


@pytest.mark.integration  # a run interrupted in a pytest of its own
def test_ctrl_c_during_a_claim_leaves_its_run_interrupted_not_killed(pytester, plugin_only):
    """pytest interrupted while a claim's run measures: the run gets SIGINT in turn and
    ends by itself (`INTERRUPT_GRACE_S`), marked interrupted with the cells it measured
    kept, and nothing of it is left running."""
    pytester.makepyfile(test_long_claim=LONG_CLAIM)
    kept = pytester.path / "kept-runs"
    process = pytester.popen(
        [sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p",
         "no:cacheprovider", f"--basetemp={pytester.path / 'basetemp'}",
         f"--esper-bench-results={kept}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not list(kept.glob("*/*/cells/*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the run has journaled its first of eight cells
        (run_json,) = kept.glob("*/*/run.json")
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
        for left in kept.glob("*/*/run.json"):  # a failed test leaves no run behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(json.loads(left.read_text())["pid"], signal.SIGKILL)
    assert process.returncode == 2, output.decode()  # pytest: interrupted
    document = json.loads(run_json.read_text())
    assert document["status"] == "interrupted", output.decode()
    assert 1 <= len(list(run_json.parent.glob("cells/*.json"))) < 8
    with pytest.raises(ProcessLookupError):
        os.kill(document["pid"], 0)
