"""Your project's settings: the `[tool.esper-bench]` table of its `pyproject.toml`.

    [tool.esper-bench]
    findings-modules = ["bench.findings"]   # as --findings-module of harness.run and harness.gate
    baseline = "bench/counters.json"        # the gate's counters baseline (default of --baseline)
    invariants = "bench/invariants.json"    # the gate's invariants config (default of --config)

The file read is the first `pyproject.toml` found in the current folder or one of its
parents (as pytest and ruff look for theirs); paths in it are relative to its folder.
Every key is optional; a file without the table, or no file, means no settings. A table
that is malformed (an unknown key, a value of the wrong type) is an input error naming
the file, the key, what was expected and what was received.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import findings as registry
from harness.exits import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

TABLE = "tool.esper-bench"
#: a module name as `import` takes it: dotted identifiers
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class ProjectConfig:
    """The settings of one `pyproject.toml` (or none)."""

    path: Path | None = None
    """The file read; None when no `pyproject.toml` was found."""
    findings_modules: tuple[str, ...] = ()
    """Modules imported for their `harness.findings.register` calls."""
    baseline: Path | None = None
    """The gate's counters baseline (absolute)."""
    invariants: Path | None = None
    """The gate's invariants config (absolute)."""


def find_pyproject(start: Path) -> Path | None:
    """The first `pyproject.toml` in `start` or its parents, or None."""
    start = start.resolve()
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _bad(path: Path, key: str, expected: str, received: object) -> UsageError:
    return UsageError(f"{path}: [{TABLE}] {key}: expected {expected}; got {received!r}")


def _path(path: Path, table: dict, key: str) -> Path | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _bad(path, key, "a path (a non-empty string, relative to the file's folder)", value)
    return (path.parent / value).resolve()


def parse(path: Path, document: dict) -> ProjectConfig:
    """The settings in `document`, the parsed `path`; UsageError on a malformed table."""
    tool = document.get("tool", {})
    table = tool.get("esper-bench") if isinstance(tool, dict) else None
    if table is None:
        return ProjectConfig(path=path)
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [{TABLE}]: expected a table; got {table!r}")
    known = ("findings-modules", "baseline", "invariants")
    unknown = [k for k in table if k not in known]
    if unknown:
        raise _bad(path, unknown[0], f"one of the keys {', '.join(known)}", unknown[0])
    modules = table.get("findings-modules", [])
    if (not isinstance(modules, list)
            or not all(isinstance(m, str) and MODULE_NAME.fullmatch(m) for m in modules)):
        raise _bad(path, "findings-modules",
                   'a list of module names, e.g. ["bench.findings"]', modules)
    return ProjectConfig(path=path, findings_modules=tuple(dict.fromkeys(modules)),
                         baseline=_path(path, table, "baseline"),
                         invariants=_path(path, table, "invariants"))


def load_project_config(start: Path | None = None) -> ProjectConfig:
    """The settings of the `pyproject.toml` nearest to `start` (default: the current folder)."""
    path = find_pyproject(Path.cwd() if start is None else start)
    if path is None:
        return ProjectConfig()
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"{path}: expected a readable TOML file; got "
                         f"{type(err).__name__}: {err}") from err
    return parse(path, document)


def load_findings(named: Sequence[str] | None, required: bool = True,
                  with_project: bool = True) -> tuple[ProjectConfig, tuple[str, ...]]:
    """The project's settings and its findings modules, imported: those the nearest
    pyproject.toml names (unless not `with_project`: a resumed run's recorded list), then
    `named` (`--findings-module`, repeatable).

    Every module must import and register at least one finding; else UsageError naming
    the module and where it was named (the pyproject.toml file, or --findings-module).
    With `required`, no module at all is a UsageError saying how to name one.
    """
    project = load_project_config()
    from_file = project.findings_modules if with_project else ()
    modules = tuple(dict.fromkeys([*from_file, *(named or [])]))
    for module in modules:
        where = (f"{project.path}: [{TABLE}] findings-modules" if module in from_file
                 else "--findings-module")
        try:
            added = registry.load_findings_module(module)
        except registry.FindingsModuleError as err:
            raise UsageError(str(err).replace("--findings-module", where, 1)) from err
        if not added:
            raise UsageError(f"{where}: {module}: expected a module that registers findings "
                             "(harness.register calls at its top level); it registered none")
    if required and not modules:
        found = (f"{project.path} names none" if project.path is not None
                 else f"no pyproject.toml in {Path.cwd()} or its parents")
        raise UsageError(f"--findings-module: expected a findings module to measure "
                         f"(--findings-module PKG.MODULE, or findings-modules = "
                         f"[\"PKG.MODULE\"] in [{TABLE}] of pyproject.toml); got none ({found})")
    return project, modules
