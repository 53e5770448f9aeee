"""The gate never passes by accident, reads every exit code right, and leaves nothing behind.

Accidental passes and exit codes are one table each, through the gate's real `main`
(the counters of B4-DRL-03 measured once per module and handed to it; the comparison,
the coverage rule and the exit status are what is under test). Baselines are merged,
never truncated. Signals are real: a gate (and `harness.gate.quality --busy`) in a
subprocess, SIGTERM/SIGINT/SIGKILL sent once its worktree and worker exist, then
`git worktree list`, the temp folder and the process table are checked.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import exits
from esper_review.gae_tools import crossovers, targets
from harness.gate import ab as gate_ab, cli as gate, counters as gate_counters
from harness.gate import quality as gate_quality
from harness.gate.table import UsageError

import esper.train
from tests.review import MODULE as REVIEW, review_findings

REPO = Path(__file__).resolve().parents[3]
#: this repository's counters baseline (pyproject.toml's [tool.esper-bench] baseline)
COMMITTED_BASELINE = REPO / "results" / "baselines" / "counters.json"
review_findings()
FINDING = "B4-DRL-03"  # 8 cells (2 quick cases x 4 variants), counted in about a second
CELLS = 8


@pytest.fixture(scope="module")
def cells() -> list[gate_counters.CellCounts]:
    return gate_counters.measure([FINDING])


@pytest.fixture
def measured(monkeypatch, cells):
    """The gate's counters measurement replaced by the module's cells; records the calls."""
    calls = []

    def measure(finding_ids, **kwargs):
        calls.append(tuple(finding_ids))
        assert tuple(finding_ids) == (FINDING,), finding_ids
        return cells

    monkeypatch.setattr(gate_counters, "measure", measure)
    return calls


def _document(entries: list[dict]) -> dict:
    """A baseline of `entries` (every counter in the entry), their allocation counts
    recorded on this process's kernel path."""
    here = gate_counters.gate_kernel_path()
    name = gate_counters.kernel_path_id(here)
    kernel = gate_counters.KERNEL_DEPENDENT
    return {"schema_version": 2, "fingerprint": gate_counters.counting_fingerprint(),
            "kernel_paths": {name: here},
            "counters": [{**{k: v for k, v in e.items() if k not in kernel},
                          "by_kernel_path": {name: {k: e[k] for k in kernel if k in e}}}
                         if isinstance(e, dict) else e for e in entries]}


def _entries(cells) -> list[dict]:
    return [{"finding": c.finding, "case": c.case, "variant": c.variant, **c.counts}
            for c in cells]


# --- the gate never passes by accident -----------------------------------------------------

def _full(cells):
    return _entries(cells)


def _empty(cells):
    return []


def _first_only(cells):
    return _entries(cells)[:1]


def _first_only_regressed(cells):
    first = _entries(cells)[0]
    return [{**first, "host_syncs": first["host_syncs"] - 1}]


ADD_COMMAND = "`python -m harness.gate --update-baseline --baseline {path} --findings B4-DRL-03`"

ACCIDENTAL_PASSES = [
    # (id, baseline entries, options after --baseline/--findings, exit, stderr, summary)
    ("full baseline", _full, ["--counters"], 0, None, f"PASS: {CELLS} pass"),
    ("empty baseline", _empty, ["--counters"], 2,
     f"expected an entry for every measured cell; {CELLS} of {CELLS} have none ({CELLS} of "
     f"B4-DRL-03); add them with {ADD_COMMAND}", f"FAIL: {CELLS} new"),
    ("partial baseline", _first_only, ["--counters"], 2,
     f"{CELLS - 1} of {CELLS} have none ({CELLS - 1} of B4-DRL-03); add them with {ADD_COMMAND}",
     f"FAIL: {CELLS - 1} new, 1 pass"),
    ("partial baseline, --allow-new", _first_only, ["--counters", "--allow-new"], 0, None,
     f"PASS: 1 pass, {CELLS - 1} new (allowed)"),
    ("empty baseline, --allow-new", _empty, ["--counters", "--allow-new"], 2,
     "--allow-new lets new cells pass only beside compared ones, and none was; "
     f"add them with {ADD_COMMAND}", f"FAIL: {CELLS} new"),
    ("a regression beside new cells", _first_only_regressed, ["--counters"], 1, None,
     f"FAIL: 1 regression, {CELLS - 1} new"),
]


