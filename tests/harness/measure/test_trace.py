"""A cell's Chrome trace merged from its variants' own profiles (harness.measure.trace)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from harness.measure.counters import profile_call
from harness.measure.trace import merge_traces


def _profiled(tmp_path, calls):
    parts = {}
    for index, (name, call) in enumerate(calls.items()):
        parts[name] = tmp_path / f"{index}.json"
        profile_call(call, "cpu", str(parts[name]))
    return parts


def test_variants_profiles_merge_into_one_timeline_under_their_ranges(tmp_path):
    x = torch.arange(256.0)
    parts = _profiled(tmp_path, {"sum": lambda: x.sum(), "cumsum": lambda: x.cumsum(0).exp()})
    out = merge_traces(parts, tmp_path / "traces" / "cell.json.gz")
    with gzip.open(out, "rt") as f:
        document = json.load(f)
    events = document["traceEvents"]
    ranges = {e["name"]: e for e in events if e["name"].startswith("variant:")}
    assert list(ranges) == ["variant:sum", "variant:cumsum"]
    first, second = ranges["variant:sum"], ranges["variant:cumsum"]
    assert first["ts"] + first["dur"] <= second["ts"]  # one timeline, in the order they ran
    ops = {name: [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                  and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]]
           for name, r in ranges.items()}
    assert "aten::sum" in {e["name"] for e in ops["variant:sum"]}
    assert {"aten::cumsum", "aten::exp"} <= {e["name"] for e in ops["variant:cumsum"]}
    assert "aten::cumsum" not in {e["name"] for e in ops["variant:sum"]}
    # every event of both parts, each metadata event once, and the two ranges
    def timed(evs):
        return [e for e in evs if e.get("ph") != "M"]
    total = sum(len(timed(json.loads(p.read_text())["traceEvents"])) for p in parts.values())
    assert len(timed(events)) == total + 2
    metadata = [json.dumps(e, sort_keys=True) for e in events if e.get("ph") == "M"]
    assert len(metadata) == len(set(metadata)) > 0
    assert document["baseTimeNanoseconds"] == json.loads(parts["sum"].read_text())["baseTimeNanoseconds"]
    assert not list(out.parent.glob(".*.tmp"))


def test_no_parts_is_an_error_that_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="parts: expected at least one trace; got none"):
        merge_traces({}, tmp_path / "t.json.gz")
    assert not (tmp_path / "t.json.gz").exists()
