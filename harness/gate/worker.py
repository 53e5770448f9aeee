"""One session of the gate's paired A/B check: two trees timed side by side in one process.

`harness.gate.ab` runs this file's source with `python -c` from a neutral working
directory. The trees are two revisions of the repository holding the findings modules
(`WorkerConfig.findings_modules`): from each, the findings modules and every top-level
module of its import folders (`WorkerConfig.paths`) are imported in turn, while `harness`
is the installed one, shared; each tree's modules are kept apart (`TreeModules`):
whenever tree X's code runs, `sys.modules` and `sys.path` hold X's modules and only those.
Per finding x quick case x variant, it then times the two trees' calls in alternation,
round after round (A B, B A, A B, ...), so
that both sides see the same machine at the same moment, the same process, the same
torch and the same allocator: the ratio of neighbouring samples cancels the drifts of a
shared machine that separate processes cannot.

From each tree only the long-stable parts of the findings API are used (`select`,
`cases`, `build`, `make_call`, `skip`, `variants`; `peers` where the tree has it).
A finding whose `cases` raises on a tree is an error of each of its variants there.

Input: one JSON argument (see `WorkerConfig`). The worker dies with the gate that
started it, even one killed outright (`harness.exits.die_with_parent`). Output: one JSON object on stdout,
`{"modules": [...], "cells": [...]}` (`modules`: per tree, its findings module files, or
the error importing one raised), a cell per finding x case x variant with `samples`, one
list per tree (seconds per call; entry i of each list
comes from round i), or `errors`, one entry per tree (null where that tree ran), or
`absent`, one flag per tree (true where the tree has no such cell).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import pkgutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: the harness measuring both trees is the installed one
SHARED_PACKAGES = ("harness",)


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker process measures."""

    trees: tuple[str, ...]
    """Roots of the trees under test (two for the gate); each one's code comes from it."""
    findings: tuple[str, ...]
    """Finding ids whose quick cases are timed."""
    min_rounds: int
    """Rounds (one sample of every tree) per variant and case, at least."""
    variant_budget_s: float
    """Seconds of sampling per variant and case, after `min_rounds` are taken."""
    min_sample_time: float
    """Seconds one sample should last at least; calls per sample are doubled until it does."""
    threads: int
    """`torch.set_num_threads` for the whole process."""
    seed: int = 0
    """Input seed passed to each finding's `build`."""
    parent: int | None = None
    """Pid of the gate that started this worker: the worker exits once it is gone."""
    findings_modules: tuple[str, ...] = ()
    """The findings modules, imported from each tree for their `register` calls."""
    paths: tuple[str, ...] = (".",)
    """Folders of each tree (relative to its root) put first on `sys.path` while its code
    runs."""


def tree_packages(trees: list[Path], config: WorkerConfig) -> tuple[str, ...]:
    """The top-level packages imported from each tree: every top-level module found in the
    trees' import folders, and the findings modules' packages; not the harness, which is
    the installed one, shared."""
    names = {name.split(".", 1)[0] for name in config.findings_modules}
    for tree in trees:
        for path in config.paths:
            names.update(info.name for info in pkgutil.iter_modules([str(tree / path)]))
    return tuple(sorted(names - set(SHARED_PACKAGES)))


class TreeModules:
    """The modules of `packages` imported from one tree, swapped into `sys.modules` on demand."""

    def __init__(self, tree: Path, packages: tuple[str, ...],
                 paths: tuple[str, ...] = (".",)) -> None:
        self.tree = tree
        self.packages = packages
        self.paths = [str((tree / path).resolve()) for path in paths]
        self.modules: dict[str, object] = {}

    def _from_tree(self, name: str) -> bool:
        return name.split(".", 1)[0] in self.packages

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """While inside, imports of the tree's packages (eager or lazy) resolve to this tree."""
        for name in [n for n in sys.modules if self._from_tree(n)]:
            del sys.modules[name]
        sys.modules.update(self.modules)
        sys.path[:0] = self.paths
        try:
            yield
        finally:
            for path in self.paths:
                sys.path.remove(path)
            self.modules = {n: sys.modules.pop(n) for n in list(sys.modules) if self._from_tree(n)}

    def _check_from_tree(self, module) -> None:
        where = Path(module.__file__).resolve()
        if self.tree not in where.parents:
            raise RuntimeError(
                f"{module.__name__} did not come from the revision under test: {self.tree} "
                f"has no {module.__name__.replace('.', '/')}, so {where} was imported "
                "instead (an editable install's import hook, say)")

    def _provides(self, name: str) -> bool:
        """Whether this tree holds the module `name` (call inside `active`): an editable
        install's import hook would otherwise find another copy of it."""
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a parent package that is not in this tree
            return False
        origin = getattr(spec, "origin", None)
        return origin is not None and self.tree in Path(origin).resolve().parents

    def load_findings(self, names: tuple[str, ...]) -> tuple[dict[str, object], list[str]]:
        """The findings modules `names` imported from this tree: the findings they
        registered (id -> Finding), taken back out of the shared registry so that the
        other tree can register its own, and per module its file, or why this tree has
        none (a revision older than the module: its cells are absent there). RuntimeError
        when a module the findings import came from somewhere else."""
        registry = importlib.import_module("harness.findings")  # shared: not of a tree
        before = set(registry.FINDINGS)
        sources = []
        with self.active():
            for name in names:
                if not self._provides(name):
                    sources.append(f"{name}: not in this revision ({self.tree} has no "
                                   f"{name.replace('.', '/')})")
                    continue
                try:
                    module = importlib.import_module(name)
                except Exception as err:  # this tree cannot provide these findings
                    sources.append(f"{name}: {_error(err)}")
                    continue
                sources.append(str(Path(module.__file__).resolve()))
        added = [i for i in registry.FINDINGS if i not in before]
        found = {i: registry.FINDINGS.pop(i) for i in added}
        for finding_id in added:
            registry.ORIGINS.pop(finding_id, None)
        for module in self.modules.values():
            if getattr(module, "__file__", None):
                self._check_from_tree(module)
        return found, sources


