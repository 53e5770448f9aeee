"""Counters that name their source: ops, syncs and allocations split by the project's lines.

A `.item()` is planted in a copy of a function under test (`esper.env.accumulators`'s
`add_`); the attribution names the copy's file and the planted line, its totals equal
`profile_call`'s counts of the same call, and the gate's message for a user's project
names the line that a commit added.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import esper.env.accumulators
from harness.measure.counters import profile_call
from harness.measure.sources import (
    ProjectFiles, Site, SourceCount, Sources, attribute_call, diff_sources, explain,
)

PLANT = "        _ = loss.item()  # host sync: planted by the test\n"


def _copy_with(folder: Path, name: str, planted: bool) -> tuple[object, int]:
    """esper/accumulators.py copied to FOLDER/accumulators.py (imported as module NAME), a
    `.item()` planted as the first line of `add_`'s body when `planted`; the module and the
    planted line number."""
    lines = inspect.getsource(esper.env.accumulators).splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "def add_(self, loss" in line)
    # after the def line and its docstring (the first line after it that closes one)
    body = next(i for i in range(start + 1, len(lines)) if lines[i].rstrip().endswith('"""')) + 1
    if planted:
        lines.insert(body, PLANT)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "accumulators.py"
    path.write_text("".join(lines))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, body + 1


def _call(module):
    acc = module.EpochAccumulators("cpu")
    loss, correct = torch.tensor(0.5), torch.tensor(3.0)
    return lambda: acc.add_(loss, correct)


def test_a_planted_item_is_named_with_its_file_and_line(tmp_path):
    """Two commits' copies of one file: the same relative path in two trees."""
    clean, _ = _copy_with(tmp_path / "old" / "esper", "clean_acc", planted=False)
    planted, line = _copy_with(tmp_path / "new" / "esper", "planted_acc", planted=True)
    before = attribute_call(_call(clean), ProjectFiles(tmp_path / "old"))
    after = attribute_call(_call(planted), ProjectFiles(tmp_path / "new"))
    assert after.of("host_syncs") == [SourceCount(
        "host_syncs", "aten::item", Site("esper/accumulators.py", line, "add_"), 1)]
    changes = diff_sources(before, after, "host_syncs")
    assert [c.text() for c in changes] == [
        f"+1 aten::item at esper/accumulators.py:{line} in add_()"]
    assert explain("host_syncs", 0, 1, changes) == (
        f"host syncs 0 -> 1: +1 aten::item at esper/accumulators.py:{line} in add_()")
    # the two in-place adds are the same ops at the same places: no change there, although
    # the planted line moved them down by one (sites are matched by function, not line)
    adds = diff_sources(before, after, "op_calls")
    assert {(c.op, c.delta) for c in adds} == {("aten::item", 2)}  # item + _local_scalar_dense


def test_totals_equal_the_profilers_counts_of_the_same_call(tmp_path):
    planted, _ = _copy_with(tmp_path, "planted_acc2", planted=True)
    call = _call(planted)
    call()  # as the gate does: a warm-up call first
    counted = profile_call(call).as_row()
    totals = attribute_call(call, ProjectFiles(tmp_path)).totals()
    for counter in ("op_calls", "host_syncs", "allocations", "allocated_bytes"):
        assert totals[counter] == counted[counter], counter


def test_operators_and_bool_are_named_at_their_line_and_foreign_frames_are_skipped(tmp_path):
    """`bool(t)` and `x + 1` never show up as calls in the profiler's Python stacks; the
    site is still their exact line. A frame outside the project (here: this test file)
    is walked past to the project's innermost one."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "ops.py").write_text("def f(x):\n    y = x + 1\n    if y.sum() > 0:\n"
                                   "        y = y * 2\n    return y\n")
    spec = importlib.util.spec_from_file_location("proj_ops", folder / "ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.ones(3)
    sources = attribute_call(lambda: module.f(x), ProjectFiles(folder))
    syncs = sources.of("host_syncs")
    assert [(e.op, e.site.text()) for e in syncs] == [("aten::is_nonzero", "ops.py:3 in f()")]
    ops = {(e.op, e.site.line) for e in sources.of("op_calls")}
    assert {("aten::add", 2), ("aten::sum", 3), ("aten::gt", 3), ("aten::mul", 4)} <= ops
    outside = attribute_call(lambda: x.sum(), ProjectFiles(folder))
    assert {e.site for e in outside.entries} == {None}


def test_sources_round_trip_through_json():
    sources = Sources((SourceCount("host_syncs", "aten::item", Site("a.py", 3, "f"), 2),
                       SourceCount("allocations", "aten::empty", None, 1)))
    assert Sources.from_json(json.loads(json.dumps(sources.as_json()))) == sources
    with pytest.raises(ValueError, match=r"sources\[0\]: expected counter, op, site and count"):
        Sources.from_json([{"counter": "host_syncs"}])


# --- the gate's counters check on a user's project ----------------------------------------

OPS = "import torch\n\n\ndef scale(x):\n    return x / x.abs().max()\n"
PLANTED_OPS = ("import torch\n\n\ndef scale(x):\n    peak = x.abs().max().item()  # host sync\n"
               "    return x / peak\n")
FINDINGS = """
import torch
from harness import Case, Finding, max_abs_difference, register
from mylib.ops import scale

register(Finding(
    id="MY-scale", title="scale", claim="scale() does not sync the host",
    variants=("torch", "mylib"), baseline="torch", cases=[Case.of(n=64)],
    build=lambda case, device, seed: torch.rand(case["n"], generator=torch.Generator().manual_seed(seed)),
    make_call=lambda variant, x: (lambda: x / x.abs().max()) if variant == "torch" else (lambda: scale(x)),
    check=max_abs_difference, tolerance=1e-6,
))
"""


def _gate(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "harness.gate", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
def test_the_gate_names_the_line_a_change_added(tmp_path):
    project = tmp_path / "project"
    (project / "mylib").mkdir(parents=True)
    (project / "mylib" / "__init__.py").write_text("")
    (project / "mylib" / "ops.py").write_text(OPS)
    (project / "bench_findings.py").write_text(FINDINGS)
    (project / "pyproject.toml").write_text(
        '[tool.esper-bench]\nfindings-modules = ["bench_findings"]\nbaseline = "counters.json"\n')
    done = _gate(project, "--update-baseline")
    assert done.returncode == 0, done.stderr
    (project / "mylib" / "ops.py").write_text(PLANTED_OPS)
    done = _gate(project, "--counters", "--json", str(tmp_path / "rows.json"))
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["variant"]: r for r in json.loads((tmp_path / "rows.json").read_text())["rows"]}
    assert rows["torch"]["outcome"] == "pass" and rows["torch"]["note"] == ""
    assert rows["mylib"]["outcome"] == "regression"
    assert ("host syncs 0 -> 1: +1 aten::item at mylib/ops.py:5 in scale()"
            in rows["mylib"]["note"]), rows["mylib"]
    assert "host syncs 0 -> 1: +1 aten::item at mylib/ops.py:5 in scale()" in done.stdout
