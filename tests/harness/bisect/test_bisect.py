"""`python -m harness.bisect`: the first changed commit, in about log2(n) runs.

The search is checked on its own over every position of a change; the command on a
throwaway repository (tests/bisect_repo.py: 12 commits, one planting a host sync, one that
breaks the import, unrelated ones) built in a temporary folder, where it must name the
planted commit and line, skip and name the broken one, leave the user's checkout as it
was, and leave no worktree behind, also when interrupted. Bad input is exit 2 with
nothing changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.bisect.search import Decision, expected_steps, first_change
from harness.bisect.timing import time_decision
from harness.gate.table import GateRow, Outcome
from harness.measure.stats import RatioCI
from tests.bisect_repo import Repo, git, make_repo

# --- the search ----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 7, 8, 11, 16, 33])
def test_every_position_of_a_change_is_found_in_log2_decisions(count):
    for change in range(count):
        asked = []

        def decide(index):
            asked.append(index)
            return Decision.BAD if index >= change else Decision.GOOD

        found = first_change(count, decide)
        assert found.pinned and found.first_bad == change and found.last_good == change - 1
        assert len(asked) <= expected_steps(count) and count - 1 not in asked


def test_a_skipped_commit_is_stepped_around_or_named_among_the_candidates():
    # 11 candidates, the change at 7, index 4 cannot be measured: stepped around
    decisions = {4: Decision.SKIP}
    found = first_change(11, lambda i: decisions.get(i, Decision.BAD if i >= 7 else Decision.GOOD))
    assert found.pinned and found.first_bad == 7 and found.tested[0] == (4, Decision.SKIP)
    # the change at the skipped commit itself: the answer is one of two, both named
    found = first_change(11, lambda i: Decision.SKIP if i == 7 else
                         (Decision.BAD if i >= 7 else Decision.GOOD))
    assert not found.pinned and (found.last_good, found.first_bad) == (6, 8)
    assert found.skipped == (7,)


def test_an_undecided_commit_stops_the_search_between_the_known_ones():
    found = first_change(8, lambda i: Decision.UNDECIDED if i == 3 else
                         (Decision.BAD if i >= 5 else Decision.GOOD))
    assert not found.pinned and found.undecided == 3
    assert found.last_good < 3 < found.first_bad


def _row(low: float, high: float, outcome: Outcome) -> GateRow:
    ci = RatioCI((low * high) ** 0.5, low, high)
    return GateRow(check="A/B", finding="F", variant="v", case="n=1", baseline="", current="",
                   change=f"{ci.ratio - 1:+.1%}", outcome=outcome, ci=ci)


@pytest.mark.parametrize("low, high, outcome, decision", [
    (1.25, 1.35, Outcome.REGRESSION, Decision.BAD),      # slower, as the bad commit is
    (0.98, 1.03, Outcome.PASS, Decision.GOOD),           # wholly within +-5%
    (1.01, 1.12, Outcome.PASS, Decision.UNDECIDED),      # straddles the margin: not shown slower
    (0.80, 0.90, Outcome.IMPROVED, Decision.UNDECIDED),  # faster: not the change looked for
])
def test_time_decisions_hold_the_interval_to_the_margin_and_the_bad_commits_side(
        low, high, outcome, decision):
    change = {("F", "n=1", "v"): Outcome.REGRESSION}
    assert time_decision([_row(low, high, outcome)], change, 0.05)[0] is decision
    not_there = GateRow(check="A/B", finding="F", variant="v", case="n=1", baseline="",
                        current="", change="", outcome=Outcome.NOT_COMPARABLE, note="absent")
    assert time_decision([not_there], change, 0.05)[0] is Decision.SKIP


# --- the command on a throwaway repository -------------------------------------------------


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _bisect(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.bisect", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)


def _state(repo: Path) -> tuple[str, ...]:
    """What a bisect must leave as it was: HEAD, branches, status, worktrees, stashes."""
    return tuple(git(repo, *args) for args in (
        ("rev-parse", "HEAD"), ("branch", "-a", "-v"), ("status", "--porcelain", "--ignored"),
        ("worktree", "list", "--porcelain"), ("stash", "list")))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Repo:
    made = make_repo(tmp_path_factory.mktemp("bisect") / "repo")
    # an uncommitted edit and an untracked file, which the bisect must not touch
    (made.path / "README.md").write_text("mylib, being edited\n")
    (made.path / "scratch.txt").write_text("mine\n")
    return made


@pytest.mark.integration
@pytest.mark.long  # half a minute; CI runs the interrupted bisections
def test_the_planted_host_sync_is_found_with_its_line_and_the_broken_commit_skipped(repo):
    before = _state(repo.path)
    started = time.perf_counter()
    done = _bisect(repo.path, "--good", repo.commits[0], "--bad", "main",
                   "--findings", "MY-scale", "--counter", "host_syncs")
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    subject = git(repo.path, "log", "-1", "--format=%s", repo.planted)
    assert lines[0] == f"first changed commit: {repo.planted[:8]} {subject}"
    assert lines[1] == (f"  MY-scale mylib [n=64]: host syncs 0 -> 1: +1 aten::item at "
                        f"mylib/ops.py:{repo.planted_line} in scale()")
    candidates = len(repo.commits) - 1
    runs = done.stderr.count("step ")
    # the good and the bad commit, log2 of the 10 between, and the one skipped on the way
    assert runs <= 2 + expected_steps(candidates) + 1
    assert f"runs: {runs} (the good and bad commits and {runs - 2} of the 10 between)" in lines[2]
    assert f"skipped: {repo.broken[:8]} (--findings-module bench_findings: " in lines[2]
    assert "SyntaxError" in lines[2]
    assert _state(repo.path) == before
    print(f"bisect over {candidates} commits: {runs} runs, {seconds:.1f} s")


def _wait_for(process: subprocess.Popen, text: str, timeout: float) -> str:
    """stderr of `process` up to and including the first line containing `text`."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"{text!r} never came; stderr so far:\n{seen}")


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_bisect_leaves_no_worktree_and_says_how_far_it_got(repo, signum):
    before = _state(repo.path)
    process = subprocess.Popen(
        [sys.executable, "-m", "harness.bisect", "--good", repo.commits[0], "--bad", "main",
         "--findings", "MY-scale"], cwd=repo.path, env=_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = _wait_for(process, "step 3/", timeout=300)
        time.sleep(0.5)  # inside the third run: its worktree exists, its probe is running
        process.send_signal(signum)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, seen + err
    first, bad = repo.commits[0][:8], repo.commits[-1][:8]
    assert (f"interrupted at step 3 of about 6: the first change lies after {first} and at or "
            f"before {bad}") in err
    assert _state(repo.path) == before  # no worktree left, nothing else changed


# --- bad input: exit 2, the cause named, nothing changed ----------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["--good", "no-such-rev", "--bad", "main", "--findings", "MY-scale"],
     "--good: expected a commit, branch or tag of {repo}; got 'no-such-rev', which git does "
     "not know"),
    (["--good", "main", "--bad", "{first}", "--findings", "MY-scale"],
     "--good: expected an ancestor of --bad '{first}'"),
    (["--good", "main", "--bad", "main", "--findings", "MY-scale"],
     "--good, --bad: expected two different commits"),
    (["--good", "{first}", "--bad", "main", "--findings", "NOPE"],
     "--findings: unknown id(s) NOPE; known: "),
    (["--good", "{first}", "--bad", "main", "--findings", "MY-scale", "--counter", "syncs"],
     "argument --counter: invalid choice: 'syncs'"),
    (["--good", "{first}", "--bad", "main", "--findings", "MY-scale", "--margin", "0.1"],
     "--margin: expected with --time"),
    (["--good", "{first}", "--bad", "main", "--findings", "MY-scale", "--time", "--margin", "5"],
     "--margin: expected a fraction in (0, 1), e.g. 0.05; got '5'"),
])
def test_bad_input_exits_2_naming_the_cause_and_changes_nothing(repo, args, message):
    before = _state(repo.path)
    fill = {"repo": repo.path, "first": repo.commits[0]}
    done = _bisect(repo.path, *(a.format(**fill) for a in args))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message.format(**fill) in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert _state(repo.path) == before