@pytest.mark.parametrize("baseline, options, code, message, summary",
                         [case[1:] for case in ACCIDENTAL_PASSES],
                         ids=[case[0] for case in ACCIDENTAL_PASSES])
def test_counters_pass_only_when_every_cell_was_compared(
        tmp_path, capsys, measured, cells, baseline, options, code, message, summary):
    path = tmp_path / "counters.json"
    path.write_text(json.dumps(_document(baseline(cells))))
    json_rows = tmp_path / "rows.json"
    argv = [*options, "--baseline", str(path), "--findings", FINDING, "--json", str(json_rows)]
    assert gate.main(argv) == code
    out, err = capsys.readouterr()
    assert out.rstrip().endswith(summary)
    if message is None:
        assert "error" not in err
    else:
        assert f"error: {path}: " in err and message.format(path=path) in err
    rows = json.loads(json_rows.read_text())["rows"]  # written in every case, for CI to read
    assert any(row["fails"] for row in rows) == summary.startswith("FAIL")


USAGE_ERRORS = [
    # (id, argv, what stderr says: the option, what was expected, what was received)
    ("--against ''", ["--against", ""],
     "error: --against: expected a git revision (a branch, tag or commit, e.g. origin/main); "
     "got ''"),
    ("--against blank, with --counters", ["--counters", "--against", "  "],
     "--against: expected a git revision"),
    ("ungated finding", ["--findings", "E2E-iteration"],
     "error: --findings: expected findings the gate covers "
     f"({', '.join(gate_counters.gated_findings([REVIEW]))}); got E2E-iteration, registered but not gated"),
    ("ungated finding, A/B", ["--against", "HEAD", "--findings", "E2E-iteration"],
     "got E2E-iteration, registered but not gated"),
    ("ungated finding, update", ["--update-baseline", "--findings", "B4-PT-05", "E2E-iteration"],
     "got E2E-iteration, registered but not gated"),
    ("unknown finding", ["--counters", "--findings", "NOPE-1"], "unknown id(s) NOPE-1"),
    ("--findings with --invariants only", ["--invariants", "--findings", FINDING],
     "--findings: expected with --counters, --against or --update-baseline"),
    ("--allow-new without counters", ["--invariants", "--allow-new"],
     "--allow-new: expected with the counters check (--counters, or no check named); "
     "got it with --invariants"),
    ("--allow-new with --update-baseline", ["--update-baseline", "--allow-new"],
     "--allow-new: expected with the counters check"),
    ("--json with --update-baseline", ["--update-baseline", "--json", "rows.json"],
     "--update-baseline: expected on its own, without a check or --json; got it with --json"),
    ("--margin without --against", ["--margin", "0.2"],
     "--margin: expected with --against REV (it sets the A/B check); got --margin 0.2"),
    ("--sessions without --against", ["--counters", "--sessions", "8"],
     "--sessions: expected with --against REV"),
    ("--json under /proc", ["--counters", "--json", "/proc/no-such/rows.json"],
     "--json: expected a writable location; got /proc/no-such/rows.json"),
    ("--json a folder", ["--counters", "--json", "."], "--json: expected a file to write; got ."),
]


@pytest.mark.parametrize("argv, message", [case[1:] for case in USAGE_ERRORS],
                         ids=[case[0] for case in USAGE_ERRORS])
def test_bad_options_exit_2_before_anything_is_measured(argv, message, capsys, monkeypatch):
    def measure(*args, **kwargs):
        raise AssertionError("measured despite a usage error")

    monkeypatch.setattr(gate_counters, "measure", measure)
    assert gate.main(argv) == 2
    out, err = capsys.readouterr()
    assert message in err and out == ""


def test_an_empty_invariants_config_is_an_error_not_a_pass(tmp_path, capsys):
    config = tmp_path / "invariants.json"
    config.write_text(json.dumps({"schema_version": 1, "invariants": [],
                                  "sampling": {"threads": 1, "min_samples": 5, "max_samples": 5,
                                               "time_budget_s": 1, "min_sample_time": 0.001}}))
    assert gate.main(["--invariants", "--config", str(config)]) == 2
    assert f"{config}: invariants: expected at least one invariant; got []" in capsys.readouterr().err


# --- corrupt baselines and configs (exit 2, naming the file) --------------------------------

