"""Every boundary fuzzed: generated options, corrupted files, failing writes.

What it generates, and what must hold for every case (a failure is a traceback, an exit
other than 0 or 2, a message that does not name the option or the file, or a file
changed that the command had no business changing):

- options: for every value-taking option of every harness command, values that are
  empty, negative, zero, huge, inf, nan, unicode, a path that is a file, a read-only
  folder, a path under /proc, a path with spaces; each run in-process (`main(argv)`), with the other options
  chosen so that the command stops right after checking its input; and paths too long
  for the file system (a 300-byte name, a 4.2k path) for every path option;
- files: a run's run.json and a journaled cell, truncated at every length class, empty,
  binary, a folder, each top-level field (the CPU kernel path's included) and each
  summary-row field replaced by a value of every other JSON type or removed, and a future
  schema version; read by `harness.report`, they must end in exit 2 naming the file, and
  for a row its field (or render, when the change is harmless);
- writes (integration): the k-th atomic write of a run fails with a full disk or a
  permission error; the run must stop with exit 2 naming the file, keep every cell it
  journaled, and `--resume` must complete it.

Signals at random moments (SIGINT, SIGTERM, SIGKILL, SIGPIPE and a reader that closes the
pipe, and SIGINT across a whole `python -m harness.run`) are
`tests/harness/test_run_persistence.py`'s fault injection; a second writer of a folder is
`tests/harness/test_lock.py`'s.
"""

from __future__ import annotations

import copy
import errno
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness import results
from harness.measure.machine import kernel_path
from harness.bisect import cli as bisect_cli
from harness.gate import cli as gate_cli, quality as gate_quality
from harness.report import cli as report_cli
from esper_review.gae_tools import crossovers, floor, targets
from harness import run as run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
OLD_RUN = FIXTURES / "schema1" / "20261125-123548-cpu"

#: values a user might type into any option
NASTY = st.sampled_from([
    "", " ", "-1", "0", "1e400", "inf", "-inf", "nan", "NaN", "1e23", "99999999999999999999",
    "0.0", "-0.5", "1.5", "\u00e9t\u00e9", "\u0661", "1_000", "\x00", "/proc/esper/x",
    "a path with spaces", "--", "3", "0.05", "1.05",
]) | st.text(max_size=8)


def _commands(tmp: Path) -> dict[str, tuple]:
    """command -> (main, options that take a value, argv that makes it stop after its
    checks). The stopping argv never measures: run lists, report reads a run that is not
    there, the gate asks for a check on a finding that does not exist."""
    return {
        "run": (run_cli.main, ["--budget", "--margin", "--precision", "--seed", "--threads",
                               "--out", "--reports", "--device", "--placebo", "--findings"],
                ["--list"]),
        "report": (report_cli.main, ["--out", "--results", "--margin", "--compare"],
                   ["no-such-run", "--results", str(tmp)]),
        "gate": (gate_cli.main, ["--sessions", "--margin", "--baseline", "--config",
                                 "--json", "--findings"],
                 ["--counters", "--findings", "NO-SUCH-FINDING"]),
        "quality": (gate_quality.main, ["--counters-runs", "--invariant-runs", "--ab-runs",
                                        "--ab-planted-runs", "--ab-slowdowns", "--busy"],
                    ["--counters-runs", "0", "--invariant-runs", "0", "--ab-runs", "0",
                     "--ab-planted-runs", "0", "--json", "/proc/esper/no.json"]),
        "crossovers": (crossovers.main, ["--threads", "--device"], ["--device", "tpu"]),
        "floor": (floor.main, ["--rounds", "--methods", "--clock"], ["--clock", "sundial"]),
        "targets": (targets.main, ["--results"], ["no-such-run", "--results", str(tmp)]),
        "bisect": (bisect_cli.main, ["--good", "--bad", "--margin", "--sessions", "--seed",
                                     "--findings", "--counter"],
                   ["--good", "HEAD~1", "--bad", "HEAD", "--findings", "NO-SUCH",
                    "--counter", "host_syncs"]),
    }


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", ["run", "report", "gate", "quality", "crossovers",
                                     "floor", "targets", "bisect"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_option_value_ends_in_exit_0_or_2_naming_the_option(command, data, tmp_path_factory,
                                                               capsys, monkeypatch):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "a-file").write_text("not a folder")
    (tmp / "read-only").mkdir(exist_ok=True)
    (tmp / "read-only").chmod(0o555)  # as root writable anyway: then it must work or say why
    monkeypatch.chdir(tmp)
    main, valued, stop = _commands(tmp)[command]
    option = data.draw(st.sampled_from(valued))
    value = data.draw(NASTY | st.sampled_from([str(tmp / "a-file"), "read-only",
                                               "read-only/sub"]))
    before = _snapshot(tmp)
    capsys.readouterr()
    code = main([*stop, option, value] if not stop or stop[0].startswith("-")
                else [stop[0], option, value, *stop[1:]])
    out, err = capsys.readouterr()
    assert code in (0, 2), (command, option, value, err[-2000:])
    assert "Traceback" not in err and "internal error" not in err
    if code == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert _snapshot(tmp) == before  # nothing outside a command's own output changed