@pytest.mark.integration
def test_a_project_without_git_exits_2(tmp_path):
    project = tmp_path / "project"
    made = make_repo(tmp_path / "with-git")
    made_files = ["mylib/__init__.py", "mylib/ops.py", "bench_findings.py", "pyproject.toml"]
    for name in made_files:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text((made.path / name).read_text())
    done = _bisect(project, "--good", "HEAD~1", "--bad", "HEAD", "--findings", "MY-scale")
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"bisect: expected bench_findings ({project / 'bench_findings.py'}) in a git "
            f"repository, whose commits are bisected; got {project}, which is not in one"
            ) in done.stderr
    assert sorted(p.relative_to(project).as_posix() for p in project.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts) == sorted(made_files)


def test_bisect_is_a_subcommand_of_the_console_script(capsys):
    from harness.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["bisect", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--good REV" in out and "exit status:" in out and "first changed commit" in out


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.long  # a minute of bisecting by time; CI bisects by counters
def test_time_bisect_finds_the_commit_that_made_a_variant_30x_slower(tmp_path):
    """--time: each commit timed against the good one by the gate's paired A/B sessions;
    the slow commit is named, with the counters that changed with it. (About 40 s.)"""
    from tests.bisect_repo import FINDINGS, OPS, PYPROJECT, _commit

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    good = _commit(repo, "scale()", {"mylib/__init__.py": "", "mylib/ops.py": OPS,
                                     "bench_findings.py": FINDINGS, "pyproject.toml": PYPROJECT})
    _commit(repo, "README", {"README.md": "mylib\n"})
    slow = _commit(repo, "scale(): 30 times the work", {"mylib/ops.py": OPS.replace(
        "    return x / x.abs().max()\n",
        "    for _ in range(30):\n        x.abs().max()\n    return x / x.abs().max()\n")})
    _commit(repo, "notes", {"notes.txt": "1\n"})
    # a 20% margin: the commits between hold the good commit's code, and each must read
    # wholly within the margin to be GOOD; 5% failed once in a full parallel test run,
    # whose load spreads a microseconds call's sessions wider than that
    done = _bisect(repo, "--good", good, "--bad", "main", "--findings", "MY-scale", "--time",
                   "--margin", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"first changed commit: {slow[:8]} scale(): 30 times the work"
    assert lines[1].startswith(f"  MY-scale mylib [n=64]: time vs {good[:8]} +")
    assert "(regression, margin 20%)" in lines[1]
    assert lines[2].startswith("runs: ") and lines[2].endswith(" of the 2 between)")
    assert lines[3] == "counters that changed with it:"
    assert "allocations 3 -> 63: +30 aten::abs at mylib/ops.py:6,7 in scale()" in lines[4]
    assert git(repo, "worktree", "list").count("\n") == 0
