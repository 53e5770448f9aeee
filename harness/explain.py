"""A counter change explained: which ops appeared or disappeared, and the project's lines.

When a cell's counters changed (against a baseline file, another commit, another run),
the cell is profiled once more with its counted events split by site
(`harness.measure.sources.attribute_call`), and each changed counter becomes a sentence:
`host syncs 0 -> 4: +4 aten::item at mylib/buffer.py:212 in add()`.

The project's own files are those of the git repository (else the folder) holding the
module that defines the finding's calls; the harness's own package and the Python
installation are not, except that module itself (a finding that lives in the harness's
package), so every line named is one the user can edit.

Only the public findings API is used (`Finding.build`, `make_call`, `cases`), so this
works on any findings module.
"""

from __future__ import annotations

import inspect
import subprocess
from collections.abc import Mapping
from pathlib import Path

import torch

import harness
from harness.measure.sources import (
    COUNTER_LABELS, ProjectFiles, Sources, attribute_call, current_sources, diff_sources, explain,
)
from harness.measure.timing import pinned_threads

#: every counter a message may name, in the order messages list them (the ones a reviewer
#: acts on first; op calls, which every other change moves too, last)
MESSAGE_ORDER = ("host_syncs", "allocations", "allocated_bytes", "peak_bytes", "kernel_launches",
                 "op_calls")
_OTHER_LABELS = {"peak_bytes": "peak bytes"}
#: torch threads while a cell is attributed: the gate's counting conditions
THREADS = 1


def _defining_file(fn: object) -> Path | None:
    try:
        name = inspect.getsourcefile(fn)  # type: ignore[arg-type]
    except TypeError:  # a builtin or a C function: no source file
        return None
    return Path(name).resolve() if name else None


def repository_root(path: Path) -> Path:
    """The git repository holding `path` (a file or folder), else its folder."""
    folder = path if path.is_dir() else path.parent
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no git here: the folder is the project
        return folder.resolve()
    return Path(done.stdout.strip()).resolve() if done.returncode == 0 else folder.resolve()


def project_files(finding) -> ProjectFiles:
    """The files whose lines a message about `finding` may name (module docstring)."""
    files = [f for f in (_defining_file(finding.make_call), _defining_file(finding.build)) if f]
    if not files:
        raise ValueError(f"Finding {finding.id!r}: make_call: expected a Python function with a "
                         f"source file; got {finding.make_call!r}")
    return ProjectFiles(repository_root(files[0]), excluded=(Path(harness.__file__).parent,),
                        included=tuple(files))


def cell_sources(finding, case, variant: str, *, seed: int = 0,
                 device: torch.device | str = "cpu") -> Sources:
    """One call of `variant` at `case`, its counters split by site (the gate's conditions:
    one torch thread, inputs from `seed`)."""
    device = torch.device(device)
    with pinned_threads(THREADS):
        inputs = finding.build(case, device, seed)
        return attribute_call(finding.make_call(variant, inputs), project_files(finding), device)


def variant_sources(finding, inputs, variants, device: torch.device | str = "cpu"
                    ) -> dict[str, list[dict] | str]:
    """For a run's journal (`harness.run --sources`): per variant, its counters split by
    site (`Sources.as_json`), or the error attributing it raised, on `inputs` as built."""
    try:
        files = project_files(finding)
    except ValueError as err:  # calls without a source file: nothing to point at
        return {variant: str(err) for variant in variants}
    out: dict[str, list[dict] | str] = {}
    for variant in variants:
        try:
            out[variant] = attribute_call(finding.make_call(variant, inputs), files,
                                          device).as_json()
        except Exception as err:  # recorded beside the cell; its counters still stand
            out[variant] = f"{type(err).__name__}: {err}"
    return out


def _label(counter: str) -> str:
    return COUNTER_LABELS.get(counter) or _OTHER_LABELS.get(counter, counter)


def changed(before: Mapping[str, int | None], after: Mapping[str, int | None]) -> list[str]:
    """The counters (MESSAGE_ORDER) whose values differ, where both sides have one."""
    return [c for c in MESSAGE_ORDER if before.get(c) is not None and after.get(c) is not None
            and before[c] != after[c]]


def between(before: Mapping[str, int], after: Mapping[str, int], old: Sources | None,
            new: Sources) -> str:
    """Each changed counter from `before` to `after`, with the ops and lines that differ
    between the two attributions `old` and `new` (`+1 aten::clone at mod.py:42 in f()`).
    Where the before side has counts only (`old` None), `new`'s sources of the counter are
    listed instead: as added ones where it was 0, else as where it comes from now."""
    parts = []
    for counter in changed(before, after):
        b, a = int(before[counter]), int(after[counter])
        if counter not in COUNTER_LABELS:
            parts.append(f"{_label(counter)} {b:,} -> {a:,}")
        elif old is None:
            parts.append(explain(counter, b, a, current_sources(new, counter), complete=b == 0))
        else:
            parts.append(explain(counter, b, a, diff_sources(old, new, counter)))
    return "; ".join(parts)
