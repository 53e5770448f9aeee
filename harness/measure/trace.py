"""One Chrome trace of a cell from the profiles of its variants.

Each variant is profiled on its own (`harness.measure.counters.profile_call`), so that its
counts are its own; those profiles also hold what a trace shows. Rather than profile every
variant a second time for one trace, the per-variant traces are merged: Kineto writes every
session of a process against one time base (`baseTimeNanoseconds`, `ts` in microseconds),
so their events line up on one timeline as they ran. Each variant's events are put under
a `variant:<name>` range, as a `record_function` around its call would have shown them
(without adding an op to what was counted).
"""

from __future__ import annotations

import gzip
import json
import os

import orjson

from harness.measure.counters import collector_paused
from collections.abc import Mapping
from pathlib import Path


def variant_range(name: str, events: list[dict]) -> dict | None:
    """A complete event (`ph` X) named `variant:<name>` spanning `events`' complete events
    on the host thread that ran first; None when there are none."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not spans:
        return None
    first = min(spans, key=lambda e: e["ts"])
    end = max(e["ts"] + e["dur"] for e in spans)
    return {"ph": "X", "cat": "user_annotation", "name": f"variant:{name}", "pid": first["pid"],
            "tid": first["tid"], "ts": first["ts"], "dur": end - first["ts"], "args": {}}


def merge_traces(parts: Mapping[str, Path], out: Path) -> Path:
    """Write `out` (gzip-compressed JSON) from the Chrome traces `parts` (variant name ->
    trace file, in the order they ran): the first part's document with every part's events,
    each part's under its `variant:<name>` range; metadata events (`ph` M) are kept once."""
    with collector_paused():  # JSON holds no reference cycles
        return _merge(parts, out)


def _merge(parts: Mapping[str, Path], out: Path) -> Path:
    document: dict | None = None
    events: list[dict] = []
    seen_metadata: set[str] = set()
    for name, path in parts.items():
        part = orjson.loads(path.read_bytes())
        if document is None:
            document = {k: v for k, v in part.items() if k != "traceEvents"}
        own = part.get("traceEvents", [])
        for event in own:
            if event.get("ph") == "M":
                key = json.dumps({k: event.get(k) for k in ("name", "pid", "tid", "args")},
                                 sort_keys=True)
                if key in seen_metadata:
                    continue
                seen_metadata.add(key)
            events.append(event)
        span = variant_range(name, own)
        if span is not None:
            events.append(span)
    if document is None:
        raise ValueError("parts: expected at least one trace; got none")
    document["traceEvents"] = events
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:  # a reader never sees half a trace
        # a training iteration's trace holds ~700k events: orjson serializes them ~10x
        # faster than json.dumps, and gzip level 1 ~3x faster than 6 (files ~20% larger)
        with gzip.open(temporary, "wb", compresslevel=1) as f:
            f.write(orjson.dumps(document))
        os.replace(temporary, out)
    finally:
        temporary.unlink(missing_ok=True)
    return out
