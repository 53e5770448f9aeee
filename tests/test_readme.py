"""The README and docs stay true: their Python examples run, their generated blocks are
current, their links resolve, the README stays a front page, and its commands match CI's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README = (ROOT / "README.md").read_text()
EXAMPLES = [(page.relative_to(ROOT), code) for page in PAGES
            for code in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
#: the front page's length: what it answers, the two commands, the commands, where to read more
README_MAX_LINES = 250


@pytest.mark.integration  # each example in a fresh interpreter
@pytest.mark.parametrize("page, code", EXAMPLES, ids=[f"{p}-{i}" for i, (p, _) in
                                                      enumerate(EXAMPLES)])
def test_python_example_runs(page, code):
    # lines that demonstrate an error are shown, not run
    code = "\n".join(line for line in code.splitlines() if "Error" not in line)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"{page}: {result.stderr}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in ci if line and not line.startswith(("#", "set ", "cd "))]
    assert commands and all(command in README for command in commands), commands


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    links = re.findall(r"\]\(([^)#\s]+)\)", page.read_text())
    missing = [link for link in links if "://" not in link
               and not (page.parent / link).exists()]
    assert missing == []


@pytest.mark.integration  # a fresh interpreter imports every command and the plug-in
def test_generated_blocks_are_current():
    """`python docs/generate.py --check`: every measured table and --help block matches
    what the code and the committed results give (exit 1 names each stale block)."""
    done = subprocess.run([sys.executable, "docs/generate.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_a_stale_block_is_named_and_an_open_one_is_an_error(tmp_path):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import generate
    finally:
        sys.path.remove(str(ROOT / "docs"))
    text = "<!-- generated: variants -->\nhand-edited\n<!-- /generated -->\n"
    new, stale = generate.regenerate(text, "page.md")
    assert stale == ["variants"] and "| `gae` |" in new
    assert generate.regenerate(new, "page.md")[1] == []
    with pytest.raises(generate.DocsError, match="page.md: .* has no '<!-- /generated -->'"):
        generate.regenerate("<!-- generated: variants -->\n", "page.md")
    with pytest.raises(generate.DocsError, match="expected a kind among .*; got 'nope'"):
        generate.regenerate("<!-- generated: nope -->\n<!-- /generated -->", "page.md")
    # a committed run names no folder of the machine it was measured on
    assert (generate.portable_command("run.py --findings A --out /home/me/bench/results")
            == "run.py --findings A --out results/")
    assert generate.portable_command("run.py --out=/tmp/r --quick") == "run.py --out=results/ --quick"


def test_every_test_file_the_docs_and_code_name_exists():
    """Tests moved into a tree mirroring the packages: a `tests/...py` named in a page or a
    docstring must be where it says."""
    sources = [*PAGES, *(path for package in ("harness", "esper", "benchmarks")
                         for path in sorted((ROOT / package).rglob("*.py")))]
    named = {(source.relative_to(ROOT), path) for source in sources
             for path in re.findall(r"\btests/[\w/]+\.py\b", source.read_text())}
    missing = sorted((str(source), path) for source, path in named
                     if not (ROOT / path).exists())
    assert missing == []