def _truncated(path: Path) -> None:
    text = json.dumps(_document([{"finding": FINDING, "case": "c", "variant": "v",
                                  "op_calls": 1, "host_syncs": 0, "allocations": 1,
                                  "allocated_bytes": 4, "peak_bytes": 4}]), indent=1)
    path.write_text(text[: len(text) // 2])


CORRUPT = [
    ("not UTF-8", lambda p: p.write_bytes(b'\xff\xfe{"schema_version": 1}'),
     "expected UTF-8 JSON text; got byte 0xff at offset 0, not UTF-8"),
    ("truncated", _truncated, "not valid JSON: "),
    ("empty", lambda p: p.write_text(""), "expected a JSON document; the file is empty"),
    ("a folder", lambda p: p.mkdir(), "expected a JSON file; got a folder"),
    ("not an object", lambda p: p.write_text("[1, 2]"), "expected a JSON object; got list"),
    ("counters not a list", lambda p: p.write_text(json.dumps(
        {**_document([]), "counters": {"a": 1}})), "counters: expected a list of entries; got dict"),
    ("no counters", lambda p: p.write_text(json.dumps(
        {k: v for k, v in _document([]).items() if k != "counters"})),
     "counters: expected a list of entries; got nothing"),
    ("an entry not an object", lambda p: p.write_text(json.dumps(_document([7]))),
     "counters[0]: expected an object; got int"),
    ("a duplicate entry", lambda p: p.write_text(json.dumps(_document(
        [{"finding": FINDING, "case": "c", "variant": "v", "op_calls": 1, "host_syncs": 0,
          "allocations": 1, "allocated_bytes": 4, "peak_bytes": 4}] * 2))),
     "counters[1]: expected one entry per finding, case and variant; got ('B4-DRL-03', 'c', 'v') again"),
]


@pytest.mark.parametrize("corrupt, message", [case[1:] for case in CORRUPT],
                         ids=[case[0] for case in CORRUPT])
@pytest.mark.parametrize("command", [["--counters"], ["--update-baseline"]])
def test_a_corrupt_baseline_exits_2_naming_the_file(tmp_path, capsys, monkeypatch, corrupt,
                                                   message, command):
    def measure(*args, **kwargs):
        raise AssertionError("measured despite an unusable baseline")

    monkeypatch.setattr(gate_counters, "measure", measure)
    path = tmp_path / "counters.json"
    corrupt(path)
    assert gate.main([*command, "--baseline", str(path), "--findings", FINDING]) == 2
    err = capsys.readouterr().err
    if path.is_dir() and command == ["--update-baseline"]:
        assert f"--baseline: expected a file to write; got {path}, a folder" in err
        return
    assert f"{path}: {message}" in err
    assert f"recreate it with `python -m harness.gate --update-baseline --baseline {path}`" in err
    if command == ["--update-baseline"]:  # a partial update cannot know what it would lose
        assert "error: baseline not updated, it would lose" in err


def test_a_truncated_baseline_is_called_truncated(tmp_path):
    path = tmp_path / "counters.json"
    _truncated(path)
    with pytest.raises(UsageError, match="it looks truncated"):
        gate_counters.load_baseline(path)
    path.write_text('{"schema_version": 1,, "counters": []}')  # broken, not cut short
    with pytest.raises(UsageError, match="not valid JSON: Expecting property name") as caught:
        gate_counters.load_baseline(path)
    assert "looks truncated" not in str(caught.value)


@pytest.mark.parametrize("content, message", [
    (b"\x80\x81", "expected UTF-8 JSON text; got byte 0x80 at offset 0"),
    (b'{"schema_version": 1, "sampling": {"threads"', "it looks truncated"),
])
def test_a_corrupt_invariants_config_exits_2_naming_the_file(tmp_path, capsys, content, message):
    config = tmp_path / "invariants.json"
    config.write_bytes(content)
    assert gate.main(["--invariants", "--config", str(config)]) == 2
    assert f"error: {config}: " in (err := capsys.readouterr().err) and message in err


# --- --update-baseline merges ---------------------------------------------------------------

def _key(entry: dict) -> tuple[str, str, str]:
    return entry["finding"], entry["case"], entry["variant"]


@pytest.mark.integration
def test_updating_one_finding_keeps_every_other_entry_in_place(tmp_path, capsys):
    committed = json.loads(COMMITTED_BASELINE.read_text())
    document = json.loads(json.dumps(committed))
    document["counters"][0]["tolerance"] = {"allocations": 1}
    ours = [e for e in document["counters"] if e["finding"] == FINDING]
    ours[0]["op_calls"] = 1  # stale: the update must rewrite it
    path = tmp_path / "counters.json"
    path.write_text(json.dumps(document))

    assert gate.main(["--update-baseline", "--baseline", str(path), "--findings", FINDING]) == 0
    out = capsys.readouterr().out
    counts = {f: sum(e["finding"] == f for e in committed["counters"]) for f in
              gate_counters.gated_findings([REVIEW]) if f != FINDING}
    assert f"wrote {path}: {CELLS} cells of {FINDING} (each counted twice, identical)" in out
    assert ("kept the entries of the findings not measured: "  # those that have entries
            + ", ".join(f"{n} of {f}" for f, n in counts.items() if n)) in out

    expected = committed["counters"]
    expected[0] = {**expected[0], "tolerance": {"allocations": 1}}
    written = json.loads(path.read_text())["counters"]
    assert [_key(e) for e in written] == [_key(e) for e in expected]  # every entry, in place
    here = gate_counters.kernel_path_id(gate_counters.gate_kernel_path())
    stale = _key(ours[0])
    for old, new in zip(expected, written):
        if old["finding"] != FINDING:
            assert new == old
            continue
        # measured again: the exact counts and their lines as committed (they are the
        # same on every machine), this machine's kernel path as measured (as committed
        # where it was recorded), the other paths' kept unless the cell's counts changed
        assert {k: new[k] for k in ("op_calls", "host_syncs", "sources")} == \
            {k: old[k] for k in ("op_calls", "host_syncs", "sources")}
        if here in old["by_kernel_path"]:
            assert new["by_kernel_path"][here] == old["by_kernel_path"][here]
        others = {k: v for k, v in old["by_kernel_path"].items() if k != here}
        kept = {k: v for k, v in new["by_kernel_path"].items() if k != here}
        assert here in new["by_kernel_path"]
        assert kept == ({} if _key(old) == stale else others)


COUNTS = {"op_calls": 10, "host_syncs": 0, "allocations": 2, "allocated_bytes": 64,
          "peak_bytes": 64}


def _cell(finding, variant, **fields) -> gate_counters.CellCounts:
    counts = fields.pop("counts", COUNTS)
    return gate_counters.CellCounts(finding, "c", variant, counts=counts, **fields)


def test_write_baseline_merges_cell_by_cell(tmp_path):
    path = tmp_path / "counters.json"
    old = [("F1", "a"), ("F2", "kept-tolerance"), ("F2", "skipped-here"), ("F2", "retired"),
           ("F3", "b")]
    path.write_text(json.dumps(_document([
        {"finding": f, "case": "c", "variant": v, **COUNTS,
         **({"tolerance": {"allocations": 1}} if v == "kept-tolerance" else {})}
        for f, v in old])))
    more = {"op_calls": 11, "host_syncs": 0, "allocations": 2, "allocated_bytes": 64,
            "peak_bytes": 64}
    update = gate_counters.write_baseline(path, [
        _cell("F2", "kept-tolerance", counts=more),
        _cell("F2", "skipped-here", counts=None, skipped="needs CUDA"),
        _cell("F2", "new", counts=more),
    ])
    entries = json.loads(path.read_text())["counters"]
    assert [(e["finding"], e["variant"], e["op_calls"]) for e in entries] == [
        ("F1", "a", 10), ("F2", "kept-tolerance", 11), ("F2", "skipped-here", 10),
        ("F2", "new", 11), ("F3", "b", 10)]
    assert entries[1]["tolerance"] == {"allocations": 1}
    assert update == gate_counters.BaselineUpdate(
        written=2, kept={"F1": 1, "F3": 1}, kept_skipped=1, dropped=(("F2", "c", "retired"),),
        replaced=None, kernel_path=gate_counters.kernel_path_id(gate_counters.gate_kernel_path()))


def test_an_unmergeable_baseline_is_replaced_only_when_asked_or_when_nothing_is_lost(tmp_path):
    path = tmp_path / "counters.json"
    other_torch = {**_document([]), "fingerprint": {"torch": "1.0", "device": "cpu", "threads": 1}}
    entry = {"case": "c", "op_calls": 1, "host_syncs": 0, "allocations": 1, "allocated_bytes": 4,
             "peak_bytes": 4}
    path.write_text(json.dumps({**other_torch, "counters": [
        {"finding": "F1", "variant": "a", **entry}, {"finding": "F2", "variant": "a", **entry}]}))
    with pytest.raises(UsageError, match=r"baseline not updated, it would lose F2: .*"
                                         r"fingerprint: expected"):
        gate_counters.write_baseline(path, [_cell("F1", "a")])
    update = gate_counters.write_baseline(path, [_cell("F1", "a")], replace_stale=True)
    assert update.replaced and "fingerprint" in update.replaced and update.kept == {}
    assert [e["finding"] for e in json.loads(path.read_text())["counters"]] == ["F1"]

    path.write_text(json.dumps({**other_torch, "counters": [{"finding": "F1", "variant": "a",
                                                             **entry}]}))
    update = gate_counters.write_baseline(path, [_cell("F1", "a")])  # F1's own entries only
    assert update.replaced and json.loads(path.read_text())["fingerprint"] == \
        gate_counters.counting_fingerprint()

    # schema 1 of this torch version: the other findings' allocation counts have no kernel
    # path to be kept under, so only a full update (or one of its own findings) rewrites it
    schema_1 = {"schema_version": 1, "fingerprint": gate_counters.counting_fingerprint()}
    path.write_text(json.dumps({**schema_1, "counters": [
        {"finding": "F1", "variant": "a", **entry}, {"finding": "F2", "variant": "a", **entry}]}))
    with pytest.raises(UsageError, match=r"baseline not updated, it would lose F2: .*"
                                         r"schema_version 1 keeps the allocation counters "
                                         r"without the CPU kernel path"):
        gate_counters.write_baseline(path, [_cell("F1", "a")])
    update = gate_counters.write_baseline(path, [_cell("F1", "a")], replace_stale=True)
    assert update.replaced and json.loads(path.read_text())["schema_version"] == 2


# --- exit codes and --version of every command -----------------------------------------------

COMMANDS = {
    "harness.gate": gate.main,
    "harness.gate.quality": gate_quality.main,
    "esper_review.gae_tools.crossovers": crossovers.main,
    "esper_review.gae_tools.targets": targets.main,
    "esper.train": esper.train.main,
}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_version_and_lists_its_exit_codes(name, capsys):
    with pytest.raises(SystemExit) as done:
        COMMANDS[name](["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == (
        f"python -m {name} {importlib.metadata.version('esper-bench')}\n")
    with pytest.raises(SystemExit) as done:
        COMMANDS[name](["--help"])
    assert done.value.code == 0
    help_text = capsys.readouterr().out
    assert "exit status:\n  0    " in help_text
    assert "  2    usage or input error" in help_text
    assert "  3    internal error: an unexpected exception, a bug (the traceback is printed)" \
        in help_text


def _bug(*args, **kwargs):
    raise RuntimeError("planted bug")


INTERNAL_ERRORS = [
    # (command, what to break, argv)
    ("harness.gate", (gate_counters, "measure"), ["--counters", "--findings", FINDING]),
    ("harness.gate.quality", (gate_quality, "run_scenarios"), []),
    ("esper_review.gae_tools.crossovers", (crossovers, "timed_methods"), ["--quick"]),
    ("esper_review.gae_tools.targets", (targets, "load_run"), []),
    ("esper.train", (esper.train, "VectorizedTrainer"),
     ["--device", "cpu", "--envs", "1", "--steps", "2", "--iterations", "1"]),
]


def _baseline_of_this_machine(tmp_path: Path) -> Path:
    """An empty counters baseline whose fingerprint is this machine's (the committed one
    may be of another torch version, an input error that would stop the gate first)."""
    path = tmp_path / "counters.json"
    gate_counters.write_baseline(path, [])
    return path


@pytest.mark.parametrize("name, target, argv", INTERNAL_ERRORS, ids=[c[0] for c in INTERNAL_ERRORS])
def test_an_unexpected_exception_exits_3_with_its_traceback(name, target, argv, monkeypatch,
                                                           capsys, tmp_path):
    monkeypatch.setattr(*target, _bug)
    if name == "harness.gate":
        argv = [*argv, "--baseline", str(_baseline_of_this_machine(tmp_path))]
    assert COMMANDS[name](argv) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: planted bug" in err
    assert "internal error (exit 3)" in err


@pytest.mark.parametrize("name, argv, message", [
    ("harness.gate.quality", ["--busy", "-1"], "--busy: expected an integer >= 0; got '-1'"),
    ("harness.gate.quality", ["--json", "/proc/x/q.json"], "--json: expected a writable location"),
    ("esper_review.gae_tools.crossovers", ["--threads", "0"], "--threads: expected an integer >= 1; got '0'"),
    ("esper_review.gae_tools.targets", ["no-such-run", "--results", "/nonexistent"], "no-such-run"),
])
def test_tool_commands_exit_2_on_bad_input(name, argv, message, capsys):
    assert COMMANDS[name](argv) == 2
    assert message in capsys.readouterr().err


def test_sigterm_inside_a_command_cleans_up_and_exits_143(monkeypatch, capsys, tmp_path):
    entered = []

    def measure(*args, **kwargs):
        entered.append(True)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to the handler the command installed
        time.sleep(5)
        raise AssertionError("SIGTERM did not stop the command")

    monkeypatch.setattr(gate_counters, "measure", measure)
    baseline = _baseline_of_this_machine(tmp_path)
    assert gate.main(["--counters", "--findings", FINDING, "--baseline", str(baseline)]) == 143
    assert entered and "SIGTERM: stopped" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back afterwards


@pytest.mark.integration
def test_python_m_gate_version_in_a_subprocess():
    done = subprocess.run([sys.executable, "-m", "harness.gate", "--version"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("python -m harness.gate ")


# --- nothing left behind: real processes, real signals --------------------------------------

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # exited while listed
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def _descendants(pid: int) -> list[int]:
    parents, found, frontier = _parents(), [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _survivors(pids: list[int], grace_s: float = 5.0) -> list[str]:
    """The command lines of `pids` still running after up to `grace_s` seconds: a kill the
    kernel delivers when a parent dies (PR_SET_PDEATHSIG) lands moments later, not at once,
    which a loaded machine stretches."""
    deadline = time.monotonic() + grace_s
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [_cmdline(p) for p in pids if _running(p)]


def _wait_for(condition, timeout: float, what: str, process: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} before {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _worktrees(repo: Path) -> list[str]:
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"],
                            capture_output=True, text=True, check=True).stdout
    return [line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A one-commit git repository holding a copy of this tree: the gate's worktrees are
    registered there, never in the repository under test."""
    repo = tmp_path_factory.mktemp("gate-signals") / "repo"
    gate_quality._copy_tree(REPO, repo)
    git = ["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run(git + args, check=True, capture_output=True)
    return repo


def _start_ab(clone: Path, tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """`python -m harness.gate --against HEAD` in the clone, once its worktree is registered
    and its first worker runs: (the gate, the worker's pid, the temp folder it uses)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    log = open(tmp_path / "gate.log", "w")
    gate_process = subprocess.Popen(
        [sys.executable, "-m", "harness.gate", "--against", "HEAD"], cwd=clone,
        env={**os.environ, "TMPDIR": str(temp)}, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    _wait_for(lambda: len(_worktrees(clone)) == 2, 120, "the worktree", gate_process)
    worker = _wait_for(lambda: [p for p in _descendants(gate_process.pid)
                                if "TreeModules" in _cmdline(p)], 120, "a worker", gate_process)
    return gate_process, worker[0], temp


@pytest.mark.integration
@linux_only
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_ab_gate_removes_its_worktree_temp_folders_and_workers(clone, tmp_path,
                                                                           signum):
    gate_process, worker, temp = _start_ab(clone, tmp_path)
    gate_process.send_signal(signum)
    assert gate_process.wait(timeout=60) == 128 + signum, (tmp_path / "gate.log").read_text()
    assert _worktrees(clone) == [str(clone)]
    # neither the worktree's folder nor the session's (torch may leave its own caches)
    assert [p.name for p in temp.iterdir() if p.name.startswith(gate_ab.WORKTREE_PREFIX)] == []
    assert not _running(worker)
    assert f"{signal.Signals(signum).name}: stopped" in (tmp_path / "gate.log").read_text()


@pytest.mark.integration
@linux_only
@pytest.mark.slow
def test_a_killed_ab_gate_takes_its_worker_along_and_the_next_gate_removes_its_worktree(
        clone, tmp_path, capsys):
    gate_process, worker, temp = _start_ab(clone, tmp_path)
    gate_process.kill()  # SIGKILL: no cleanup can run in the gate
    gate_process.wait(timeout=30)
    assert _survivors([worker], 10) == []  # the kernel killed it with its parent (PR_SET_PDEATHSIG)
    [left] = [Path(t) for t in _worktrees(clone) if t != str(clone)]
    assert left.parent.parent == temp and left.is_dir()

    capsys.readouterr()
    assert gate_ab.remove_stale_worktrees(clone) == [left.parent]
    assert _worktrees(clone) == [str(clone)] and not left.parent.exists()
    assert f"removed {left.parent}: the git worktree of a gate" in capsys.readouterr().err


@pytest.mark.integration
@linux_only
def test_remove_stale_worktrees_leaves_a_live_gates_worktree(clone):
    commit = gate_ab.resolve_revision(clone, "HEAD")
    with gate_ab.worktree(clone, commit) as tree:
        assert gate_ab.remove_stale_worktrees(clone) == []  # its owner, this process, lives
        assert str(tree) in _worktrees(clone)
    assert _worktrees(clone) == [str(clone)]


@pytest.mark.integration
@linux_only
@pytest.mark.slow
@pytest.mark.usefixtures("cores_alone")
def test_a_terminated_quality_run_leaves_no_busy_process(tmp_path):
    log = open(tmp_path / "quality.log", "w")
    quality = subprocess.Popen(
        [sys.executable, "-m", "harness.gate.quality", "--busy", "2", "--counters-runs", "1",
         "--invariant-runs", "0", "--ab-runs", "0", "--ab-planted-runs", "0"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    log.close()

    def started():
        children = _descendants(quality.pid)
        spinners = [p for p in children if "getppid" in _cmdline(p)]
        gates = [p for p in children if "harness.gate --counters" in _cmdline(p)]
        return children if len(spinners) == 2 and gates else None

    children = _wait_for(started, 120, "two busy processes and a gate", quality)
    quality.send_signal(signal.SIGTERM)
    assert quality.wait(timeout=60) == 143, (tmp_path / "quality.log").read_text()
    # its gate child stops at the quality run's signal; under a full parallel test run it
    # outlived a 5 s grace once (gone within it when run alone)
    assert _survivors(children, grace_s=15.0) == []


@pytest.mark.integration
@linux_only
@pytest.mark.usefixtures("cores_alone")
def test_a_busy_process_stops_when_its_parent_is_killed_outright():
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys, time\n"
         "spinner = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())])\n"
         "print(spinner.pid, flush=True)\n"
         "time.sleep(60)\n", gate_quality.SPINNER],
        stdout=subprocess.PIPE, text=True)
    spinner = int(parent.stdout.readline())
    assert _running(spinner)
    parent.kill()
    parent.wait(timeout=10)
    assert _survivors([spinner], 10) == []


def test_read_json_says_what_is_wrong_with_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"a": [1, 2')
    with pytest.raises(UsageError, match=rf"{path}: not valid JSON: .* \(line 1, column \d+\); "
                                         r"it looks truncated .*; recreate it"):
        exits.read_json(path, fix="recreate it")
    path.unlink()
    with pytest.raises(UsageError, match=rf"{path}: no such file"):
        exits.read_json(path)
    shutil.copy(COMMITTED_BASELINE, path)
    assert exits.read_json(path)["schema_version"] == gate_counters.SCHEMA_VERSION


@pytest.mark.integration  # a fresh interpreter: loading a tree swaps its modules
def test_a_revision_without_the_findings_module_has_none_of_its_cells(tmp_path):
    """A tree with no `esper_review` (a revision older than the findings module): this
    checkout's editable install would import its own copy instead; the worker says the
    revision has none, and measures nothing of it there."""
    (tmp_path / "README.md").write_text("an old revision\n")
    code = ("from pathlib import Path\n"
            "from harness.gate.worker import TreeModules\n"
            f"found, sources = TreeModules(Path({str(tmp_path)!r}), ({REVIEW!r},))"
            f".load_findings(({REVIEW!r},))\n"
            "print(len(found)); print(*sources)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    count, source = done.stdout.splitlines()
    assert count == "0"
    assert source == f"{REVIEW}: not in this revision ({tmp_path} has no {REVIEW})"