def _covering(cases: list[tuple[str, object]], first: set[str]) -> list:
    """pytest params of `cases`; those whose `what` is not in `first` are marked
    `exhaustive` (the inner loop runs `first`, CI and `-m exhaustive` all of them)."""
    return [pytest.param(what, case, id=what,
                         marks=() if what in first else pytest.mark.exhaustive)
            for what, case in cases]


def _mutations(document: dict) -> tuple[list[tuple[str, object]], set[str]]:
    """(what, mutated document) for a run.json: every field of the document given a value
    of each other JSON type, and a future schema version; and the names of a covering
    part: each field once and each type in turn (the field's i-th other type, i its
    position), the future version too."""
    out, first = [], {"schema_version=99"}
    kinds = [None, True, 7, 2.5, "text", [], {}, [1, "x"], {"a": 1}]
    for position, field in enumerate(document):
        others = [value for value in kinds if type(value) is not type(document[field])]
        for value in others:
            changed = copy.deepcopy(document)
            changed[field] = value
            out.append((f"{field}={value!r}", changed))
        first.add(f"{field}={others[position % len(others)]!r}")
    out.append(("schema_version=99", {**document, "schema_version": 99}))
    return out, first


def _run_document() -> dict:
    """The old fixture run's run.json with two summary rows, and the fields of the CPU
    kernel path that runs record since."""
    document = json.loads((OLD_RUN / "run.json").read_text())
    cell = json.loads(next((OLD_RUN / "cells").glob("*.json")).read_text())
    return {**document, **kernel_path(), "summary": cell["summary"][:2],
            "rows": cell["samples"][:4]}


