"""Gate check b: speed ratios measured within one process, held to committed thresholds.

An invariant says "variant `fast` is at least `min_speedup` times faster than `slow` on
this quick case of this finding". Both are timed in the same process, interleaved
(A B A B ...), so the ratio does not depend on how fast or busy the machine is. The
check fails only when the whole bootstrap 95% interval of the speedup lies below the
threshold; an interval that straddles it is reported as inconclusive, not failed.

Thresholds are set far below the measured speedup (`measured_speedup / min_speedup`, the
margin, is 2.5-3.2), so noise does not trip them while a variant that loses most of its
advantage does. The config (`--config`, or the findings modules' `Defaults.invariants`)
names variants by name; one not available on this machine (a variant its finding skips
here) is skipped with a message. Timing runs at `harness.run`'s thread count unless the
config's `sampling.threads` (or the gate's --threads) names one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import findings as registry
from harness.exits import read_json
from harness.findings import Case, Finding
from harness.gate.table import GateRow, Outcome, UsageError
from harness.measure.estimate import rounds_estimate
from harness.measure.stats import RatioCI
from harness.measure import timing
from harness.measure.timing import CpuClock, Measurement, measure_interleaved, pinned_threads
from harness.progress import Progress
from harness.ranks import timing_threads

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Sampling:
    """How each finding x case is timed (arguments of `measure_interleaved`)."""

    threads: int | None
    """torch threads while timing; None (the field left out): `harness.run`'s default
    (`harness.ranks.timing_threads`), so that the gate times the regime the run reports."""
    min_samples: int
    max_samples: int
    time_budget_s: float
    """Seconds of sampling per finding x case (warm-up and calibration apart)."""
    min_sample_time: float
    """Seconds one sample lasts at least (calls per sample are calibrated to it)."""


@dataclass(frozen=True)
class Invariant:
    """`fast` is at least `min_speedup` x faster than `slow` on one quick case."""

    id: str
    finding: str
    case: dict
    """The quick case's parameters, e.g. {"rows": 256, "cols": 64}."""
    fast: str
    slow: str
    min_speedup: float
    """The threshold: time(slow) / time(fast) must not be shown to be below it."""
    measured_speedup: float
    """The speedup measured when the threshold was set (for the margin)."""

    @property
    def margin(self) -> float:
        """How far below the measured speedup the threshold sits (x)."""
        return self.measured_speedup / self.min_speedup


@dataclass(frozen=True)
class InvariantConfig:
    sampling: Sampling
    invariants: tuple[Invariant, ...]


# ------------------------------------------------------------------------------- the config

