"""The gate on another machine: unchanged code passes, a planted op still fails.

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
