"""Measure one cell (a finding at one case) in one process: inputs, correctness gate,
timing, profile.

`CaseRun(finding, case, options).run()` does, in order (DESIGN.md, data flow):
  1. `prepare`: inputs built once from the seed, and each variant called once and checked
     against the reference: a mismatch is a `mismatch` row carrying the max error and that
     variant is not timed there;
  2. `time`: the variants that agree are timed together, interleaved, on the device's
     clock, for this process's share of the cell's sampling seconds;
  3. `finish`: a separate profiling pass counts ops, syncs, allocations and kernel
     launches (and, at a finding's first case, its profiles make the Chrome trace); each
     variant's time ratio to the baseline from this process's rounds, its interval and
     word (provisional: the run words every row again from all its processes,
     `harness.combine`); for a finding that counts its bytes (`Recording.min_bytes`), the
     achieved bandwidth per variant and the case's bandwidth floor and label.
The run's other processes (`harness.replica`) time the same cell with `check=False` and
the variants this one found correct (`timed`). A variant that raises is recorded as a
`failed` row with its error; the run goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import tempfile
import time
import traceback
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harness.measure.bandwidth import bound_label, working_set_bandwidth
from harness.measure.counters import profile_call
from harness.findings import PLACEBO, Case, Finding
from harness.measure.decision import DEFAULT_MARGIN
from harness.combine import word_fields
from harness.measure.estimate import rounds_estimate
from harness.measure.stats import Verdict, paired_difference_ci
from harness.measure.timing import (
    Measurement, Sampling, VariantError, make_clock, measure_interleaved, pinned_threads,
)
from harness.measure.trace import merge_traces
from harness.plan import BUDGET_UNPROFILED
from harness.results import Status, raise_if_disk_full

#: what `RunOptions.placebo` may be: the placebo in each finding's headline cell, in
#: every cell, or nowhere
PLACEBO_MODES = ("headline", "all", "none")
#: why a worker leaves out a variant: the run's own process did not time it (it failed or
#: disagreed there)
NOT_TIMED_HERE = "not timed by the run's own process"


@dataclass(frozen=True)
class RunOptions:
    """How much and where to measure."""

    device: torch.device
    quick: bool = False
    seed: int = 0
    budget_s: float = 140.0
    """The run's wall seconds, report included: the planner shares its sampling out over
    the cells and their processes (`harness.plan`)."""
    min_samples: int = 8
    """Rounds always taken in each process, and the first check of the words."""
    max_samples: int = 200
    margin: float = DEFAULT_MARGIN
    """The practical margin of the words: within it either way is *same*."""
    precision: float = 0.03
    """A variant stops sampling once its word is decided and its ratio's interval
    half-width is at most this fraction of it; 0: every variant samples the whole budget."""
    placebo: str = "headline"
    """Where the baseline is also timed against a second copy of itself (PLACEBO_MODES)."""
    processes: int = 2
    """Fresh processes that time every cell: the run's own and `processes - 1` workers
    (`harness.replica`); rows whose processes disagree get more."""
    report_s: float = 0.0
    """Seconds the run keeps at its end to combine its rows and render its report
    (`harness.plan.report_s`)."""
    report: bool = False
    """Whether the run renders its report after its last cell (`harness.run` without
    --no-report): a cold run then loads the report's modules while a core is idle."""
    every_cell: bool = False
    """Measure every cell, however long: the budget shares out sampling and profiles only
    (else a cell past the budget, not a headline, is left out: `harness.plan`)."""
    profile: bool = True
    sources: bool = False
    """With the profile: also split each variant's counters by the line of the project's
    code that made each op (`harness.explain`), for report --compare and --markdown."""
    copy_bandwidth_bytes_per_s: float | None = None
    """The device's large-copy bandwidth (`harness.measure.bandwidth`), measured once per run;
    None: no bandwidth floor in the rows."""

    def sampling(self, finding: Finding, seconds: float,
                 min_rounds: int | None = None) -> Sampling:
        """The sampling of one of `finding`'s cells in one process: `seconds` of rounds,
        at least `min_rounds` of them (None: `min_samples`)."""
        return Sampling(
            time_budget_s=seconds,
            min_rounds=self.min_samples if min_rounds is None else min_rounds,
            max_rounds=self.max_samples,
            # paired: every variant makes the same calls, one per sample, and no warm-up
            # call beyond the timed first one: the prepared cell made each variant's first
            # call already, alike (two more were 8 training iterations a process, 10 s)
            min_sample_time=None if finding.recording.paired else 1e-3,
            warmup=0 if finding.recording.paired else Sampling.warmup,
            sequential=self.precision > 0, precision=self.precision,
            margin=finding.margin_under(self.margin), seed=self.seed, paired=finding.recording.paired)