def _sample(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of `number` back-to-back calls of `fn`."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _calls_per_sample(fn: Callable[[], object], min_sample_time: float) -> int:
    """Double the number of back-to-back calls from 1 until they take `min_sample_time`."""
    number = 1
    while _sample(fn, number) * number < min_sample_time and number < 1 << 16:
        number *= 2
    return number


def time_paired(calls: list[tuple[TreeModules, Callable[[], object]]],
                config: WorkerConfig) -> list[list[float]]:
    """Seconds per call of each tree's `fn`, sampled in rounds that alternate the order.

    Round i takes one sample of every tree, in order on even rounds and reversed on odd
    ones (A B, B A, ...), so a drift within a round falls on both sides equally often.
    Every tree's sample makes the same number of calls (the most any tree needs).
    """
    number = 1
    for modules, fn in calls:
        with modules.active():
            fn()  # first call: lazy initialisation and compilation stay out of the samples
            number = max(number, _calls_per_sample(fn, config.min_sample_time))
    samples: list[list[float]] = [[] for _ in calls]
    started = time.perf_counter()
    rounds = 0
    while rounds < config.min_rounds or time.perf_counter() - started < config.variant_budget_s:
        order = range(len(calls)) if rounds % 2 == 0 else reversed(range(len(calls)))
        for index in order:
            modules, fn = calls[index]
            with modules.active():
                samples[index].append(_sample(fn, number))
        rounds += 1
    return samples


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _tree_cells(modules: TreeModules, select: Callable[[list[str]], list], config: WorkerConfig,
                device) -> dict:
    """{(finding, case, variant): a zero-argument call, or the error building it raised};
    `select(ids)` gives the tree's findings (called with the tree's modules active)."""
    cells: dict[tuple[str, str, str], object] = {}
    with modules.active():
        for finding in select(list(config.findings)):
            # peers (other libraries' code) are comparators, not ours to gate; getattr:
            # a tree older than the `peers` field has none
            peers = getattr(finding, "peers", ())
            try:
                cases = finding.cases(True)
            except Exception as err:  # this tree cannot list the cases: one error row
                cells.update({(finding.id, "cases()", v): err
                              for v in finding.variants if v not in peers})
                continue
            for case in cases:
                variants = [v for v in finding.variants
                            if v not in peers and finding.skip(v, case, device) is None]
                try:
                    inputs = finding.build(case, device, config.seed)
                except Exception as err:  # this tree cannot run this case: rows, not a crash
                    cells.update({(finding.id, case.label, v): err for v in variants})
                    continue
                for variant in variants:
                    try:
                        cells[finding.id, case.label, variant] = finding.make_call(variant, inputs)
                    except Exception as err:  # this variant fails on this tree: a row
                        cells[finding.id, case.label, variant] = err
    return cells


def measure_trees(config: WorkerConfig) -> dict:
    """Cells of paired samples for every quick case and variant of `config.findings`."""
    import torch

    torch.set_num_threads(config.threads)
    device = torch.device("cpu")
    roots = [Path(tree).resolve() for tree in config.trees]
    packages = tree_packages(roots, config)
    trees = [TreeModules(root, packages, config.paths) for root in roots]
    loaded = [modules.load_findings(config.findings_modules) for modules in trees]
    selects = [lambda ids, found=found: [found[i] for i in ids if i in found]
               for found, _ in loaded]
    sources = {"modules": [files for _, files in loaded]}
    per_tree = [_tree_cells(modules, select, config, device)
                for modules, select in zip(trees, selects)]
    keys = list(dict.fromkeys(key for cells in per_tree for key in cells))
    out = []
    for key in keys:
        finding, case, variant = key
        base = {"finding": finding, "case": case, "variant": variant}
        absent = [key not in cells for cells in per_tree]
        if any(absent):  # a cell one tree does not have: nothing to compare
            out.append({**base, "absent": absent})
            continue
        calls = [cells[key] for cells in per_tree]
        errors = [_error(c) if isinstance(c, BaseException) else None for c in calls]
        if not any(errors):
            try:
                out.append({**base, "samples": time_paired(list(zip(trees, calls)), config)})
                continue
            except Exception as err:  # find out which tree raised: call each alone
                errors = [_first_call_error(modules, fn) for modules, fn in zip(trees, calls)]
                if not any(errors):  # it did not raise again: blame the pair
                    errors = [_error(err)] * len(calls)
        out.append({**base, "errors": errors})
    return {**sources, "cells": out}


def _first_call_error(modules: TreeModules, fn: Callable[[], object]) -> str | None:
    try:
        with modules.active():
            fn()
    except Exception as err:  # recorded as that tree's error for this cell
        return _error(err)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: worker.py CONFIG_JSON", file=sys.stderr)
        return 2
    raw = json.loads(argv[0])
    from harness.exits import die_with_parent  # the installed harness, as every tree shares it

    die_with_parent(raw.get("parent"), "the gate")
    from harness.isa_checks import check_isas_lazily

    check_isas_lazily()
    for name in ("trees", "findings", "findings_modules", "paths"):
        if name in raw:
            raw[name] = tuple(raw[name])
    # nothing may come from the working directory: each tree is put on sys.path in turn
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    print(json.dumps(measure_trees(WorkerConfig(**raw))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
