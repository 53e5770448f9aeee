"""Where counted events come from: the lines of the project's own code behind each counter.

`attribute_call(fn, files)` runs `fn` once under torch.profiler, as
`harness.measure.counters.profile_call` does (memory profiling on), and splits its op
calls, host syncs, allocations, allocated bytes and kernel launches by *site*: the line of
the project's own code (`ProjectFiles`) that made the torch call they happened in, and the
top-level aten op of that call. `diff_sources` says what changed between two such
attributions of one cell (two commits, two variants), and `explain` words a counter change
with them: `host syncs 0 -> 4: +4 aten::item at mylib/buffer.py:212 in add()`.

How the line is found: a `TorchFunctionMode` sees every top-level torch call made from
Python (a function such as `torch.stack`, a method such as `.item()`, an operator such as
`x + 1`, `bool(t)`, `t[i] = v`) with its Python frame, walks out to the innermost frame of
a project file and wraps the call in a `record_function` range naming that site; every
event the profiler records inside the range is the site's. The profiler's own Python
stacks (`with_stack=True`) were not used: they name the function (its `def` line) but
not the line for ops reached through operators and `bool()`, which never show up there as
calls. The ranges are not aten ops and allocate nothing, so the totals equal
`profile_call`'s counts of the same call (`Sources.totals`; tests check it). This pass is
slower than a plain profile (a Python call per torch call): run it only where a counter
changed.
"""

from __future__ import annotations

import collections
import sys
import sysconfig
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch._C._profiler import _EventType
from torch.overrides import TorchFunctionMode

from harness.measure.counters import (
    CLOSING_SYNC, CUDA_SYNC_CALLS, HOST_SYNC_OPS, KERNEL_LAUNCH_CALLS, collector_paused, profiling,
)

#: counters that `attribute_call` splits by site, and how the messages name them
COUNTER_LABELS = {"op_calls": "op calls", "host_syncs": "host syncs",
                  "allocations": "allocations", "allocated_bytes": "allocated bytes",
                  "kernel_launches": "kernel launches"}
#: prefix of the record_function ranges that mark a site (never an aten op name)
_RANGE_PREFIX = "esper-bench-site#"


