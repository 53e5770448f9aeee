"""A throwaway git repository for the bisect tests: a user's library and findings module.

`make_repo(folder)` commits, in order: the library and a findings module (the good
commit), then eleven more: unrelated edits (a README, a comment that moves `scale` down
one line, a licence), one that breaks the import (a syntax error in the
library) and the next that mends it, the commit that plants a host sync (`.item()`) in
`scale`, and unrelated edits after it. The last commit is the bad one.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

OPS = """import torch


def scale(x):
    return x / x.abs().max()
"""
FINDINGS = """import torch
from harness import Case, Finding, max_abs_difference, register
from mylib.ops import scale

register(Finding(
    id="MY-scale", title="scale by the largest magnitude", claim="scale() never syncs the host",
    variants=("torch", "mylib"), baseline="torch", cases=[Case.of(n=64)],
    build=lambda case, device, seed: torch.rand(case["n"], generator=torch.Generator().manual_seed(seed)),
    make_call=lambda variant, x: (lambda: x / x.abs().max()) if variant == "torch" else (lambda: scale(x)),
    check=max_abs_difference, tolerance=1e-6,
))
"""
PYPROJECT = '[tool.esper-bench]\nfindings-modules = ["bench_findings"]\n'
#: the planted line: `scale`'s body as the planting commit leaves it
PLANTED = ("    peak = x.abs().max().item()  # host sync: planted\n"
           "    return x / peak\n")


@dataclass(frozen=True)
class Repo:
    path: Path
    commits: tuple[str, ...]
    """Every commit, oldest first: commits[0] is the good one, commits[-1] the bad one."""
    planted: str
    """The commit that plants the host sync."""
    broken: str
    """The commit whose library does not import."""
    planted_line: int
    """The line of `mylib/ops.py` that the planted `.item()` is on, at the bad commit."""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=test",
                           "-c", "user.email=test@example.org", "-c", "commit.gpgsign=false",
                           *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _commit(repo: Path, message: str, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def make_repo(folder: Path) -> Repo:
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q", "-b", "main")
    ops = OPS
    commits = [_commit(folder, "mylib: scale(), and its findings",
                       {"mylib/__init__.py": "", "mylib/ops.py": ops,
                        "bench_findings.py": FINDINGS, "pyproject.toml": PYPROJECT})]
    commits.append(_commit(folder, "README", {"README.md": "mylib\n"}))
    ops = ops.replace("\n\ndef scale", "\n\n# scale: by the largest magnitude\ndef scale")
    commits.append(_commit(folder, "comment above scale() (moves it down a line)",
                           {"mylib/ops.py": ops}))
    commits.append(_commit(folder, "README: usage", {"README.md": "mylib\n\nscale(x)\n"}))
    commits.append(_commit(folder, "LICENSE", {"LICENSE": "MIT\n"}))
    broken = _commit(folder, "start shift() (does not import yet)",
                     {"mylib/ops.py": ops + "\n\ndef shift(x:\n    return x\n"})
    commits.append(broken)
    ops += "\n\ndef shift(x):\n    return x - x.mean()\n"
    commits.append(_commit(folder, "finish shift()", {"mylib/ops.py": ops}))
    commits.append(_commit(folder, "README: shift", {"README.md": "mylib\n\nscale(x), shift(x)\n"}))
    ops = ops.replace("    return x / x.abs().max()\n", PLANTED)
    planted = _commit(folder, "scale(): divide by a Python float", {"mylib/ops.py": ops})
    commits.append(planted)
    for n in range(3):
        commits.append(_commit(folder, f"notes {n}", {f"notes/{n}.txt": f"{n}\n"}))
    line = ops.splitlines().index(PLANTED.splitlines()[0]) + 1
    return Repo(folder, tuple(commits), planted, broken, line)
