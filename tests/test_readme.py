"""The README stays true: its Python examples run, its commands match CI's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.mark.integration  # each example in a fresh interpreter
@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_python_example_runs(index):
    # lines that demonstrate an error are shown, not run
    code = "\n".join(line for line in EXAMPLES[index].splitlines() if "Error" not in line)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in ci if line and not line.startswith(("#", "set ", "cd "))]
    assert commands and all(command in README for command in commands), commands
