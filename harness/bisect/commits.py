"""The commits a bisect walks: the repository, its revisions checked, listed oldest first.

Read-only git: `rev-parse`, `merge-base --is-ancestor` and `log`; nothing here changes the
user's checkout, branch or files. Every problem is a `UsageError` (exit 2) naming the
option, what was expected and what was received.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.exits import UsageError


@dataclass(frozen=True)
class Commit:
    """One commit: its full id and the first line of its message."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:8]

    def text(self) -> str:
        """'3f2a91c0 Plant a host sync in scale()'."""
        return f"{self.short} {self.subject}"


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """`git -C repo ARGS`, output captured as text; UsageError when git is not installed."""
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except FileNotFoundError as err:
        raise UsageError("bisect: expected git on PATH; got no git executable") from err


def repository(folder: Path, what: str) -> Path:
    """The root of the git repository holding `folder`; UsageError naming `what` (whose
    folder it is) when there is none."""
    done = git(folder, "rev-parse", "--show-toplevel")
    if done.returncode != 0:
        raise UsageError(f"bisect: expected {what} in a git repository, whose commits are "
                         f"bisected; got {folder}, which is not in one")
    return Path(done.stdout.strip()).resolve()


def resolve(repo: Path, rev: str, option: str) -> Commit:
    """The commit `rev` names in `repo`; UsageError naming `option` when git does not know
    it as a commit."""
    if not rev.strip():
        raise UsageError(f"{option}: expected a git revision (a commit, branch or tag); got {rev!r}")
    done = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise UsageError(f"{option}: expected a commit, branch or tag of {repo}; got {rev!r}, "
                         "which git does not know (in a shallow clone, fetch more history: "
                         "git fetch --unshallow)")
    sha = done.stdout.strip()
    return Commit(sha, git(repo, "log", "-1", "--format=%s", sha).stdout.strip())


def check_order(repo: Path, good: Commit, bad: Commit, revs: tuple[str, str]) -> None:
    """UsageError unless `good` is a proper ancestor of `bad` (`revs`: as the user named them)."""
    if good.sha == bad.sha:
        raise UsageError(f"--good, --bad: expected two different commits; got {revs[0]!r} and "
                         f"{revs[1]!r}, both {good.short}")
    done = git(repo, "merge-base", "--is-ancestor", good.sha, bad.sha)
    if done.returncode == 1:
        raise UsageError(f"--good: expected an ancestor of --bad {revs[1]!r} ({bad.short}); got "
                         f"{revs[0]!r} ({good.short}), which is not (swap them if the good "
                         "commit is the newer one)")
    if done.returncode != 0:
        raise UsageError(f"--good, --bad: git merge-base failed: {done.stderr.strip()}")


def between(repo: Path, good: Commit, bad: Commit) -> list[Commit]:
    """The commits after `good` up to `bad`, oldest first, along `bad`'s first parents
    (a merged branch is one step, as `git bisect --first-parent` takes it)."""
    done = git(repo, "log", "--first-parent", "--ancestry-path", "--reverse",
               "--format=%H%x00%s", f"{good.sha}..{bad.sha}")
    if done.returncode != 0:
        raise UsageError(f"--good, --bad: git log failed: {done.stderr.strip()}")
    commits = [Commit(*line.split("\0", 1)) for line in done.stdout.splitlines() if line]
    if not commits or commits[-1].sha != bad.sha:
        raise UsageError(f"--good: expected {good.short} on the first-parent line of "
                         f"{bad.short}; got no first-parent path between them")
    return commits