def installation_folders() -> tuple[Path, ...]:
    """The Python installation's folders (standard library, site-packages, and a virtual
    environment as a whole, which may sit inside a project): never the project's code."""
    places = [sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    if sys.prefix != sys.base_prefix:
        places.append(sys.prefix)
    return tuple(dict.fromkeys(Path(p).resolve() for p in places if p))


@dataclass(frozen=True)
class ProjectFiles:
    """Which source files are the project's own: those under `root` that are not under an
    `excluded` folder or the Python installation, plus the `included` files wherever
    they are (say, the findings module that calls the code under test)."""

    root: Path
    excluded: tuple[Path, ...] = ()
    included: tuple[Path, ...] = ()
    _owned: dict = field(default_factory=dict, compare=False, repr=False)
    """filename -> project-relative path or None: a cache, one lookup per file."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).resolve())
        object.__setattr__(self, "excluded", tuple(Path(p).resolve() for p in
                                                   (*self.excluded, *installation_folders())))
        object.__setattr__(self, "included", tuple(Path(p).resolve() for p in self.included))

    def relative(self, filename: str) -> str | None:
        """`filename` relative to the root (posix) if it is the project's, else None."""
        if filename not in self._owned:
            self._owned[filename] = self._classify(filename)
        return self._owned[filename]

    def _classify(self, filename: str) -> str | None:
        if filename.startswith("<"):  # <string>, <frozen importlib>: no file to point at
            return None
        path = Path(filename).resolve()
        if path in self.included:
            return _shown(path, self.root)
        if self.root not in path.parents:
            return None
        if any(path == place or place in path.parents for place in self.excluded):
            return None
        return path.relative_to(self.root).as_posix()


def _shown(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if root in path.parents else str(path)


@dataclass(frozen=True)
class Site:
    """A line of the project's code that called into torch."""

    file: str
    """Relative to the project root, posix (`mylib/buffer.py`)."""
    line: int
    function: str

    def text(self) -> str:
        """'mylib/buffer.py:212 in add()'."""
        return f"{self.file}:{self.line} in {self.function}()"


@dataclass(frozen=True)
class SourceCount:
    """How much of one counter one site's calls of one op did."""

    counter: str
    """A key of COUNTER_LABELS."""
    op: str
    """The top-level aten op of the torch call (`aten::item`), or the torch function's
    name where the call ran no aten op (an allocation made outside one)."""
    site: Site | None
    """None: the event ran outside any torch call made from the project's files."""
    count: int
    """Events (op calls, syncs, allocations, launches) or, for allocated bytes, bytes."""


@dataclass(frozen=True)
class Sources:
    """One call's counters split by site and op (`attribute_call`)."""

    entries: tuple[SourceCount, ...]

    def totals(self) -> dict[str, int]:
        """Counter -> total: what `profile_call` counts for the same call."""
        out = dict.fromkeys(COUNTER_LABELS, 0)
        for entry in self.entries:
            out[entry.counter] += entry.count
        return out

    def of(self, counter: str) -> list[SourceCount]:
        """The entries of one counter, largest first."""
        return sorted((e for e in self.entries if e.counter == counter), key=lambda e: -e.count)

    def as_json(self) -> list[dict]:
        """JSON-ready entries (a cell journal, a bisect probe's output)."""
        return [{**asdict(e), "site": asdict(e.site) if e.site else None} for e in self.entries]

    def as_rows(self, counters: Iterable[str] = COUNTER_LABELS) -> list[list]:
        """The entries of `counters` as compact rows, `[counter, op, file, line, function,
        count]` (file, line and function None outside the project's files), sorted: what a
        counters baseline stores, one short line per row."""
        order = {name: index for index, name in enumerate(counters)}
        rows = [[e.counter, e.op, *((e.site.file, e.site.line, e.site.function) if e.site
                                    else (None, None, None)), e.count]
                for e in self.entries if e.counter in order]
        # in a fixed order (counter, file, line, op), so that a file of them changes by line
        return sorted(rows, key=lambda r: (order[r[0]], r[2] or "", r[3] or 0, r[1]))

    @classmethod
    def from_rows(cls, rows: Iterable[object]) -> "Sources":
        """The inverse of `as_rows`; ValueError naming the row when one is malformed."""
        out = []
        for index, row in enumerate(rows):
            shape_ok = isinstance(row, list) and len(row) == 6
            if shape_ok:
                counter, op, file, line, function, count = row
                site_ok = (file is None and line is None and function is None) or (
                    isinstance(file, str) and type(line) is int and isinstance(function, str))
                shape_ok = (counter in COUNTER_LABELS and isinstance(op, str) and site_ok
                            and type(count) is int and count >= 0)
            if not shape_ok:
                raise ValueError(f"sources[{index}]: expected [counter, op, file, line, "
                                 f"function, count]; got {row!r}")
            out.append(SourceCount(counter, op, Site(file, line, function) if file else None,
                                   count))
        return cls(tuple(out))

    @classmethod
    def from_json(cls, entries: Iterable[dict]) -> "Sources":
        """The inverse of `as_json`; ValueError naming the entry when one is malformed."""
        out = []
        for index, raw in enumerate(entries):
            try:
                site = Site(**raw["site"]) if raw.get("site") else None
                out.append(SourceCount(str(raw["counter"]), str(raw["op"]), site,
                                       int(raw["count"])))
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"sources[{index}]: expected counter, op, site and count; "
                                 f"got {raw!r}") from err
        return cls(tuple(out))


class _SiteMarker(TorchFunctionMode):
    """Wraps each top-level torch call made from Python in a range naming its site."""

    def __init__(self, files: ProjectFiles) -> None:
        super().__init__()
        self.files = files
        self.sites: list[tuple[Site | None, str]] = []
        self._index: dict[tuple[Site | None, str], int] = {}

    def _site(self) -> Site | None:
        frame = sys._getframe(2)  # skip this method and __torch_function__
        while frame is not None:
            shown = self.files.relative(frame.f_code.co_filename)
            if shown is not None:
                return Site(shown, frame.f_lineno, frame.f_code.co_name)
            frame = frame.f_back
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if torch.compiler.is_compiling():  # traced into a compiled graph: leave it as it is
            return func(*args, **(kwargs or {}))
        key = (self._site(), getattr(func, "__qualname__", None) or repr(func))
        index = self._index.setdefault(key, len(self.sites))
        if index == len(self.sites):
            self.sites.append(key)
        with torch.profiler.record_function(f"{_RANGE_PREFIX}{index}"):
            return func(*args, **(kwargs or {}))


def _counted(name: str, on_cuda: bool) -> str | None:
    """The counter a non-memory event adds to besides op calls (host syncs, launches)."""
    if on_cuda:
        if name in CUDA_SYNC_CALLS:
            return "host_syncs"
        if name in KERNEL_LAUNCH_CALLS:
            return "kernel_launches"
        return None
    return "host_syncs" if name in HOST_SYNC_OPS else None


def _tally(roots, sites: Sequence[tuple[Site | None, str]], on_cuda: bool) -> Sources:
    """Walk the profiler's event tree: every counted event, by (counter, op, site).

    An event's op is the top-level aten op it ran in; an allocation made in a site's
    range outside any aten op (a Python scalar wrapped into a tensor before the op runs)
    is the range's first top-level aten op's, or the torch function's where it ran none.
    """
    counts: collections.Counter = collections.Counter()
    first_op: dict[int, tuple[int, str]] = {}  # range index -> (start ns, top-level aten op)
    # (node, site index or None, top-level aten op name or None)
    stack = [(node, None, None) for node in roots]
    closing_dropped = not on_cuda
    while stack:
        node, index, top = stack.pop()
        kind, name = node.typed[0], node.name
        if kind == _EventType.TorchOp and name.startswith(_RANGE_PREFIX):
            index, top = int(name[len(_RANGE_PREFIX):]), None
        elif kind == _EventType.Allocation:
            size = node.typed[1].alloc_size
            if size > 0:  # frees are recorded as negative sizes
                counts["allocations", top, index] += 1
                counts["allocated_bytes", top, index] += size
        else:
            if kind == _EventType.TorchOp and name.startswith("aten::") and top is None:
                top = name
                if index is not None and node.start_time_ns < first_op.get(index, (1 << 63,))[0]:
                    first_op[index] = (node.start_time_ns, name)
            if kind == _EventType.TorchOp and name.startswith("aten::"):
                counts["op_calls", top, index] += 1
            counter = _counted(name, on_cuda)
            if counter == "host_syncs" and name == CLOSING_SYNC and index is None \
                    and not closing_dropped:
                closing_dropped = True  # attribute_call's own sync that closes the window
            elif counter is not None:
                counts[counter, top or name, index] += 1
        stack.extend((child, index, top) for child in node.children)
    merged: collections.Counter = collections.Counter()
    for (counter, op, index), n in counts.items():
        if op is None:
            op = (first_op[index][1] if index in first_op
                  else sites[index][1] if index is not None else "(no torch call)")
        merged[counter, op, None if index is None else sites[index][0]] += n
    return Sources(tuple(SourceCount(c, op, site, n) for (c, op, site), n in merged.items() if n))


def attribute_call(fn: Callable[[], object], files: ProjectFiles,
                   device: torch.device | str = "cpu") -> Sources:
    """Run `fn` once under torch.profiler and split what it did by site (module docstring).

    `fn` is called twice: a warm-up call (with the sites marked: code under
    `torch.compile` compiles again for the mode) and the profiled one. On CUDA the window
    is closed by synchronizing `device`, as `profile_call` does, and that sync is not
    counted.
    """
    device = torch.device(device)
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)  # host sync: keep earlier work out of the window
    marker = _SiteMarker(files)
    with marker:  # warm-up: torch.compile'd code compiles again under the mode, outside
        fn()
    with profiling(device, profile_memory=True) as prof:
        with marker:
            fn()
        if on_cuda:
            torch.cuda.synchronize(device)  # host sync: the window ends when the device is done
    with collector_paused():
        roots = list(prof.profiler.kineto_results.experimental_event_tree())
        return _tally(roots, marker.sites, on_cuda)


