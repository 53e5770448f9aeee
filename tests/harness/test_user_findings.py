"""Findings of a user's own, end to end: declared through the public API in modules outside
`harness/` (tests/findings_modules/user_*.py), found through `--findings-module` or a
pyproject.toml, measured, reported and gated like the built-in ones."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import findings as registry
from harness.exits import UsageError
from harness.gate import cli as gate
from harness.gate.table import Outcome
from harness.gate.counters import counting_fingerprint
from harness.project import ProjectConfig, load_project_config, parse
from harness.results import load_run
from harness.report.cli import main as report_main
from harness.run import main as run_main
from tests.findings_modules import user_failures

CLAIMS = "tests.findings_modules.user_claims"
FAILURES = "tests.findings_modules.user_failures"
BROKEN = "tests.findings_modules.user_broken"
QUICK = ["--quick", "--budget", "1", "--every-cell", "--device", "cpu"]


def _unload(*modules: str) -> None:
    """Take the modules' findings out of the registry and the modules out of sys.modules,
    so that other tests see the registry as they would in a fresh process."""
    for finding_id in registry.from_modules(modules):
        del registry.FINDINGS[finding_id], registry.ORIGINS[finding_id]
    for module in modules:
        sys.modules.pop(module, None)


@pytest.fixture
def user_modules():
    yield
    _unload(CLAIMS, FAILURES, BROKEN)


@pytest.fixture(autouse=True)
def in_a_users_folder(outside_the_repository):
    """Every test runs in a folder of the user's (conftest.py)."""


def _pyproject(folder: Path, table: str) -> Path:
    path = folder / "pyproject.toml"
    path.write_text(textwrap.dedent(table))
    return path


# --- harness.run -------------------------------------------------------------------------


@pytest.mark.integration
def test_a_users_findings_are_measured_with_their_failures_as_rows_and_reported(
        tmp_path, user_modules, capsys):
    code = run_main(["--findings-module", CLAIMS, "--findings-module", FAILURES, *QUICK,
                     "--out", str(tmp_path / "results"), "--reports", str(tmp_path / "reports")])
    assert code == 1  # a variant disagreed and one raised
    run = load_run(None, tmp_path / "results")
    assert run.metadata["options"]["findings_module"] == [CLAIMS, FAILURES]
    rows = run.summary.set_index(["finding", "variant"])
    # only the modules' findings: none of the built-in ones
    assert sorted(set(run.summary["finding"])) == ["USER-failing", "USER-no-cases", "USER-rowsums"]

    assert rows.loc[("USER-rowsums", "row_loop"), "verdict"] == "baseline"
    faster = rows.loc[("USER-rowsums", "sum_dim")]
    assert faster["status"] == "ok" and faster["ci_low"] <= faster["ratio"] <= faster["ci_high"]
    assert faster["max_error"] <= 1e-4 and faster["allocations"] >= 1  # checked and profiled

    wrong = rows.loc[("USER-failing", "wrong")]
    assert wrong["status"] == "mismatch" and wrong["max_error"] == pytest.approx(1.0)
    raised = rows.loc[("USER-failing", "raises")]
    assert raised["status"] == "failed"
    assert raised["error"].startswith(f"first call: RuntimeError: {user_failures.PLANTED} "
                                      "(at user_failures.py:")
    for variant in ("a", "b"):  # cases() raised: one failed row per variant, the run went on
        row = rows.loc[("USER-no-cases", variant)]
        assert row["status"] == "failed" and row["case"] == registry.CASES_FAILED.label
        assert "cases(quick=True) raised KeyError: 'planted: cases() raises'" in row["error"]

    page = (tmp_path / "reports" / run.run_id / "index.html").read_text()
    for text in ("USER-rowsums", "sum(dim=1) is ~8x faster than summing row by row",
                 "USER-failing", user_failures.PLANTED, "USER-no-cases", "max error 1"):
        assert text in page, text
    assert (tmp_path / "reports" / run.run_id / "USER-rowsums-speedup.png").is_file()
    assert (run.folder / "traces" / "USER-rowsums.json.gz").stat().st_size > 0
    assert "USER-rowsums" in capsys.readouterr().out  # the summary table

    # rendered again on its own, in a process that has not imported the modules: the run
    # names its modules, and the report imports them for the claims
    _unload(CLAIMS, FAILURES)
    assert report_main([str(run.folder), "--out", str(tmp_path / "again" / "report")]) == 0
    assert "sum(dim=1) is ~8x faster than summing row by row" in \
        (tmp_path / "again" / "report" / "index.html").read_text()


