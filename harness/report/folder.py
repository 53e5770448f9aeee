"""A report folder: where a report may be written, and what rendering again may remove.

A report is drawn into a staging folder beside its destination (`.NAME.staging-PID`)
and moved in only once complete; its `report.json` lists every file it wrote (`files`).
Rendering again removes exactly the files that list names, so nothing else in the
folder (a user's notes, a screenshot) is ever deleted. Some places are never a report
folder, whatever they hold: the current folder or one of its parents, the home folder
or one of its parents, a repository root, and a folder holding the runs being read.

A render killed with SIGKILL leaves its staging folder; the next render into the same
parent removes it (its process is gone) and says so on stderr.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from harness.exits import UsageError
from harness.results import atomic_write_text

MARKER = "report.json"
#: what reports written before `files` existed hold (anything else makes such a folder
#: someone else's): their page, marker, figures, copied traces and flamegraph
LEGACY_PATTERNS = ("index.html", MARKER, "*.png", "*.svg", "traces", "traces/*.json.gz")
_STAGING = re.compile(r"^\.(?P<name>.+)\.staging-(?P<pid>\d+)$")


class ReportFolderError(UsageError, ValueError):
    """An --out that must not be (re)written as a report folder (exit 2)."""


def _inside(path: Path, folder: Path) -> bool:
    """Whether resolved `path` is `folder` or lies under it."""
    return path == folder or folder in path.parents


def never_a_report(out: Path, protect: Iterable[Path] = ()) -> str | None:
    """Why `out` may never be a report folder (`the current folder`, ...), or None.

    `protect` lists folders the report reads (run folders, the results folder): `out`
    may be neither one of them nor a folder that holds one.
    """
    resolved = Path(os.path.abspath(out)).resolve()
    cwd = Path.cwd().resolve()
    home = Path.home().resolve()
    if resolved == cwd:
        return "the current folder"
    if resolved in cwd.parents:
        return "a parent of the current folder"
    if resolved == home or resolved in home.parents:
        return "the home folder" if resolved == home else "a parent of the home folder"
    if resolved == Path(resolved.anchor):
        return "the file-system root"
    if (resolved / ".git").exists():
        return "a repository root"
    for folder in protect:
        folder = Path(os.path.abspath(folder)).resolve()
        if _inside(folder, resolved):
            return f"{'the folder' if folder == resolved else 'a folder holding'} {folder} " \
                   "that this report reads"
    return None


def _manifest(out: Path) -> list[str] | None:
    """The files an earlier report in `out` wrote, relative to `out`; None when `out`
    holds no report.json. ReportFolderError when it holds one that is not ours or is
    corrupt, or when a legacy report (no `files`) holds anything else."""
    marker = out / MARKER
    if not marker.is_file():
        return None
    try:
        document = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportFolderError(
            f"--out {out}: expected an earlier report; got {marker}, which cannot be read as "
            f"one ({err}). Choose another --out, or remove the folder yourself.") from err
    files = document.get("files") if isinstance(document, dict) else None
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        return files
    if not isinstance(document, dict) or "kind" not in document:
        raise ReportFolderError(
            f"--out {out}: expected an earlier report; got {marker} without a report's "
            "fields. Choose another --out, or remove the folder yourself.")
    legacy = []  # written before reports listed their files: only the report's own kinds
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out).as_posix()
        if not any(fnmatch.fnmatchcase(relative, p) for p in LEGACY_PATTERNS):
            raise ReportFolderError(
                f"--out {out}: expected a folder holding only an earlier report; got "
                f"{relative}, which a report does not write. Choose another --out, or move "
                "that file away.")
        if path.is_file():
            legacy.append(relative)
    return legacy


def check_destination(out: Path, protect: Iterable[Path] = ()) -> None:
    """ReportFolderError unless a report may be written to `out` (module docstring)."""
    why = never_a_report(out, protect)
    if why is not None:
        raise ReportFolderError(
            f"--out: expected a folder of its own for the report; got {str(out) or repr('')}, "
            f"{why}, which is never emptied or filled with a report. Name a new folder, "
            "e.g. --out reports/mine")
    if out.exists() and not out.is_dir():
        raise ReportFolderError(f"--out: expected a folder; got {out}, a file")
    if out.is_dir() and _manifest(out) is None and any(out.iterdir()):
        raise ReportFolderError(
            f"--out {out}: expected an empty folder or an earlier report (with {MARKER}); "
            "got a folder holding other files. Choose another --out.")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_orphans(parent: Path) -> list[Path]:
    """Remove staging folders in `parent` left by renders whose process is gone (SIGKILL);
    returns them, each said on stderr."""
    removed = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        match = _STAGING.match(entry.name)
        if match and entry.is_dir() and not _process_alive(int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            print(f"removed {entry}: a report render that was killed before it finished",
                  file=sys.stderr)
            removed.append(entry)
    return removed


def _written_files(stage: Path) -> list[str]:
    return sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*")
                  if p.is_file() and p.name != MARKER)


def _remove_listed(out: Path, files: Iterable[str]) -> None:
    """Remove each listed file of `out` (never a path that leaves it), then the folders
    the removal left empty."""
    root = out.resolve()
    folders = set()
    for name in files:
        path = (out / name)
        if not path.resolve().is_relative_to(root) or path.is_symlink() or not path.is_file():
            continue
        path.unlink()
        folders.update(p for p in path.parents if p != out and out in p.parents)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: something else lives there
            folder.rmdir()


def _move_in(stage: Path, out: Path) -> None:
    """Replace the earlier report in `out` with the staged one: first a marker listing
    both (so a crash in between leaves nothing unlisted), then the old files out and the
    new ones in, the final marker last."""
    out.mkdir(parents=True, exist_ok=True)
    old = _manifest(out) or []
    new = _written_files(stage)
    marker = json.loads((stage / MARKER).read_text())
    atomic_write_text(out / MARKER, json.dumps({"kind": "partial",
                                                "files": sorted({*old, *new})}))
    _remove_listed(out, [f for f in old if f not in new])
    for name in new:
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / name, target)
    atomic_write_text(out / MARKER, json.dumps({**marker, "files": new}, indent=1))


@contextlib.contextmanager
def staged(out: Path, protect: Iterable[Path] = ()) -> Iterator[Path]:
    """Yield a staging folder to draw the report for `out` in; when the body ends
    without an exception, the report replaces the earlier one in `out` (only files an
    earlier report listed are removed). The staging folder is removed on every exit.

    The body must write `report.json` (its kind and facts) into the staging folder.
    """
    out = Path(out)
    check_destination(out, protect)
    parent = Path(os.path.abspath(out)).parent
    remove_orphans(parent)
    parent.mkdir(parents=True, exist_ok=True)
    stage = parent / f".{Path(os.path.abspath(out)).name}.staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        _move_in(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def is_staging(folder: Path) -> bool:
    """Whether `folder` is a render in progress (or an orphan), not a report."""
    return _STAGING.match(Path(folder).name) is not None
