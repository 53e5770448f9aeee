"""The gate on another machine: unchanged code passes, a planted op still fails; and
`--against` says what it did not check.

Another machine is simulated on this one the way CPUs differ: `ONEDNN_MAX_CPU_ISA` and
`ATEN_CPU_CAPABILITY` move oneDNN's and ATen's kernels off the machine's own path, as
another CPU's would (the allocations of oneDNN's LSTM and matrix products change with its
ISA), in a fresh `python -m harness.gate` process each. Nothing is mocked: the baseline is
recorded under one condition, the gate runs under another. Each gate process gets its own
inductor cache for its kernel path (`harness.measure.machine.isolate_compile_cache`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.gate import counters as gate_counters
from harness.measure.machine import KERNEL_PATH_VARIABLES
from tests.bisect_repo import FINDINGS as USER_FINDINGS, OPS, PYPROJECT, git

REPO = Path(__file__).resolve().parents[3]
#: H4-bootstrap-tensor runs the policy's LSTM and linear layers (oneDNN: their allocations
#: follow its ISA); B4-CR-03 holds the findings module's plant target (the scan GAE)
FINDINGS = ("H4-bootstrap-tensor", "B4-CR-03")
#: another machine, simulated: ATen's default (no vector ISA) kernels, oneDNN at SSE4.1
OTHER_MACHINE = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
#: `python -m harness.gate` with the findings module's planted extra allocation (one more
#: op, one allocation, 64 bytes per call of the scan GAE: `harness.gate.plant.allocating`)
PLANTED_GATE = """
import sys
from harness import findings as registry
from harness.gate import cli
from harness.gate.plant import allocating, planted
from harness.project import load_findings

_, modules = load_findings(None)
with planted(registry.defaults(modules).plant, allocating):
    sys.exit(cli.main(sys.argv[1:]))
"""


def _gate(condition: dict, *args: str, plant: bool = False) -> subprocess.CompletedProcess:
    """The gate in a fresh process under `condition` (kernel path variables), from this
    repository (its pyproject.toml names the findings module)."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*KERNEL_PATH_VARIABLES, "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH")}
    command = ["-c", PLANTED_GATE] if plant else ["-m", "harness.gate"]
    done = subprocess.run([sys.executable, *command, *args], cwd=REPO, env={**env, **condition},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _rows(path: Path) -> list[dict]:
    return json.loads(path.read_text())["rows"]


@pytest.mark.integration
@pytest.mark.long  # six gate processes, over two minutes: run on demand
def test_unchanged_code_passes_on_another_kernel_path_and_a_planted_op_still_fails(tmp_path):
    baseline = tmp_path / "counters.json"
    rows_file = tmp_path / "rows.json"
    scope = ["--baseline", str(baseline), "--findings", *FINDINGS]
    done = _gate({}, "--update-baseline", *scope)
    assert done.returncode == 0

    # unchanged code on the other machine: exit 0, the exact counters compared in every
    # cell, the allocation counters in none, and the note says which, why and how
    done = _gate(OTHER_MACHINE, "--counters", *scope, "--json", str(rows_file))
    assert done.returncode == 0, done.stdout[-3000:]
    rows = _rows(rows_file)
    assert rows and {row["outcome"] for row in rows} == {"pass"}
    for row in rows:
        assert row["not_compared"] == list(gate_counters.KERNEL_DEPENDENT)
        assert row["baseline"].startswith("op_calls=") and "allocations" not in row["baseline"]
        assert "this CPU kernel path is not in the baseline (aten_cpu_capability, " \
               "env_aten_cpu_capability, env_onednn_max_cpu_isa differs)" in row["note"]
    (note,) = [n for n in json.loads(rows_file.read_text())["notes"] if n.startswith("counters")]
    assert note.startswith("counters: allocations, allocated_bytes, peak_bytes depend on the "
                           f"CPU kernel path and were not compared in {len(rows)} of "
                           f"{len(rows)} cells")
    assert "env_onednn_max_cpu_isa: here 'SSE41', recorded None" in note
    assert "env_aten_cpu_capability: here 'default', recorded None" in note
    assert "op_calls, host_syncs were compared exactly" in note
    assert (f"`python -m harness.gate --update-baseline --baseline {baseline} --findings "
            f"{' '.join(FINDINGS)}`") in note
    assert f"note: {note}" in done.stdout and "regression" not in done.stdout

    # a planted extra op still fails there, on the exact counters, named at its line
    done = _gate(OTHER_MACHINE, "--counters", *scope, "--json", str(rows_file), plant=True)
    assert done.returncode == 1, done.stdout[-3000:]
    flagged = [row for row in _rows(rows_file) if row["outcome"] == "regression"]
    assert {(row["finding"], row["variant"], row["change"]) for row in flagged} == {
        ("B4-CR-03", "scan", "op_calls +1")}
    assert len(flagged) == 4
    assert all(": +1 aten::empty at " in row["note"] for row in flagged)

    # the other machine records its own allocation counts beside this one's
    done = _gate(OTHER_MACHINE, "--update-baseline", *scope)
    assert done.returncode == 0
    assert "kept the allocation counts of 1 other CPU kernel path" in done.stdout
    document = json.loads(baseline.read_text())
    assert len(document["kernel_paths"]) == 2
    moved = {(e["finding"], e["variant"], e["case"]) for e in document["counters"]
             if len({r["allocations"] for r in e["by_kernel_path"].values()}) > 1}
    # the condition moves kernels as another CPU would: oneDNN's LSTM allocates differently
    assert ("H4-bootstrap-tensor", "packed", "num_envs=4") in moved, moved

    for condition in ({}, OTHER_MACHINE):  # each machine now compares every counter
        done = _gate(condition, "--counters", *scope, "--json", str(rows_file))
        assert done.returncode == 0, done.stdout[-3000:]
        assert not any(row["not_compared"] for row in _rows(rows_file))
        assert "not compared" not in done.stdout


@pytest.mark.integration
def test_against_says_that_it_did_not_check_the_counters_and_at_how_many_threads_it_timed(
        tmp_path):
    """`--against REV` alone times the trees and nothing else: its notes say, loudly, that
    the counters were not checked (and how to check them), and the thread count the
    sessions timed at (harness.run's by default)."""
    repo = tmp_path / "repo"
    for name, text in {"mylib/__init__.py": "", "mylib/ops.py": OPS,
                       "bench_findings.py": USER_FINDINGS, "pyproject.toml": PYPROJECT}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "mylib")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "harness.gate", "--against", "HEAD",
                           "--sessions", "3", "--json", str(tmp_path / "rows.json")], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: a 5% false alarm
    # torch's count in a fresh process (this one's may have been set by an earlier test)
    threads = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                                 env=env, capture_output=True, text=True, check=True).stdout)
    notes = [f"A/B: timed at {threads} torch thread{'s' * (threads != 1)}, harness.run's "
             "default (--threads sets another)",
             "COUNTERS NOT CHECKED: --against times the two trees only; op calls, host syncs "
             "and allocations are checked by --counters (add it, or run `python -m harness.gate` "
             "with no check named)"]
    assert json.loads((tmp_path / "rows.json").read_text())["notes"] == notes
    assert "".join(f"note: {note}\n" for note in notes) in done.stdout
    assert not any(row.startswith("| counters") for row in done.stdout.splitlines())