def check_takes(check) -> tuple[type, ...] | None:
    """The types a finding's `check` takes as the variant's output (its first parameter's
    annotation: `torch.Tensor` for `max_abs_difference`), or None where it does not say
    (no annotation, `object`, one that does not resolve)."""
    try:
        first = next(iter(inspect.signature(check).parameters))
        annotation = typing.get_type_hints(check).get(first)
    except (ValueError, TypeError, NameError, AttributeError, StopIteration):  # it cannot say
        return None
    if annotation is None:
        return None
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = tuple(typing.get_origin(a) or a
                  for a in (typing.get_args(annotation) if union else (annotation,)))
    if not all(isinstance(kind, type) for kind in kinds) or object in kinds:
        return None
    if float in kinds or complex in kinds:  # an int is a float to an annotation (PEP 484)
        kinds += (int,)
    return kinds


def describe_error(err: BaseException) -> str:
    """`TypeError: message (at file.py:123)`: short, with where it was raised."""
    if isinstance(err, VariantError):
        err = err.original
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


#: how much slower the profiler makes a call, to foresee a profile's cost: about 20x for
#: a Python loop of small ops (the most it records per second), less for calls of few ops
PROFILER_SLOWDOWN = 20.0
#: a profile foreseen to take at most this many seconds is always taken
PROFILE_ALWAYS_S = 1.0