@pytest.mark.parametrize("module, cause", [
    (BROKEN, "importing it raised ValueError: Finding 'USER-broken': baseline: expected one of "
             "the variants (a, b); got 'c' (at user_broken.py:8)"),
    ("tests.findings_modules.not_there", "importing it raised ModuleNotFoundError: No module "
                                         "named 'tests.findings_modules.not_there'"),
])
def test_a_module_that_cannot_be_imported_exits_2_with_the_cause(tmp_path, capsys, module, cause,
                                                                 user_modules):
    for main, argv in ((run_main, [*QUICK, "--out", str(tmp_path)]),
                       (gate.main, ["--counters", "--baseline", str(tmp_path / "c.json")])):
        assert main(["--findings-module", module, *argv]) == 2
        err = capsys.readouterr().err
        assert f"--findings-module {module}: expected an importable module that registers " \
               "findings; " in err and cause in err
    assert "USER-broken" not in registry.FINDINGS
    assert not list(tmp_path.iterdir())  # nothing was measured or written


def test_a_module_that_registers_nothing_is_a_usage_error(tmp_path, capsys):
    assert run_main(["--findings-module", "tests.gae_inputs", *QUICK,
                     "--out", str(tmp_path)]) == 2
    assert ("--findings-module: tests.gae_inputs: expected a module that registers "
            "findings (harness.register calls at its top level); it registered none"
            ) in capsys.readouterr().err


# --- pyproject.toml -----------------------------------------------------------------------


@pytest.mark.integration
def test_pyproject_names_the_modules_for_run_list_and_records_them(tmp_path, monkeypatch, capsys,
                                                                   user_modules):
    _pyproject(tmp_path, f"""
        [tool.esper-bench]
        findings-modules = ["{CLAIMS}"]
        """)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found in a parent folder
    assert run_main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "USER-rowsums" in listed and f"from {CLAIMS}" in listed
    assert "B4-CR-03" not in listed and "esper_review" not in listed  # only the user's modules

    assert run_main([*QUICK, "--out", str(tmp_path / "results"), "--no-report"]) == 0
    run = load_run(None, tmp_path / "results")
    assert set(run.summary["finding"]) == {"USER-rowsums"}
    # --resume imports what the run recorded, wherever it is resumed from
    assert run.metadata["options"]["findings_module"] == [CLAIMS]