def _report_of(document: dict, tmp_path: Path, capsys) -> tuple[int, str, Path]:
    """(exit status, stderr, run folder) of `harness.report` on a run whose run.json is
    `document`."""
    folder = tmp_path / "results" / "r"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(document))
    code = report_cli.main([str(folder), "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err, folder


@pytest.mark.parametrize(("what", "document"), _covering(*_mutations(_run_document())))
def test_a_run_json_with_any_field_of_the_wrong_type_renders_or_is_named(what, document,
                                                                         tmp_path, capsys):
    code, err, folder = _report_of(document, tmp_path, capsys)
    assert code in (0, 2), (what, err[-3000:])
    if code == 2:
        assert str(folder / "run.json") in err or "--out" in err, (what, err)
        assert not (tmp_path / "out").exists()


#: a value of each JSON kind (numbers are one kind: 7 for 2.5 is no change of kind), and
#: the field's absence
_KINDS = [None, True, "text", [], {}, 7, 2.5]
_ABSENT = object()


def _same_kind(a: object, b: object) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b)
    return (isinstance(a, numbers) and isinstance(b, numbers)) or type(a) is type(b)


def _row_mutations(document: dict) -> tuple[list[tuple[str, dict]], set[str]]:
    """(what, mutated document): each field of a summary row (a compared row: it has every
    field a baseline row has, and its ratio) given a value of each other JSON kind, or
    removed; and the names of a covering part: each field removed, and given its i-th
    other kind (i its position)."""
    out, first = [], set()
    index = next(i for i, row in enumerate(document["summary"]) if "ratio" in row)
    for position, (field, was) in enumerate(document["summary"][index].items()):
        others = [value for value in _KINDS if not _same_kind(value, was)]
        first |= {f"row{index}.{field}=absent",
                  f"row{index}.{field}={others[position % len(others)]!r}"}
        for value in [*others, _ABSENT]:
            changed = copy.deepcopy(document)
            if value is _ABSENT:
                del changed["summary"][index][field]
            else:
                changed["summary"][index][field] = value
            out.append((f"row{index}.{field}={'absent' if value is _ABSENT else repr(value)}",
                        changed))
    return out, first


@pytest.mark.parametrize(("what", "document"), _covering(*_row_mutations(_run_document())))
def test_a_summary_row_with_any_field_of_the_wrong_kind_or_missing_renders_or_is_named(
        what, document, tmp_path, capsys):
    """Every field of a summary row, wrong or missing: the report renders, or exits 2
    naming run.json, the row and the field, what it expected and what it found; never an
    internal error (a timed row without its median read as 'numbers that make no sense')."""
    code, err, folder = _report_of(document, tmp_path, capsys)
    assert code in (0, 2), (what, err[-3000:])
    if code == 2:
        field = what.split(".", 1)[1].split("=", 1)[0]
        assert err.startswith(f"error: {folder / 'run.json'}: summary row "), (what, err)
        assert f"field {field!r}: expected " in err and "; got " in err, (what, err)
        assert not (tmp_path / "out").exists()


def test_a_run_json_that_is_a_folder_is_named_as_one(tmp_path, capsys):
    folder = tmp_path / "r"
    (folder / "run.json").mkdir(parents=True)
    assert report_cli.main([str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / 'run.json'}: expected a JSON file; got a folder"), err


@pytest.mark.parametrize("command", ["run", "report", "gate", "targets"])
@pytest.mark.parametrize("length", ["a 300-character name", "a 4200-character path"])
def test_a_path_too_long_is_exit_2_naming_the_option(command, length, tmp_path, capsys,
                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    long = (str(tmp_path / ("n" * 300) / "x") if length.startswith("a 300")
            else str(tmp_path / "/".join(["d" * 200] * 21)))
    main, valued, stop = _commands(tmp_path)[command]
    for option in [o for o in valued if o in ("--out", "--reports", "--results", "--baseline",
                                              "--json", "--config")]:
        assert main([*stop, option, long]) == 2, (option, length)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and option in err, (option, err)
        assert "too long" in err and "Traceback" not in err, (option, err)
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("cut", [0, 1, 10, 100, 1000, -10, -1])
def test_a_truncated_run_json_or_cell_is_named(cut, tmp_path, capsys):
    for name in ("run.json", "cell"):
        folder = tmp_path / name / "r"
        shutil_copy(OLD_RUN, folder)
        target = folder / "run.json" if name == "run.json" else next((folder / "cells").glob("*.json"))
        raw = target.read_bytes()
        target.write_bytes(raw[:cut] if cut >= 0 else raw[:len(raw) + cut])
        assert report_cli.main([str(folder), "--out", str(tmp_path / name / "out")]) == 2
        assert str(target) in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"\x00\xff\xfe" * 50, b"[]", b"null", b"42",
                                     b'{"schema_version": 2}', b'{"order": [0, 0]}'])
def test_a_corrupt_journal_cell_is_named(content, tmp_path, capsys):
    folder = tmp_path / "r"
    shutil_copy(OLD_RUN, folder)
    cell = next((folder / "cells").glob("*.json"))
    cell.write_bytes(content)
    assert report_cli.main([str(folder), "--out", str(tmp_path / "out")]) == 2
    assert str(cell) in capsys.readouterr().err


def shutil_copy(source: Path, destination: Path) -> None:
    import shutil

    shutil.copytree(source, destination)


RUN = ["--findings-module", "tests.findings_modules.tiny", "--findings", "TINY-sums",
       "--budget", "1", "--every-cell", "--no-profile", "--no-report"]


@pytest.mark.integration
@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EACCES])
@pytest.mark.parametrize("failing", [1, 2, 4, 7, 12])
def test_a_write_that_fails_stops_the_run_keeping_what_was_journaled(error, failing, tmp_path,
                                                                     monkeypatch, capsys):
    """The k-th atomic write raises (a full disk, a permission error): the run stops with
    exit 2 naming the file, every cell journaled before stays readable, and `--resume`
    completes the run with every cell."""
    real = os.open
    calls = {"n": 0}

    def failing_open(path, flags, *args, **kwargs):  # each atomic write makes a temp file first
        if str(path).endswith(".tmp") and flags & os.O_EXCL:
            calls["n"] += 1
            if calls["n"] == failing:
                raise OSError(error, os.strerror(error))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)
    code = run_cli.main([*RUN, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    monkeypatch.setattr(os, "open", real)
    if calls["n"] < failing:  # the run wrote less than that: nothing failed
        assert code == 0
        return
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and str(tmp_path) in err
    assert not [p for p in tmp_path.rglob("*.tmp")]
    runs = [p for p in tmp_path.iterdir() if (p / "run.json").is_file()]
    if not runs:  # the run folder itself could not be made: nothing was measured
        return
    (folder,) = runs
    journaled = results.read_cells(folder)  # readable, whatever was cut short
    assert run_cli.main(["--resume", str(folder), "--no-report"]) == 0
    done = results.load_run(folder)
    assert done.metadata["status"] == "complete" and done.metadata["cells_done"] == 10
    assert len(journaled) <= 10