def _dynamo_frames() -> int:
    """Frames torch.compile (dynamo) has traced in this process so far; 0 before it is
    imported (it is not imported here: a second)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return 0 if utils is None else int(utils.counters["frames"]["total"])


class CaseRun:
    """Everything measured for one finding x case; `summary` and `samples` are the rows."""

    def __init__(self, finding: Finding, case: Case, options: RunOptions,
                 headline: bool = False, sampling_s: float = 1.0, process: int = 1,
                 timed: Sequence[str] | None = None, check: bool = True) -> None:
        self.finding, self.case, self.options = finding, case, options
        self.headline = headline
        """Whether this is the finding's headline case (`Reading.headline_case`)."""
        self.sampling_s = sampling_s
        """Seconds of rounds this process takes of the cell (the planner's share)."""
        self.process = process
        """Which of the run's processes this is (1: the run's own), in its sample rows."""
        self.timed_only = None if timed is None else tuple(timed)
        """The variants to time (the others are left out, said so); None: every one."""
        self.check = check
        """Whether outputs are checked against the reference (the run's own process does;
        its workers time the variants it found correct)."""
        placebo = options.placebo == "all" or (headline and options.placebo == "headline")
        self.variants: tuple[str, ...] = finding.variants + ((PLACEBO,) if placebo else ())
        """The finding's variants, and the placebo where this cell times one."""
        self.cells: dict[str, dict] = {v: {} for v in self.variants}
        self.measurements: dict[str, Measurement] = {}
        self.inputs = None
        self.placebo_inputs = None
        """The placebo's inputs: the variants' own (every variant is timed on one build's
        inputs, so the placebo stands where they stand: on a second copy of its own, data
        the variants never touch, it reads slower as that copy goes cold in the caches);
        for a paired finding a second build from the same seed, whose state its calls
        advance in lockstep with the baseline's."""
        self.min_rounds = options.min_samples
        """Rounds this process takes at least (`RunOptions.min_samples`, or fewer where the
        run's plan cannot pay them: `round_s`)."""
        self.seconds: dict[str, float] = {}
        """Wall seconds per stage of `run` (build, check, time, profile, extra)."""
        self.sample_metrics: dict[str, list[dict[str, float]]] = {}
        """variant -> `Recording.sample_metrics` of each sample, in sample order."""
        self.traced_at: dict[str, int] = {}
        """variant -> torch's thread count when torch.compile traced its first call."""
        self.load: dict[str, float | bool] = {}
        """While its processes timed it, what other processes ran (`ranks.LoadWatch`):
        `others_busy_cores` and `timed_beside_load` (the cell's threads shared a core
        with them), on each of its summary rows; empty where nothing was timed."""

    # ------------------------------------------------------------------ steps

    def run(self, trace_path: Path | None = None) -> "CaseRun":
        """Every step in this process: `prepare`, `time`, `finish`."""
        return self.prepare().time().finish(trace_path)

    def prepare(self) -> "CaseRun":
        """Skips, inputs, each variant's first call and (with `check`) its check."""
        f, options = self.finding, self.options
        self._skip()
        if not self._active():
            return self
        try:
            with self._stage("build"):
                self.inputs = f.build(self.case, options.device, options.seed)
        except Exception as err:  # recorded on every row of the case; the run goes on
            for variant in self._active():
                self._fail(variant, err, "building inputs")
            return self
        with self._stage("check"):
            outputs = self._first_calls()
            if self.check:
                self._check(outputs)
        if PLACEBO in self._active() and f.baseline not in self._active():
            self.cells[PLACEBO].update(status=Status.NOT_TIMED,
                                       reason=f"the baseline {f.baseline} was not timed here")
        if PLACEBO in self._active():
            try:
                self.placebo_inputs = self.inputs
                if f.recording.paired:
                    with self._stage("build"):
                        self.placebo_inputs = f.build(self.case, options.device, options.seed)
                # its first call, as every variant had one (not checked: the baseline's
                # code); a paired finding's copy then holds the baseline's state, so that
                # its calls, which advance state, pair iteration k with iteration k
                with self._stage("check"):
                    self._call(PLACEBO)()
            except Exception as err:  # the placebo is the baseline's code: said, not fatal
                self._fail(PLACEBO, err, "building the placebo's inputs or its first call")
        return self

    def trace_at_timed_threads(self) -> None:
        """Call once more, at torch's thread count now (the one the cell is timed at), each
        variant whose first call torch.compile traced at another (the processes' first
        calls share the cores, `pinned_threads`): dynamo guards a graph on the thread count,
        so the first timed round would trace it again (0.5-1 s for a scan graph
        here) inside the timing, which the processes take in turn; here they take it at
        once. Not for a paired finding, whose calls advance its state in lockstep.

        The trace is pinned at those threads (`pinned_threads`) wherever it is called:
        inductor's cpp.threads is a key of its disk cache, and the run's own process, which
        nothing else pins, compiled the graph again under its default (4 s of a cold
        run's first cell) instead of loading what the first call compiled."""
        if self.finding.recording.paired:
            return
        threads = torch.get_num_threads()
        for variant, traced_at in self.traced_at.items():
            if traced_at == threads or variant not in self._active():
                continue
            try:
                with self._stage("check"), pinned_threads(threads):
                    self._call(variant)()
            except Exception as err:  # as a first call that crashed
                self._fail(variant, err, f"a second call, at {threads} threads")

    def round_s(self) -> float:
        """Seconds of one round of the prepared cell, foreseen from the first calls (one
        call of each variant it will time; compiling ones make it an upper bound)."""
        timed = self._active()
        first = {v: self.cells[v].get("first_output_s", 0.0) for v in timed}
        if PLACEBO in timed:  # the baseline's code
            first[PLACEBO] = first.get(self.finding.baseline, 0.0)
        return float(sum(first.values()))

    def timed_variants(self) -> list[str]:
        """The variants the prepared cell will time (those that agreed, or were not
        checked)."""
        return self._active()

    def time(self) -> "CaseRun":
        """This process's rounds of the prepared cell."""
        if self._active():
            with self._stage("time"):
                self._time()
        return self

    def finish(self, trace_path: Path | None = None,
               profile_s: float | None = None, extra_metrics: bool = True) -> "CaseRun":
        """Profile, extra metrics (unless `extra_metrics` is False: a worker, whose samples
        are all the run reads), this process's ratios and the bandwidth floor. The
        profile is left out (said in each row) where it would take more than `profile_s`
        seconds (the run's `Plan.spare_s`; None: no limit) and more than
        `PROFILE_ALWAYS_S`."""
        if self.options.profile and self.measurements:
            with self._stage("profile"):
                if self._profile_fits(profile_s):
                    self._profile(trace_path)
        with self._stage("extra"):
            if extra_metrics:
                self._extra_metrics()
            self._compare()
            self._bandwidth()
        return self

    @contextlib.contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        """Add the wall seconds of the body to `seconds[name]`: where a cell's time goes."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def fail_all(self, err: BaseException, stage: str) -> "CaseRun":
        """Record every variant of the cell as failed at `stage` (a cell that could not run)."""
        for variant in self.variants:
            self.cells[variant] = {}
            self._fail(variant, err, stage)
        return self

    def leave_out(self, reason: str) -> "CaseRun":
        """Record every variant of the cell as not timed, for `reason` (a cell the run's
        budget could not pay): rows that say why, and no failure."""
        for variant in self.variants:
            self.cells[variant] = {"status": Status.NOT_TIMED, "reason": reason}
        return self

    def leave_out_timed(self, reason: str) -> "CaseRun":
        """Record the variants the prepared cell would time as not timed, for `reason` (its
        least sampling past the run's budget); what its first calls and checks found
        (a failure, a mismatch) stays."""
        for variant in self._active():
            self.cells[variant].update(status=Status.NOT_TIMED, reason=reason)
        return self

    def _active(self) -> list[str]:
        return [v for v in self.variants if "status" not in self.cells[v]]

    def _call(self, variant: str):
        """The timed call of `variant` (the placebo: the baseline's, on `placebo_inputs`)."""
        return self.finding.make_call(self._code(variant), self._inputs_of(variant))

    def _inputs_of(self, variant: str):
        return self.placebo_inputs if variant == PLACEBO else self.inputs

    def _code(self, variant: str) -> str:
        """The finding's variant whose code `variant` runs (the placebo runs the baseline's)."""
        return self.finding.baseline if variant == PLACEBO else variant

    def _fail(self, variant: str, err: BaseException, stage: str) -> None:
        self.cells[variant].update(status=Status.FAILED, error=f"{stage}: {describe_error(err)}")

    def leave_out_all_but(self, timed: Sequence[str]) -> None:
        """Time only `timed` of the variants still active (a worker that prepared every
        variant before the run's own process said which ones agreed)."""
        self.timed_only = tuple(timed)
        for variant in self._active():
            if variant not in self.timed_only:
                self.cells[variant].update(status=Status.NOT_TIMED, reason=NOT_TIMED_HERE)

    def _skip(self) -> None:
        for variant in self.variants:
            if self.timed_only is not None and variant not in self.timed_only:
                self.cells[variant].update(status=Status.NOT_TIMED, reason=NOT_TIMED_HERE)
                continue
            reason = self.finding.skip(self._code(variant), self.case, self.options.device)
            if reason == "needs CUDA":
                self.cells[variant].update(status=Status.NEEDS_CUDA, reason=reason)
            elif reason:
                self.cells[variant].update(status=Status.NOT_TIMED, reason=reason)

    def _first_calls(self) -> dict[str, object]:
        """Each variant's first output (the placebo is the baseline's code: not checked);
        one of a kind the finding's check does not take fails here, named."""
        outputs = {}
        taken = check_takes(self.finding.check)
        for variant in self._active():
            if variant == PLACEBO:
                continue
            started, frames = time.perf_counter(), _dynamo_frames()
            try:
                output = self._call(variant)()
            except Exception as err:  # a crashing variant is a row, not the end of the run
                self._fail(variant, err, "first call")
                continue
            if _dynamo_frames() > frames:
                self.traced_at[variant] = torch.get_num_threads()
            # where compiling happens (torch.compile, numba): a cold cache shows here
            self.cells[variant]["first_output_s"] = time.perf_counter() - started
            if taken is not None and not isinstance(output, taken):
                self.cells[variant].update(status=Status.FAILED, error=(
                    f"first call: {self.finding.id} {variant}: its call returned a "
                    f"{type(output).__name__}; the finding's check "
                    f"{getattr(self.finding.check, '__qualname__', self.finding.check)} takes "
                    f"a {' or '.join(kind.__name__ for kind in taken)} (make_call must return a "
                    "callable whose result the check can compare with the reference)"))
                continue
            outputs[variant] = output
        return outputs

    def _check(self, outputs: dict[str, object]) -> None:
        f = self.finding
        if f.check is None:
            return
        if f.reference is not None:
            try:
                reference = f.reference(self.inputs)
            except Exception as err:
                for variant in self._active():
                    self._fail(variant, err, "reference")
                return
        elif f.baseline in outputs:
            reference = outputs[f.baseline]
        else:
            for variant in self._active():
                self.cells[variant].update(status=Status.NOT_TIMED,
                                           reason="no reference: the baseline did not run")
            return
        tolerance = f.tolerance(self.case, self.options.device)
        for variant in self._active():
            if variant == PLACEBO:
                continue
            try:
                error = float(f.check(outputs[variant], reference))
            except Exception as err:
                self._fail(variant, err, f"correctness check, of the "
                                         f"{type(outputs[variant]).__name__} its call returned")
                continue
            self.cells[variant]["max_error"] = error
            if not error <= tolerance:  # NaN fails too
                self.cells[variant].update(
                    status=Status.MISMATCH,
                    reason=f"max error {error:.3g} > tolerance {tolerance:.3g}",
                )

    def _time(self) -> None:
        f = self.finding
        while self._active():
            calls = {v: self._call(v) for v in self._active()}
            sampling = self.options.sampling(f, self.sampling_s, self.min_rounds)
            if PLACEBO in calls and len(calls) > 1:  # the placebo brings its own share
                own = len(calls) - 1
                sampling = dataclasses.replace(
                    sampling, time_budget_s=sampling.time_budget_s * (own + 1) / own)
            self.sample_metrics = {v: [] for v in calls}
            try:
                self.measurements = measure_interleaved(
                    calls, make_clock(self.options.device), finding=f.id, case=self.case.label,
                    sampling=sampling, reference=f.baseline,
                    after_sample=self._read_sample_metrics if f.recording.sample_metrics else None,
                )
                return
            except VariantError as err:  # drop it and time the others again
                self._fail(err.variant, err, f"timing ({err.phase})")
        self.measurements = {}

    def _read_sample_metrics(self, variant: str) -> None:
        self.sample_metrics[variant].append(
            dict(self.finding.recording.sample_metrics(self._code(variant), self._inputs_of(variant))))

    def _profile_fits(self, profile_s: float | None) -> bool:
        """Whether the cell's profile fits in `profile_s` seconds; where it does not, each
        timed variant's row says so, with what the profile would have taken."""
        limit = self.finding.recording.profile_max_s
        medians = [m.median for v, m in self.measurements.items()
                   if v != PLACEBO and (limit is None or m.median <= limit)]
        cost = PROFILER_SLOWDOWN * sum(medians)
        if profile_s is None or cost <= max(profile_s, PROFILE_ALWAYS_S):
            return True
        for variant in self.measurements:
            if variant != PLACEBO:
                self.cells[variant]["profile_note"] = (
                    f"{BUDGET_UNPROFILED}: it had {profile_s:.0f} s left for this "
                    f"cell's profile, which takes about {cost:.2g} s (one call of each "
                    f"variant, ~{PROFILER_SLOWDOWN:g}x slower under the profiler); a larger "
                    "--budget profiles it")
        return False

    def _profile(self, trace_path: Path | None) -> None:
        """Counters of each variant from one profiled call; with `trace_path`, the same
        profiles merged into the cell's Chrome trace (`harness.measure.trace`)."""
        device, limit = self.options.device, self.finding.recording.profile_max_s
        with tempfile.TemporaryDirectory(prefix="esper-bench-trace-") as scratch:
            parts: dict[str, Path] = {}
            for index, variant in enumerate(list(self.measurements)):
                if variant == PLACEBO:  # the baseline's code: its counts are the baseline's
                    continue
                median = self.measurements[variant].median
                if limit is not None and median > limit:
                    self.cells[variant]["profile_note"] = (
                        f"not profiled: one call takes {median:.3g} s and this finding profiles "
                        f"calls up to {limit:g} s (the profiler slows op-heavy calls "
                        f"~{PROFILER_SLOWDOWN:g}x)")
                    continue
                part = Path(scratch) / f"{index}.json" if trace_path is not None else None
                try:
                    counters = profile_call(self._call(variant), device,
                                            None if part is None else str(part))
                except Exception as err:
                    self._fail(variant, err, "profiling")
                    del self.measurements[variant]
                    continue
                self.cells[variant].update(counters.as_row())
                if part is not None:
                    parts[variant] = part
            if trace_path is not None and parts:
                try:
                    merge_traces(parts, trace_path)
                except OSError as err:  # a full disk is the user's to fix: exit 2, named
                    raise_if_disk_full(err, trace_path)
                    raise

    def _extra_metrics(self) -> None:
        if self.finding.recording.extra_metrics is None:
            return
        for variant in list(self.measurements):
            if variant == PLACEBO:
                continue
            try:
                self.cells[variant].update(self.finding.recording.extra_metrics(variant, self.inputs))
            except Exception as err:
                self._fail(variant, err, "extra metrics")
                del self.measurements[variant]

    def _compare(self) -> None:
        """Each variant's ratio to the baseline, its interval and its word; where the
        baseline was not timed in this case (e.g. the loop at sizes where it would take
        minutes), to the first timed variant instead, named in `compared_to` so that no
        ratio is read against the wrong denominator."""
        timed = [v for v in self.variants if v in self.measurements]
        if not timed:
            return
        reference = self.finding.baseline if self.finding.baseline in timed else timed[0]
        base = self.measurements[reference]
        for variant in timed:
            m = self.measurements[variant]
            cell = self.cells[variant]
            cell.update(status=Status.OK, n=m.n, median_s=m.median, iqr_s=m.iqr,
                        number_per_sample=m.number_per_sample,
                        first_call_s=m.first_call_seconds, stopped_by=m.stopped_by.value,
                        precision_reached=m.precision_reached, compared_to=reference,
                        call_overhead_s=m.call_overhead_s)
            if variant == reference:
                cell["verdict"] = Verdict.BASELINE
                if reference != self.finding.baseline:
                    cell["reason"] = (f"stands in for the baseline {self.finding.baseline}, "
                                      "not timed in this case")
                continue
            cell.update(self._words(m, base, variant, reference))
        self._compare_sample_metrics(reference, timed)

    def _words(self, m: Measurement, base: Measurement, variant: str, reference: str) -> dict:
        """The ratio of `m` to `base` over the rounds `m` was sampled in (a variant that
        stopped early is compared with the baseline's samples of the same rounds), its
        interval at the level its checks used and its word: this process's alone, until
        the run words the row from all its processes (`harness.combine`)."""
        margin = self.finding.margin_under(self.options.margin)
        estimate = rounds_estimate(m.samples, base.samples[:m.n])
        info = {"claim_factor": self.finding.reading.claim_factor, "peers": self.finding.peers,
                "claim_tolerance": self.finding.reading.claim_tolerance}
        return word_fields(estimate, m.confidence, margin, variant, info,
                           placebo=variant == PLACEBO)

    def _compare_sample_metrics(self, reference: str, timed: list[str]) -> None:
        """Median of each sample metric per variant; in a paired finding, the per-round
        difference to `reference` with its interval (see `Recording.sample_metrics`), and
        of the time per call itself (`time_diff_s`, `time_diff_low_s`, `time_diff_high_s`:
        below 0, the variant saves time)."""
        base_time = self.measurements[reference].samples
        for variant in timed:
            times = self.measurements[variant].samples
            if self.finding.recording.paired and variant != reference and len(times) == len(base_time):
                diff, low, high = paired_difference_ci(times, base_time, seed=self.options.seed)
                self.cells[variant].update(time_diff_s=diff, time_diff_low_s=low,
                                           time_diff_high_s=high)
            per_sample = self.sample_metrics.get(variant) or []
            for name in per_sample[0] if per_sample else ():
                values = [s[name] for s in per_sample]
                self.cells[variant][name] = float(np.median(values))
                base = [s[name] for s in self.sample_metrics.get(reference) or []]
                if self.finding.recording.paired and variant != reference and len(base) == len(values):
                    diff, low, high = paired_difference_ci(values, base, seed=self.options.seed)
                    self.cells[variant].update({f"{name}_diff": diff, f"{name}_diff_low": low,
                                                f"{name}_diff_high": high})

    def _bandwidth(self) -> None:
        """Bytes moved per second and the floor, for a finding with `min_bytes`.

        Timed rows get `achieved_bytes_per_s` = min bytes / median. With floors asked for
        (the run measured its copy bandwidth), every row of the case gets `min_bytes`,
        `floor_s` (min bytes over the bandwidth of a working set of that size,
        `harness.measure.bandwidth.working_set_bandwidth`), `floor_level` (the memory
        that holds it: L1d, L2, L3, DRAM) and `bound`: `bound_label` of the fastest of our
        own variants (peers excluded) against the floor.
        """
        f = self.finding
        if f.recording.min_bytes is None:
            return
        nbytes = f.recording.min_bytes(self.case)
        for variant, m in self.measurements.items():
            self.cells[variant]["achieved_bytes_per_s"] = nbytes / m.median
        if self.options.copy_bandwidth_bytes_per_s is None:
            return
        speed, level = working_set_bandwidth(self.options.device.type, max(nbytes, 2))
        case_cells = {"min_bytes": nbytes, "floor_s": nbytes / speed, "floor_level": level}
        own = [m.median for v, m in self.measurements.items() if v not in (*f.peers, PLACEBO)]
        if own:
            case_cells["bound"] = bound_label(min(own), case_cells["floor_s"])
        for cell in self.cells.values():
            cell.update(case_cells)

    # ------------------------------------------------------------------ rows

    def _base(self) -> dict:
        return {"finding": self.finding.id, "case": self.case.label,
                **{f"p_{k}": v for k, v in self.case.params},
                "device": str(self.options.device), "headline": self.headline}

    @property
    def summary(self) -> list[dict]:
        rows = []
        for variant in self.variants:
            cell = dict(self.cells[variant])
            status = cell.pop("status", None)
            verdict = cell.pop("verdict", status)
            status = getattr(status, "value", status)
            rows.append({**self._base(), "variant": variant,
                         "baseline": variant == self.finding.baseline,
                         "placebo": variant == PLACEBO,
                         "status": status, "verdict": getattr(verdict, "value", verdict),
                         **self.load, **cell})
        return rows

    @property
    def samples(self) -> list[dict]:
        """One row per sample: its process (`process`), its round (samples of one round of
        one process pair up across variants) and where in the round's shuffled order it
        was taken."""
        counters = {s["variant"]: s for s in self.summary}
        rows = []
        for variant, m in self.measurements.items():
            extra = {k: counters[variant].get(k) for k in
                     ("op_calls", "host_syncs", "allocations", "allocated_bytes", "kernel_launches")}
            per_sample = self.sample_metrics.get(variant) or [{}] * m.n
            positions = m.positions or (None,) * m.n
            for index, (seconds, metrics, position) in enumerate(
                    zip(m.samples, per_sample, positions)):
                rows.append({**self._base(), "variant": variant, "threads": m.key.threads,
                             "process": self.process, "sample": index, "round": index,
                             "position": position,
                             "seconds": seconds, "number_per_sample": m.number_per_sample,
                             **extra, **metrics})
        return rows