def _field(mapping: dict, name: str, kind: type | tuple[type, ...], where: str):
    """`mapping[name]` checked against `kind`; UsageError naming the field otherwise."""
    if name not in mapping:
        raise UsageError(f"{where}.{name}: expected {_kind_name(kind)}; the field is missing")
    value = mapping[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UsageError(f"{where}.{name}: expected {_kind_name(kind)}; got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if kind == (int, float):
        return "a number"
    return {str: "a string", int: "an integer", dict: "an object", list: "a list"}[kind]


def _positive(mapping: dict, name: str, where: str) -> float:
    """`mapping[name]`, a finite number > 0; UsageError naming the field otherwise."""
    value = _field(mapping, name, (int, float), where)
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{where}.{name}: expected a finite number > 0; got {value!r}")
    return float(value)


def parse_config(document: object, source: str) -> InvariantConfig:
    """An InvariantConfig from parsed JSON; UsageError naming the field, expected and received."""
    if not isinstance(document, dict):
        raise UsageError(f"{source}: expected a JSON object; got {type(document).__name__}")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UsageError(f"{source}: schema_version: expected {SCHEMA_VERSION}; got {version!r}")
    raw = _field(document, "sampling", dict, source)
    where = f"{source}: sampling"
    sampling = Sampling(
        threads=_field(raw, "threads", int, where) if "threads" in raw else None,
        min_samples=_field(raw, "min_samples", int, where),
        max_samples=_field(raw, "max_samples", int, where),
        time_budget_s=_positive(raw, "time_budget_s", where),
        min_sample_time=_positive(raw, "min_sample_time", where),
    )
    for name, low in (("threads", 1), ("min_samples", 2), ("max_samples", sampling.min_samples)):
        if getattr(sampling, name) is not None and getattr(sampling, name) < low:
            raise UsageError(f"{where}.{name}: expected an integer >= {low}; "
                             f"got {getattr(sampling, name)}")
    listed = _field(document, "invariants", list, source)
    if not listed:  # a check of nothing would pass by accident
        raise UsageError(f"{source}: invariants: expected at least one invariant; got []")
    invariants, ids = [], set()
    for index, entry in enumerate(listed):
        where = f"{source}: invariants[{index}]"
        if not isinstance(entry, dict):
            raise UsageError(f"{where}: expected an object; got {entry!r}")
        invariant = Invariant(
            id=_field(entry, "id", str, where),
            finding=_field(entry, "finding", str, where),
            case=_field(entry, "case", dict, where),
            fast=_field(entry, "fast", str, where),
            slow=_field(entry, "slow", str, where),
            min_speedup=_positive(entry, "min_speedup", where),
            measured_speedup=_positive(entry, "measured_speedup", where),
        )
        if invariant.id in ids:
            raise UsageError(f"{where}.id: expected a unique id; got {invariant.id!r} again")
        ids.add(invariant.id)
        invariants.append(invariant)
    return InvariantConfig(sampling=sampling, invariants=tuple(invariants))


def load_config(path: Path) -> InvariantConfig:
    """Read and validate the invariants config; UsageError naming the file and what is wrong
    (missing, unreadable, not UTF-8, truncated, a bad field)."""
    if not path.exists():
        raise UsageError(f"no invariants config at {path}")
    return parse_config(read_json(path), str(path))


# ----------------------------------------------------------------------------- measuring

def _quick_case(finding: Finding, params: dict, invariant_id: str) -> Case:
    for case in finding.cases(True):
        if dict(case.params) == params:
            return case
    labels = "; ".join(c.label for c in finding.cases(True))
    raise UsageError(f"invariant {invariant_id}: case: expected one of the quick cases of "
                     f"{finding.id} ({labels}); got {params}")


def _skip_reason(finding: Finding, case: Case, variant: str) -> str | None:
    if variant not in finding.variants:
        return (f"{variant!r} is not available on this machine "
                f"({finding.id} variants: {', '.join(finding.variants)})")
    if variant in finding.peers:
        return f"{variant!r} is a peer (another library's code): the gate times only ours"
    return finding.skip(variant, case, torch.device("cpu"))


def _row(invariant: Invariant, case: Case, outcome: Outcome, *, current: str = "",
         change: str = "", note: str = "", ci: RatioCI | None = None) -> GateRow:
    return GateRow(
        check=f"invariant {invariant.id}", finding=invariant.finding,
        variant=f"{invariant.fast} vs {invariant.slow}", case=case.label,
        baseline=f">= {invariant.min_speedup:g}x faster (measured {invariant.measured_speedup:g}x, "
                 f"margin {invariant.margin:.1f}x)",
        current=current, change=change, outcome=outcome, note=note, ci=ci,
        threshold=invariant.min_speedup,
    )


def judge(invariant: Invariant, case: Case, slow: Measurement, fast: Measurement,
          seed: int = 0) -> GateRow:
    """The row for one invariant from its two measurements.

    The speedup is slow / fast from the rounds both were sampled in (the paired estimate
    of `harness.measure.estimate`) with its 95% interval; the invariant fails when the
    interval's upper end is below `min_speedup`.
    """
    rounds = min(slow.n, fast.n)
    estimate = rounds_estimate(slow.samples[:rounds], fast.samples[:rounds])
    low, high = estimate.interval(0.95)
    ci = RatioCI(ratio=estimate.ratio, low=low, high=high)  # ratio = the speedup
    if ci.high < invariant.min_speedup:
        outcome = Outcome.REGRESSION
    elif ci.low >= invariant.min_speedup:
        outcome = Outcome.PASS
    else:
        outcome = Outcome.INCONCLUSIVE
    return _row(invariant, case, outcome,
                current=f"{ci.ratio:.3g}x [{ci.low:.3g}, {ci.high:.3g}]",
                change=f"{ci.ratio / invariant.min_speedup:.2g}x the threshold", ci=ci)


def timing_threads_of(config: InvariantConfig, threads: int | None = None) -> int:
    """The torch threads check b times with: `threads` (--threads), else the config's,
    else `harness.run`'s default."""
    return threads or config.sampling.threads or timing_threads()


def check_invariants(config: InvariantConfig, *, seed: int = 0,
                     threads: int | None = None) -> list[GateRow]:
    """Check b: time each finding x case once (the union of its invariants' variants), judge
    each, at `timing_threads_of(config, threads)` torch threads."""
    device = torch.device("cpu")
    resolved = []
    for invariant in config.invariants:
        try:
            finding = registry.select([invariant.finding])[0]
        except ValueError as err:
            raise UsageError(f"invariant {invariant.id}: finding: {err}") from err
        resolved.append((invariant, finding, _quick_case(finding, invariant.case, invariant.id)))
    rows: dict[str, GateRow] = {}
    groups: dict[tuple[str, str], list] = {}
    for invariant, finding, case in resolved:
        reasons = [r for r in (_skip_reason(finding, case, v) for v in (invariant.fast, invariant.slow)) if r]
        if reasons:
            rows[invariant.id] = _row(invariant, case, Outcome.SKIPPED, note="; ".join(reasons))
        else:
            groups.setdefault((finding.id, case.label), []).append((invariant, finding, case))
    s = config.sampling
    with pinned_threads(timing_threads_of(config, threads)), Progress(len(groups), "cell") as progress:
        for members in groups.values():
            _, finding, case = members[0]
            progress.describe(f"invariants {finding.id}")
            variants = [v for v in finding.variants
                        if any(v in (inv.fast, inv.slow) for inv, _, _ in members)]
            try:
                inputs = finding.build(case, device, seed)
                calls = {v: finding.make_call(v, inputs) for v in variants}
                measured = measure_interleaved(
                    calls, CpuClock(), finding=finding.id, case=case.label,
                    sampling=timing.Sampling(min_rounds=s.min_samples,
                                             max_rounds=s.max_samples,
                                             time_budget_s=s.time_budget_s,
                                             min_sample_time=s.min_sample_time,
                                             sequential=False, seed=seed),
                )
            except Exception as err:  # the current code cannot run the case: error rows
                for invariant, _, _ in members:
                    rows[invariant.id] = _row(invariant, case, Outcome.ERROR,
                                              note=f"{type(err).__name__}: {err}")
                progress.step(f"invariants {finding.id} {case.label}", "error")
                continue
            for invariant, _, _ in members:
                rows[invariant.id] = judge(invariant, case, measured[invariant.slow],
                                           measured[invariant.fast], seed)
            progress.step(f"invariants {finding.id} {case.label}")
    return [rows[invariant.id] for invariant in config.invariants]