# ------------------------------------------------------------------------------ differences

@dataclass(frozen=True)
class SourceChange:
    """How much one op at one place changed one counter between two attributions.

    Sites are matched by file, function and op, not line, so that lines moved by an edit
    above them do not read as changes; `lines` are where the op is called now (or was,
    for one that disappeared)."""

    counter: str
    op: str
    file: str | None
    function: str | None
    lines: tuple[int, ...]
    delta: int

    def text(self) -> str:
        """'+4 aten::item at mylib/buffer.py:212 in add()'."""
        if self.file is None:
            return f"{self.delta:+d} {self.op} outside the project's files"
        lines = ",".join(str(n) for n in self.lines)
        return f"{self.delta:+d} {self.op} at {self.file}:{lines} in {self.function}()"


def _grouped(sources: Sources, counter: str) -> dict[tuple, tuple[int, set[int]]]:
    out: dict[tuple, tuple[int, set[int]]] = {}
    for e in sources.of(counter):
        key = (e.op, e.site.file if e.site else None, e.site.function if e.site else None)
        count, lines = out.get(key, (0, set()))
        out[key] = (count + e.count, lines | ({e.site.line} if e.site else set()))
    return out


def diff_sources(before: Sources, after: Sources, counter: str) -> list[SourceChange]:
    """What changed `counter` from `before` to `after`, by op and place, largest first."""
    old, new = _grouped(before, counter), _grouped(after, counter)
    changes = []
    for key in dict.fromkeys([*new, *old]):
        (a, lines_a), (b, lines_b) = old.get(key, (0, set())), new.get(key, (0, set()))
        if a != b:
            changes.append(SourceChange(counter, key[0], key[1], key[2],
                                        tuple(sorted(lines_b or lines_a)), b - a))
    return sorted(changes, key=lambda c: (-abs(c.delta), c.file or "~", c.op))


def current_sources(after: Sources, counter: str) -> list[SourceChange]:
    """Every source of `counter` in `after`, as changes from nothing (where the before
    side is a count without sources: a baseline file)."""
    return diff_sources(Sources(()), after, counter)


def explain(counter: str, before: int, after: int, changes: Sequence[SourceChange],
            *, limit: int = 3, complete: bool = True) -> str:
    """'host syncs 0 -> 4: +4 aten::item at mylib/buffer.py:212 in add()'.

    `changes` (from `diff_sources`) are listed up to `limit`, then how many more; with
    `complete=False` they are the current sources only (the old ones are unknown), listed
    after 'now'.
    """
    head = f"{COUNTER_LABELS.get(counter, counter)} {before:,} -> {after:,}"
    if not changes:
        return head
    shown = [c.text() if complete else c.text().lstrip("+") for c in changes[:limit]]
    more = f" and {len(changes) - limit} more" if len(changes) > limit else ""
    return f"{head}: {'' if complete else 'now '}{', '.join(shown)}{more}"
