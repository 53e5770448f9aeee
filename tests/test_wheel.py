"""esper-bench as a user installs it: a wheel, not this checkout.

The wheel is built from this tree (`pip wheel`, no dependencies) and unpacked into a
folder of its own (`pip install --target`), which goes first on PYTHONPATH, so that the
harness, its templates and the review's data files are the wheel's; torch and the other
dependencies are this environment's. A user's project (a git repository outside this one,
with its findings module and pyproject.toml) is then run, reported, gated against a
baseline in that repository and bisected over its two commits, exactly as its README
would; the run's process imports its findings and its code, and nothing of esper. The review's own run
works from the wheel too. CI also installs the wheel with its dependencies into a new
environment (`.ci/run`): what this test cannot prove, that the wheel's declared
dependencies suffice.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.integration  # builds a wheel and starts a dozen processes

REPO = Path(__file__).resolve().parents[1]

FINDINGS = '''
import torch
from harness import Case, Finding, max_abs_difference, register
from mylib.ops import row_sums

register(Finding(
    id="MINE-rowsums", title="a loop over rows vs sum(dim=1)",
    claim="sum(dim=1) is ~10x faster than a loop over rows",
    variants=("loop", "sum"), baseline="loop", cases=[Case.of(rows=32)],
    build=lambda case, device, seed: torch.rand(
        case["rows"], 16, generator=torch.Generator().manual_seed(seed)),
    make_call=lambda variant, x: (lambda: row_sums(x)) if variant == "loop"
                                 else (lambda: x.sum(dim=1)),
    check=max_abs_difference, tolerance=1e-5,
))
'''
OPS = '''
import torch


def row_sums(x):
    return torch.stack([row.sum() for row in x])
'''
#: the second commit: one more op per row
SLOWER = OPS.replace("row.sum()", "(row + 0).sum()")


def build_wheel(folder: Path) -> Path:
    """Builds the wheel of this tree into `folder`/dist and returns its path.

    setuptools builds in the source tree (build/, *.egg-info), so two builds of one tree
    at once break each other; xdist's workers each run a module fixture. The build
    therefore runs on a private copy of what the wheel is made of.
    """
    source = folder / "source"
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {pattern.split(".")[0]
                for pattern in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    for name in sorted(packages):
        shutil.copytree(REPO / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(folder / "dist"), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, f"pip wheel failed ({built.returncode}):\n{built.stderr}"
    (wheel,) = (folder / "dist").glob("esper_bench-*.whl")
    return wheel


def test_two_builds_at_once_both_succeed(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        wheels = list(pool.map(build_wheel, [tmp_path / "a", tmp_path / "b"]))
    names = [sorted(zipfile.ZipFile(wheel).namelist()) for wheel in wheels]
    assert names[0] == names[1] and "harness/__init__.py" in names[0]


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory) -> Path:
    """The wheel of this tree, unpacked into a folder for PYTHONPATH."""
    folder = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(folder)
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("harness/report/templates/run.html.j2", "esper_review/invariants.json",
                 "esper_review/__init__.py", "esper/__init__.py"):
        assert data in names, f"{data} is not in the wheel"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(folder / "site"), str(wheel)], check=True, capture_output=True)
    return folder / "site"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c",
                           "user.email=t@example.org", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A user's repository: two commits of mylib, a findings module, its pyproject.toml."""
    repo = tmp_path_factory.mktemp("my-project")
    (repo / "mylib").mkdir()
    (repo / "mylib" / "__init__.py").write_text("")
    (repo / "mylib" / "ops.py").write_text(OPS)
    (repo / "my_findings.py").write_text(FINDINGS)
    (repo / "pyproject.toml").write_text(
        '[tool.esper-bench]\nfindings-modules = ["my_findings"]\nbaseline = "bench/counters.json"\n')
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def _run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in `cwd` with the wheel's packages first (and nothing of this tree)."""
    env = {**{k: v for k, v in os.environ.items()  # a pytest in it loads its plugins itself
              if k not in ("PYTEST_ADDOPTS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")},
           "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.long  # CI runs .ci/wheel: the run, report and gate from the wheel
def test_a_users_project_runs_reports_gates_and_bisects_from_the_wheel(wheel_site, project):
    where = _run(wheel_site, project, "-c", "import harness, esper_review; "
                 "print(harness.__file__, esper_review.__file__)")
    assert where.stdout.split() == [str(wheel_site / "harness" / "__init__.py"),
                                    str(wheel_site / "esper_review" / "__init__.py")]

    # the run, in a process that then lists what it imported (its findings, not esper)
    run = _run(wheel_site, project, "-c", "import sys; from harness.run import main; "
               "code = main(['--quick', '--budget', '10', '--device', 'cpu']); "
               "print(*sorted(m for m in sys.modules if m.split('.')[0] in "
               "('my_findings', 'mylib', 'esper', 'esper_review')), file=sys.stderr); "
               "sys.exit(code)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1].split() == ["my_findings", "mylib", "mylib.ops"]
    (folder,) = [p for p in (project / "results").iterdir() if p.is_dir()]
    metadata = json.loads((folder / "run.json").read_text())
    assert metadata["git_commit"] == _git(project, "rev-parse", "HEAD")  # the user's code
    assert metadata["git_dirty"] is False
    assert metadata["tool_version"]
    assert (project / "reports" / folder.name / "index.html").is_file()

    report = _run(wheel_site, project, "-m", "harness.report", "--markdown", "-")
    assert report.returncode == 0, report.stderr[-2000:]
    assert "MINE-rowsums" in report.stdout

    update = _run(wheel_site, project, "-m", "harness.gate", "--update-baseline")
    assert update.returncode == 0, update.stderr[-2000:]
    assert (project / "bench" / "counters.json").is_file()
    gate = _run(wheel_site, project, "-m", "harness.gate")
    assert gate.returncode == 0, gate.stdout[-2000:] + gate.stderr[-2000:]

    (project / "mylib" / "ops.py").write_text(SLOWER)
    _git(project, "commit", "-q", "-am", "second: one more op per row")
    gate = _run(wheel_site, project, "-m", "harness.gate", "--counters")
    assert gate.returncode == 1 and "REGRESSION" in gate.stdout.upper(), gate.stdout[-2000:]
    bisect = _run(wheel_site, project, "-m", "harness.bisect", "--good", "HEAD~1", "--bad",
                  "HEAD", "--findings", "MINE-rowsums", "--counter", "op_calls")
    assert bisect.returncode == 0, bisect.stdout[-2000:] + bisect.stderr[-2000:]  # found
    assert f"first changed commit: {_git(project, 'rev-parse', '--short=8', 'HEAD')}" in bisect.stdout


def test_the_reviews_own_findings_run_from_the_wheel(wheel_site, tmp_path):
    run = _run(wheel_site, tmp_path, "-m", "harness.run", "--findings-module", "esper_review",
               "--findings", "B4-PT-05", "--quick", "--budget", "1", "--every-cell", "--no-report",
               "--device", "cpu")
    assert run.returncode == 0, run.stderr[-3000:]
    listed = _run(wheel_site, tmp_path, "-m", "harness.run", "--findings-module",
                  "esper_review", "--list")
    assert "B4-CR-03" in listed.stdout


USER_TEST = '''
import torch
from harness import Case, Finding, max_abs_difference, register

register(Finding(
    id="WHEEL-rowsums", title="a loop over rows vs sum(dim=1)", claim="sum is faster",
    variants=("loop", "sum"), baseline="loop", cases=[Case.of(rows=64)],
    build=lambda case, device, seed: torch.rand(case["rows"], 64),
    make_call=lambda variant, x: (lambda: torch.stack([row.sum() for row in x]))
                                 if variant == "loop" else (lambda: x.sum(dim=1)),
    check=max_abs_difference, tolerance=1e-4,
))


def test_sum_syncs_nothing(claim):
    # correctness and counters alone: words are tests/harness/test_pytest_plugin.py's
    claim("WHEEL-rowsums", variant="sum", word=None, budget=1, counters={"host_syncs": 0})
'''


def test_the_pytest_plugin_loads_from_the_wheel_through_its_entry_point(wheel_site, tmp_path):
    """Installing the wheel is enough: pytest finds the plugin by its pytest11 entry point
    (no -p, no conftest), lists the fixture from the wheel's module, and a claim
    (correctness and counters) runs."""
    (entry_points,) = wheel_site.glob("esper_bench-*.dist-info/entry_points.txt")
    assert "[pytest11]\nesper-bench = harness.pytest_plugin" in entry_points.read_text()
    (tmp_path / "test_user.py").write_text(USER_TEST)
    fixtures = _run(wheel_site, tmp_path, "-m", "pytest", "--fixtures", "-v",
                    "-p", "no:cacheprovider", "test_user.py")
    assert fixtures.returncode == 0, fixtures.stdout[-2000:] + fixtures.stderr[-2000:]
    (listed,) = [line for line in fixtures.stdout.splitlines() if line.startswith("claim -- ")]
    where = Path(listed.removeprefix("claim -- ").rpartition(":")[0])  # relative to tmp_path
    assert (tmp_path / where).resolve() == (wheel_site / "harness" / "pytest_plugin.py").resolve()
    claimed = _run(wheel_site, tmp_path, "-m", "pytest", "-p", "no:cacheprovider",
                   f"--basetemp={tmp_path / 'basetemp'}", "test_user.py")
    assert claimed.returncode == 0, claimed.stdout[-3000:] + claimed.stderr[-2000:]
    (line,) = [line for line in claimed.stdout.splitlines() if line.startswith("PASSED WHEEL-")]
    assert line.startswith("PASSED WHEEL-rowsums sum vs loop at rows=64: ratio")
    assert "host_syncs 0 (expected 0); holds" in line
