"""The package layout: every module imports, and no import goes the wrong way.

Read from the import statements themselves (ast), so a lazy import inside a function
counts too. The rules:

- `esper` (the system under test) never imports `harness`;
- the core, `harness`, imports neither `esper` nor the review's findings module
  (`esper_review`, a top-level package of its own that plugs in through pyproject.toml
  as a user's module does), and names neither in a string or template, nor a finding
  of the review: it loads only what the project configures;
- `harness.report` imports no findings registry (it renders from a run's files alone),
  and `harness.measure` imports no other part of `harness`;
- no module imports itself back through others (no import cycle anywhere).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import esper
import esper_review
import harness
from tests.review import review_findings

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "esper_review"


def _modules(package) -> list[str]:
    names = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
        if not info.name.endswith("__main__"):  # running it would run the command
            names.append(info.name)
    return names


def _imported_names(path: Path) -> set[str]:
    """Every module named by an import statement in `path` (absolute names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import; use absolute imports")
    return names


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(package_dir: Path) -> list[Path]:
    return sorted(package_dir.rglob("*.py"))


def _offenders(paths, bad) -> dict[str, list[str]]:
    found = {str(p.relative_to(ROOT)): sorted(n for n in _imported_names(p) if bad(n))
             for p in paths}
    return {k: v for k, v in found.items() if v}


def _is(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


@pytest.mark.parametrize("name", _modules(esper) + _modules(harness) + _modules(esper_review))
def test_every_module_imports(name):
    importlib.import_module(name)


def test_esper_never_imports_harness():
    assert _offenders(_sources(ROOT / "esper"), lambda n: _is(n, "harness")) == {}


def test_the_core_imports_neither_esper_nor_the_plugin():
    assert _offenders(_sources(ROOT / "harness"), lambda n: _is(n, "esper") or _is(n, PLUGIN)) == {}


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant (docstrings included) of a Python file, or
    of every line of a template."""
    if path.suffix != ".py":
        return list(enumerate(path.read_text().splitlines(), 1))
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _named_in_strings(folder: Path, names: re.Pattern) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {match.group()}"
            for path in sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".j2"))
            for line, text in _texts(path) for match in [names.search(text)] if match]


def _plugin_names() -> re.Pattern:
    """esper and its review, as words (not the product's name, esper-bench), and the ids
    of the review's findings."""
    ids = "|".join(re.escape(i) for i in review_findings())
    return re.compile(rf"\besper(?:_review)?\b(?!-bench)|(?<![\w-])(?:{ids})(?![\w-])")


def test_the_core_names_neither_esper_nor_the_plugin_nor_its_findings_in_a_string():
    assert _named_in_strings(ROOT / "harness", _plugin_names()) == []


def test_the_string_check_finds_a_planted_name(tmp_path, monkeypatch):
    folder = tmp_path / "core"
    folder.mkdir()
    (folder / "mod.py").write_text('"""Runs B4-CR-03."""\nX = "esper_review.findings"\n'
                                   'Y = "esper-bench is fine"\n')
    (folder / "page.j2").write_text("<p>esper.train</p>\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert _named_in_strings(folder, _plugin_names()) == [
        "core/mod.py:1: B4-CR-03", "core/mod.py:2: esper_review", "core/page.j2:1: esper"]


def test_the_report_renders_from_files_without_a_findings_registry():
    assert _offenders(_sources(ROOT / "harness" / "report"),
                      lambda n: _is(n, "harness.findings") or _is(n, PLUGIN)) == {}


def test_the_plugin_is_a_package_of_its_own_that_the_project_names():
    """Loaded the way a user's module is: by the project's pyproject.toml."""
    assert not (ROOT / "harness" / "review").exists()
    from harness.project import load_project_config
    assert PLUGIN in load_project_config(ROOT).findings_modules


def test_measure_imports_no_other_part_of_harness():
    assert _offenders(_sources(ROOT / "harness" / "measure"),
                      lambda n: _is(n, "harness") and not _is(n, "harness.measure")
                      and n != "harness") == {}


def _graph() -> dict[str, set[str]]:
    """module -> the modules of esper and harness it imports (a name that is a module's
    attribute, `from a.b import c`, points at `a.b`)."""
    paths = _sources(ROOT / "esper") + _sources(ROOT / "harness") + _sources(ROOT / PLUGIN)
    known = {_module_name(p) for p in paths}
    graph = {}
    for path in paths:
        edges = set()
        for name in _imported_names(path):
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                edges.add(name)
        me = _module_name(path)
        graph[me] = edges - {me}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_anywhere():
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_flat_modules_left_behind():
    flat = sorted(p.name for p in (ROOT / "harness").glob("*.py")
                  if p.stem.startswith(("gate_", "report_", "gae_")))
    flat += sorted(p.name for p in (ROOT / "esper").glob("gae*.py"))
    flat += sorted(p.name for p in (ROOT / "esper").glob("env*.py"))
    assert flat == []


def test_esper_top_level_holds_only_its_rooms():
    """esper's parts live in their rooms; at the top only what every room reads, and the command."""
    top = sorted(p.name for p in (ROOT / "esper").glob("*.py"))
    assert top == ["__init__.py", "checks.py", "host_view.py", "train.py", "variants.py"]
    rooms = sorted(p.name for p in (ROOT / "esper").iterdir()
                   if p.is_dir() and (p / "__init__.py").is_file())
    assert rooms == ["agent", "env", "gae", "rollout", "training"]