@pytest.mark.parametrize("table, message", [
    ('findings-modules = "bench.findings"',
     "[tool.esper-bench] findings-modules: expected a list of module names, e.g. "
     "[\"bench.findings\"]; got 'bench.findings'"),
    ('findings-modules = ["bench/findings.py"]',
     "[tool.esper-bench] findings-modules: expected a list of module names"),
    ('findings_modules = ["bench.findings"]',
     "[tool.esper-bench] findings_modules: expected one of the keys findings-modules, baseline, "
     "invariants; got 'findings_modules'"),
    ("baseline = 3", "[tool.esper-bench] baseline: expected a path (a non-empty string, relative "
                     "to the file's folder); got 3"),
    ('findings-modules = ["a"', "expected a readable TOML file; got TOMLDecodeError"),
])
def test_a_malformed_table_exits_2_naming_the_file_key_and_values(tmp_path, monkeypatch, capsys,
                                                                  table, message):
    path = _pyproject(tmp_path, f"[tool.esper-bench]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    for main, argv in ((run_main, ["--list"]), (gate.main, ["--counters"])):
        assert main(argv) == 2
        assert f"{path}: {message}" in capsys.readouterr().err


def test_project_config_reads_paths_relative_to_the_file_and_stops_at_the_first_file(tmp_path):
    outer = _pyproject(tmp_path, '[tool.esper-bench]\nfindings-modules = ["outer"]\n')
    (tmp_path / "inner" / "deep").mkdir(parents=True)
    inner = _pyproject(tmp_path / "inner", """
        [project]
        name = "x"
        [tool.esper-bench]
        findings-modules = ["a.b", "c", "a.b"]
        baseline = "bench/counters.json"
        invariants = "bench/invariants.json"
        """)
    assert load_project_config(tmp_path / "inner" / "deep") == ProjectConfig(
        path=inner, findings_modules=("a.b", "c"), baseline=tmp_path / "inner" / "bench" / "counters.json",
        invariants=tmp_path / "inner" / "bench" / "invariants.json")
    assert load_project_config(tmp_path).findings_modules == ("outer",)
    assert parse(outer, {"project": {"name": "no table"}}) == ProjectConfig(path=outer)
    with pytest.raises(UsageError, match=r"\[tool.esper-bench\]: expected a table; got 3"):
        parse(outer, {"tool": {"esper-bench": 3}})


# --- harness.gate -------------------------------------------------------------------------


def test_the_gate_counts_invariants_and_baselines_a_users_findings(tmp_path, capsys, user_modules):
    baseline = tmp_path / "bench" / "counters.json"
    modules = ["--findings-module", CLAIMS]
    assert gate.main([*modules, "--baseline", str(baseline)]) == 2  # no baseline yet
    err = capsys.readouterr().err
    assert f"create it with `python -m harness.gate --update-baseline --baseline {baseline} " \
           f"--findings-module {CLAIMS}`" in err

    assert gate.main([*modules, "--update-baseline", "--baseline", str(baseline)]) == 0
    entries = json.loads(baseline.read_text())["counters"]
    assert {(e["finding"], e["variant"]) for e in entries} == {
        ("USER-rowsums", "row_loop"), ("USER-rowsums", "sum_dim")}  # its quick case only
    capsys.readouterr()

    config = tmp_path / "bench" / "invariants.json"
    config.write_text(json.dumps({
        "schema_version": 1,
        "sampling": {"threads": 1, "min_samples": 10, "max_samples": 50, "time_budget_s": 0.3,
                     "min_sample_time": 0.001},
        "invariants": [{"id": "sum-dim-vs-loop", "finding": "USER-rowsums",
                        "case": {"rows": 16, "cols": 64}, "fast": "sum_dim", "slow": "row_loop",
                        "min_speedup": 1.5, "measured_speedup": 14.0}]}))
    # no check named: counters, and the invariants of the user's config
    assert gate.main([*modules, "--baseline", str(baseline), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "| counters | USER-rowsums | sum_dim | rows=16,cols=64 |" in out
    assert "| invariant sum-dim-vs-loop | USER-rowsums | sum_dim vs row_loop |" in out

    # one more op than the baseline allows: a regression, named
    entries[1]["op_calls"] -= 1
    document = json.loads(baseline.read_text())
    baseline.write_text(json.dumps({**document, "counters": entries}))
    assert gate.main([*modules, "--counters", "--baseline", str(baseline)]) == 1
    assert "| counters | USER-rowsums | sum_dim | rows=16,cols=64 |" in capsys.readouterr().out


def test_the_gate_records_a_users_raising_variant_and_cases_as_errors(tmp_path, capsys,
                                                                     user_modules):
    baseline = tmp_path / "counters.json"
    assert gate.main(["--findings-module", FAILURES, "--findings", "USER-failing",
                      "--update-baseline", "--baseline", str(baseline)]) == 2
    assert ("baseline not written, 1 cell(s) failed: USER-failing raises [rows=8,cols=32]: "
            f"RuntimeError('{user_failures.PLANTED}')") in capsys.readouterr().err
    assert not baseline.exists()

    baseline.write_text(json.dumps({"schema_version": 2, "fingerprint": counting_fingerprint(),
                                    "counters": []}))
    assert gate.main(["--findings-module", FAILURES, "--counters", "--baseline", str(baseline),
                      "--json", str(tmp_path / "rows.json")]) == 1
    outcomes = {(r["finding"], r["variant"]): (r["outcome"], r["note"])
                for r in json.loads((tmp_path / "rows.json").read_text())["rows"]}
    assert outcomes[("USER-failing", "raises")] == (
        "error", f"RuntimeError('{user_failures.PLANTED}')")
    assert outcomes[("USER-failing", "wrong")][0] == "new"  # counted: the gate checks counts
    for variant in ("a", "b"):
        outcome, note = outcomes[("USER-no-cases", variant)]
        assert outcome == "error" and "cases(quick=True) raised KeyError" in note


def test_the_gate_refuses_ungated_and_unknown_user_findings(capsys, user_modules, monkeypatch):
    assert gate.main(["--findings-module", CLAIMS, "--counters", "--findings", "USER-nope"]) == 2
    assert "--findings: unknown id(s) USER-nope" in capsys.readouterr().err
    registry.load_findings_module(CLAIMS)
    monkeypatch.setitem(registry.FINDINGS, "USER-rowsums",
                        dataclasses.replace(registry.FINDINGS["USER-rowsums"], gated=False))
    assert gate.main(["--findings-module", CLAIMS, "--counters", "--findings", "USER-rowsums"]) == 2
    assert ("got USER-rowsums, registered but not gated (gated=False in its Finding)"
            in capsys.readouterr().err)
    assert gate.main(["--findings-module", CLAIMS, "--invariants"]) == 2
    assert "--invariants: expected an invariants config for the findings of " \
           f"{CLAIMS} (--config FILE" in capsys.readouterr().err


# --- harness.gate --against on the user's own repository ----------------------------------


MYLIB = """
def row_sums(x):
    return x.sum(dim=1)


def col_sums(x):
    return x.sum(dim=0)
"""
#: the commit under test: row_sums does its work 30 times, col_sums is untouched
SLOWER = ("    return x.sum(dim=1)\n", "    for _ in range(30):\n        x.sum(dim=1)\n"
                                       "    return x.sum(dim=1)\n")
REPO_FINDINGS = """
import torch
from harness import Case, Finding, max_abs_difference, register
from mylib.ops import col_sums, row_sums

CALLS = {"torch": lambda x: x.sum(dim=1), "rows": row_sums, "cols": lambda x: col_sums(x.T)}

register(Finding(
    id="REPO-sums", title="torch's sum vs mylib's", claim="mylib is as fast as torch",
    variants=tuple(CALLS), baseline="torch", cases=[Case.of(rows=64, cols=64)],
    build=lambda case, device, seed: torch.rand(case["rows"], case["cols"]),
    make_call=lambda variant, x: lambda: CALLS[variant](x),
    check=max_abs_difference, tolerance=1e-5,
))
"""


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=t@example.org",
                    *args], check=True, capture_output=True)


def test_against_needs_the_users_modules_in_a_git_repository(tmp_path, monkeypatch, capsys,
                                                              user_modules):
    (tmp_path / "loose_findings.py").write_text(REPO_FINDINGS.replace(
        "from mylib.ops import col_sums, row_sums", "row_sums = col_sums = None"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert gate.main(["--findings-module", "loose_findings", "--against", "HEAD"]) == 2
        assert (f"--against: expected loose_findings ({tmp_path / 'loose_findings.py'}) in a git "
                "repository, whose revisions are compared; got a file outside any"
                ) in capsys.readouterr().err
    finally:
        _unload("loose_findings")


@pytest.mark.integration
@pytest.mark.slow
def test_against_a_revision_of_the_users_repository_catches_a_slower_commit(tmp_path):
    """A user's repository: a findings module (named in its pyproject.toml) that times its
    own library `mylib`. Against the commit before, the commit that makes
    `mylib.row_sums` 30x slower is a regression of that variant, while the variants
    whose code did not change pass: each revision's own `mylib` was imported and timed.
    (One gate run, about 30 s; a second against HEAD itself would double that.)"""
    repo = tmp_path / "repo"
    (repo / "mylib").mkdir(parents=True)
    (repo / "mylib" / "__init__.py").write_text("")
    (repo / "mylib" / "ops.py").write_text(MYLIB)
    (repo / "bench_findings.py").write_text(REPO_FINDINGS)
    _pyproject(repo, '[tool.esper-bench]\nfindings-modules = ["bench_findings"]\n')
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "mylib")
    (repo / "mylib" / "ops.py").write_text(MYLIB.replace(*SLOWER))
    _git(repo, "commit", "-qam", "row_sums, slower")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "harness.gate", "--against", "HEAD~1",
                           "--json", str(tmp_path / "rows.json")], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["variant"]: r for r in json.loads((tmp_path / "rows.json").read_text())["rows"]}
    assert set(rows) == {"torch", "rows", "cols"}
    assert rows["rows"]["outcome"] == "regression" and rows["rows"]["ci"]["low"] > 5
    for unchanged in ("torch", "cols"):
        assert not Outcome(rows[unchanged]["outcome"]).fails, rows  # pass (or faster)
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True,
                            text=True).stdout
    assert len(listed.splitlines()) == 1  # its worktree was removed


@pytest.mark.parametrize("command", ["run", "gate"])
def test_an_unknown_id_with_a_line_break_is_named_on_the_error_s_one_line(command, capsys):
    main = run_main if command == "run" else gate.main
    stop = [] if command == "run" else ["--counters"]
    assert main(["--findings-module", CLAIMS, *stop, "--findings", "\n"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --findings: unknown id(s) '\\n'; known: USER-") and err.count("\n") == 1


def test_an_unknown_id_names_the_nearest_known_one_of_the_users_modules_only(capsys,
                                                                            user_modules):
    """The review's findings (this repository's) are neither known nor suggested in a
    user's project; a near miss gets a "did you mean"."""
    assert run_main(["--findings-module", CLAIMS, "--findings", "USER-rowsum", "--list"]) == 0
    capsys.readouterr()
    assert run_main(["--findings-module", CLAIMS, *QUICK, "--findings", "USER-rowsum"]) == 2
    err = capsys.readouterr().err
    assert "unknown id(s) USER-rowsum (did you mean USER-rowsums?); known: USER-rowsums" in err
    assert "B4-CR-03" not in err
