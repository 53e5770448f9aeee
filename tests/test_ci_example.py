"""The example GitHub Actions workflow (examples/github-actions/perf-gate.yml) runs what exists.

Its YAML parses; it runs on pull requests, uploads the report and posts a comment; every
`python -m MODULE ...` it runs names a module that exists, whose parser accepts the
options given; the extras and constraints file its install step names exist.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (the dev extra)")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "github-actions" / "perf-gate.yml"
OPERATORS = {"&&", "||", ";", "|", ">", ">>", "<", "&", "(", ")", "{", "}"}


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list[dict]:
    return [step for job in _workflow()["jobs"].values() for step in job["steps"]]


def _commands(script: str) -> list[list[str]]:
    """Each simple command of a `run:` script, as words (GitHub expressions as `X`)."""
    script = re.sub(r"\$\{\{.*?\}\}", "X", script)
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in OPERATORS or token == "\n":
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    return [c for c in commands if c]


def _python_modules() -> list[tuple[str, list[str]]]:
    """(module, arguments) of every `python -m MODULE ...` the workflow runs; a redirect's
    target is cut off with the redirect."""
    found = []
    for step in _steps():
        for line in str(step.get("run", "")).splitlines():
            for words in _commands(line):
                if len(words) > 2 and words[0].endswith("python") and words[1] == "-m":
                    found.append((words[2], words[3:]))
    return found


def test_the_workflow_gates_pull_requests_uploads_the_report_and_comments():
    workflow = _workflow()
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers
    uses = [step.get("uses", "") for step in _steps()]
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    scripts = "\n".join(str(step.get("run", "")) for step in _steps())
    assert "gh pr comment" in scripts and "--markdown" in scripts and "--sources" in scripts
    modules = [m for m, _ in _python_modules()]
    assert {"harness.gate", "harness.run", "harness.report"} <= set(modules)


def _parser(module: str):
    """The argparse parser behind `python -m module` (its `build_parser`, or its cli's)."""
    for name in (module, f"{module}.cli"):
        if importlib.util.find_spec(name) is not None:
            found = importlib.import_module(name)
            if hasattr(found, "build_parser"):
                return found.build_parser()
    raise AssertionError(f"python -m {module}: no build_parser in {module} or {module}.cli")


@pytest.mark.parametrize("module, args", _python_modules(),
                         ids=lambda value: value if isinstance(value, str) else " ".join(value))
def test_each_command_exists_and_accepts_its_options(module, args):
    if module == "venv":
        return
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        assert importlib.util.find_spec(f"{module}.__main__") is not None, module
    _parser(module).parse_args(args)  # argparse exits 2 on an unknown or malformed option


def test_the_install_step_names_extras_and_files_that_exist():
    install = next(str(s["run"]) for s in _steps() if "pip install" in str(s.get("run", "")))
    extras = re.findall(r'-e "\.\[([\w,-]+)\]"', install)
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras and all(e in declared for e in extras[0].split(","))
    for constraint in re.findall(r"-c (\S+)", install):
        assert (ROOT / constraint).is_file(), constraint
