"""The registry of findings: each review claim as data plus a few small functions.

A `Finding` names the claim (an id and the words of whoever made it), the variants
compared (one is the baseline), the cases (sizes) to run, how inputs are built from a
case, a device and a seed, how each variant is called, and optionally how its output is
checked against a reference. `register` adds it to the registry that `harness.run`,
`harness.report` and `harness.gate` work from. Findings live in modules of yours that
call `register`, named with `python -m harness.run --findings-module PKG.MODULE` or in
your `pyproject.toml` (`[tool.esper-bench] findings-modules = [...]`, `harness.project`);
the harness loads nothing else.

The public names are importable from `harness` itself::

    from harness import Case, Finding, max_abs_difference, register

Every field of `Finding` is checked when it is constructed: a wrong one is a
`ValueError` naming the finding, the field, what was expected and what was received.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import math
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch

from harness.findings.rounding import max_relative_error, rounding_tolerance, unit_roundoff
from harness.measure.numbers import is_real

Inputs = Any
Call = Callable[[], Any]

#: the variant name of the baseline timed against a second copy of itself (the placebo)
PLACEBO = "placebo"
#: a claimed speed-up in a claim's words: "~4x", "up to 25x", "about 3.5x"
_CLAIMED = re.compile(r"(?:~|\bup to\s+|\babout\s+|\baround\s+)\s*(\d+(?:\.\d+)?)\s*x\b",
                      re.IGNORECASE)


def claim_factor_of(claim: str) -> float | None:
    """The speed-up a claim states ("could be ~4x faster" -> 4.0), or None."""
    match = _CLAIMED.search(claim or "")
    return float(match.group(1)) if match else None


#: a finding id: a letter or digit, then letters, digits, `.`, `_` or `-` (it names files)
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Case:
    """One size/setting of a finding, e.g. `Case.of(rows=256, cols=64)`.

    `params` keep their order for display; `case["rows"]` reads one. The label
    (`rows=256,cols=64`) is the case's identity in results and baselines.
    """

    params: tuple[tuple[str, Any], ...]

    def __post_init__(self) -> None:
        pairs = self.params
        if (not isinstance(pairs, tuple) or not pairs
                or not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                           and p[0] for p in pairs)):
            raise ValueError("Case: params: expected at least one (name, value) pair with a "
                             f"non-empty str name, e.g. Case.of(n=64); got {pairs!r}")
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"Case: params: expected each name once; got {names}")

    @classmethod
    def of(cls, **params: Any) -> "Case":
        return cls(tuple(params.items()))

    def __getitem__(self, key: str) -> Any:
        return dict(self.params)[key]

    @property
    def label(self) -> str:
        """`rows=256,cols=64,dtype=float32`: the case's identity in results."""
        return ",".join(f"{k}={v}" for k, v in self.params)


def _never(variant: str, case: Case, device: torch.device) -> str | None:
    return None


def _exact(case: Case, device: torch.device) -> float:
    return 0.0


@dataclass(frozen=True)
class _Constant:
    """`tolerance` given as one number: the same for every case and device."""

    value: float

    def __call__(self, case: Case, device: torch.device) -> float:
        return self.value


@dataclass(frozen=True)
class _ForEveryDevice:
    """`tolerance` given as a function of the case alone: the same on every device."""

    of_case: Callable[[Case], float]

    def __call__(self, case: Case, device: torch.device) -> float:
        return self.of_case(case)


def _arguments(function: Callable) -> int | None:
    """How many positional arguments `function` takes, or None where Python cannot tell."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in parameters)


@dataclass(frozen=True)
class _Listed:
    """`cases` given as a list: the same cases for quick and full runs."""

    cases: tuple[Case, ...]

    def __call__(self, quick: bool) -> list[Case]:
        return list(self.cases)


@dataclass(frozen=True)
class About:
    """What a report says of a finding beyond its measurement: where the claim comes from,
    what the baseline reproduces, the fix as its source wrote it, and notes. Text only:
    nothing here changes what is measured. A finding checks it (`Finding.about`)."""

    ticket: str = ""
    """Where the claim comes from (a review ticket, an issue or pull-request link)."""
    reviewed: str = ""
    """The reviewed code the baseline reproduces: file, lines and commit, e.g.
    "src/mylib/buffer.py:347-416 @599f3895"."""
    fix: str = ""
    """The fix the proposed variant applies, as the review states it, with where it says so."""
    premise: str = ""
    """Where the review's premise does not hold at the reviewed commit: what the code there
    really does, with the evidence (file and lines). Empty: the premise holds."""
    notes: tuple[str, ...] = ()
    """What a reader should know about the setup (what is skipped and why); a list is accepted."""
    duration_s: tuple[float, float] | None = None
    """About how many seconds its quick and its default cases take on a 2-core CPU
    (`harness.run --list` shows it; a long finding should say)."""

    def check(self, bad: Callable[[str, str, Any], None]) -> None:
        """Each field's type, reported through the finding's `bad(field, expected, got)`;
        `notes` given as a list becomes a tuple."""
        for name in ("ticket", "reviewed", "fix", "premise"):
            if not isinstance(getattr(self, name), str):
                bad(f"about.{name}", "a str", getattr(self, name))
        notes = self.notes
        if isinstance(notes, str) or not isinstance(notes, (tuple, list)) or not all(
                isinstance(n, str) and n.strip() for n in notes):
            bad("about.notes", "a tuple of non-empty str", notes)
        object.__setattr__(self, "notes", tuple(notes))  # normalising the frozen instance
        duration = self.duration_s
        if duration is not None and not (
                isinstance(duration, tuple) and len(duration) == 2
                and all(is_real(v) and v >= 0 for v in duration)):
            bad("about.duration_s", "None or (quick seconds, default seconds), each >= 0",
                duration)


@dataclass(frozen=True)
class Recording:
    """How a finding's calls are sampled and what each records beside its time: paired
    rounds, the budget's weight, the profiling limit, extra numbers per variant and per
    sample, the phases of a call, the bytes it must move. `Finding.recording`."""

    paired: bool = False
    """Round k of every variant does the same work (e.g. iteration k of trainers built from
    one seed, which follow one trajectory): one call per sample, no calibration, and each
    ratio's interval is taken over the per-round ratios, so that what changes from one
    round to the next cancels out instead of widening the interval. The placebo of a
    paired finding runs on a second build of its own; every other finding's placebo calls
    the baseline's code on the variants' inputs, so where calls advance state (an env that
    trains, a batch iterator) their cost must not drift as calls accumulate, or the
    finding is paired."""
    budget_factor: float = 1.0
    """The weight of this finding's cells when the run shares its sampling seconds out
    (`--budget`; times the variants a cell times): more for a call so slow that one share
    holds only the minimum rounds (a training iteration of half a second, say), so that
    adaptive sampling can reach its precision. Sampling still stops as soon as it does."""
    profile_max_s: float | None = None
    """Calls slower than this (median seconds) get no profiling pass, so no counters: the
    profiler slows a call by the number of ops it records (about 20x for a Python loop of
    small ops), and such a call's counts scale with its size. None: profile every call."""
    extra_metrics: Callable[[str, Inputs], dict[str, float]] | None = None
    """(variant, inputs) -> extra per-variant numbers (phase seconds, host-blocked time)."""
    sample_metrics: Callable[[str, Inputs], dict[str, float]] | None = None
    """(variant, inputs) -> numbers about the call just sampled, read outside the timed
    region (e.g. that iteration's seconds per phase). Each sample row keeps them; each
    timed row gets their median, and in a paired finding each variant's row gets the
    per-round difference to the baseline, `<name>_diff` with `<name>_diff_low` /
    `<name>_diff_high` (95% bootstrap interval)."""
    phases: tuple[str, ...] = ()
    """Names of the phases one call is split into, in order, each timed per sample by
    `sample_metrics` as `phase_<name>_s`: the report then draws each variant's phase
    breakdown with Amdahl's prediction beside the measured change (a list is accepted)."""
    min_bytes: Callable[[Case], int] | None = None
    """case -> bytes one call must read and write at least; with the run's copy bandwidth,
    rows get the achieved bandwidth and the cell its bandwidth floor (`harness.measure.bandwidth`)."""
    caches_cold: Callable[[], bool] | None = None
    """() -> whether the disk caches its variants compile into on their first call
    (torch.compile, numba, Triton) hold nothing yet on this machine (a fresh machine or CI
    container); None: its variants compile nothing. Where it says so, the run prepares the
    finding's first cell once in a process of its own before any timing (inputs and every
    variant's first call, at the threads the cell's own processes prepare at) and ends
    that process, so that the processes timing it load what it compiled, as every later
    run's do: a process that compiled is not in the state of later runs (a fifth more
    objects here, other memory), and a first run's rows of the finding had read
    differently from the next run's, together."""
    compile_groups: tuple[tuple[str, ...], ...] = ()
    """The variants whose first calls compile, grouped by the disk cache they compile into,
    the slowest to compile first (e.g. `(("compiled",), ("numba", "auto"))`: a variant
    that calls another's compiled code goes in its group). Where `caches_cold` says the
    caches are cold, each group's first calls are made in a process of its own, the groups
    at once, as many as the run may use cores (on 2 cores a numba and a torch.compile
    group took 21 s at once where one process took 30 s), the first first: on a CPU run
    whose inductor checks still run, the last of those waits for them (`harness.run`).
    The variants in no group are not called there. Empty: every variant's first call, in
    one process."""


@dataclass(frozen=True)
class Reading:
    """How the report reads a finding's measurement against its claim: the fields that
    answer it where a time ratio does not, the headline case, the share of a training
    iteration, the speed-up the claim states and its tolerance. `Finding.reading`."""

    answer: tuple[str, ...] = ()
    """Row fields that answer the claim where a time ratio does not (a stability or
    learning claim), each an estimate with its 95% interval in `<field>_low` and
    `<field>_high` (from `extra_metrics`): the report's summary and verdicts lead with them,
    the time ratio (the cost) after. A row may also say the answer in words in a str field
    `decision` (e.g. "cannot decide: ..."), which the report puts first. Empty: the time
    ratio is the answer."""
    headline_case: Callable[[list[Case]], Case] | None = None
    """The run's cases -> the one whose answer heads the report (and whose cell also times
    the baseline against itself, the run's placebo); None: the first case."""
    per_iteration: tuple[float, str] | None = None
    """`(calls, iteration)`: how many calls of this finding one training iteration makes
    (a number > 0), and the id of the finding whose baseline call is one iteration (itself
    for an iteration's finding). The report then puts the headline's time difference per
    iteration, and its share of that finding's baseline time in the same run, beside the
    difference per call. None: not part of an iteration, or not said."""
    claim_factor: float | None = None
    """The speed-up the claim states (4.0 for "~4x"), which gets its own word: met,
    exceeded, not met or inconclusive; None: read from `claim` ("~4x", "up to 25x") where
    it states one."""
    claim_tolerance: float = 0.25
    """How far below `claim_factor` the measured speed-up may lie and the claim still be
    met (0.25: down to factor / 1.25); printed with the claim's word."""


@dataclass(frozen=True)
class Finding:
    """A claim turned into a measurement: declare one and pass it to `register`.

    Required: `id`, `title`, `claim`, `variants`, `baseline`, `cases`, `build`,
    `make_call`. With `check` (and optionally `reference` and `tolerance`), every variant's
    output is compared with the reference before anything is timed; a variant beyond the
    tolerance is a FAIL row and is not timed. Example::

        register(Finding(
            id="MY-sum", title="sum() vs a Python loop", claim="sum() is ~10x faster",
            variants=("loop", "sum"), baseline="loop",
            cases=[Case.of(n=256), Case.of(n=4096)],
            build=lambda case, device, seed: torch.rand(
                case["n"], generator=torch.Generator().manual_seed(seed)).to(device),
            make_call=lambda variant, x: (lambda: x.sum()) if variant == "sum"
                                         else (lambda: torch.tensor(sum(x.tolist()))),
            check=max_abs_difference, tolerance=1e-3,
        ))
    """

    id: str
    """The claim's id, e.g. `MY-rowsums`: a letter or digit, then letters, digits, `.`, `_`
    or `-` (it names files); unique among registered findings."""
    title: str
    """One line saying what is compared (the report's heading)."""
    claim: str
    """The claim under test, quoted short, e.g. "sum(dim=1) could be ~10x faster than
    a loop over rows" (a factor in it, `~4x`, is held against the measured ratio)."""
    variants: tuple[str, ...]
    """The names of the variants compared (one or more, unique); a list is accepted."""
    baseline: str
    """The variant the others are compared with (ratio = variant time / baseline time)."""
    cases: Callable[[bool], list[Case]]
    """quick -> the cases to run (`quick=True` for CI-sized runs, and the gate's cases);
    or a non-empty list of `Case`, run both ways. A `cases` function that raises is one
    failed row of the finding, and the run goes on."""
    build: Callable[[Case, torch.device, int], Inputs]
    """(case, device, seed) -> inputs, built once per case, outside the timed region."""
    make_call: Callable[[str, Inputs], Call]
    """(variant, inputs) -> a zero-argument callable: the timed region. What it returns is
    the output that `check` compares."""
    check: Callable[[Any, Any], float] | None = None
    """(output, reference output) -> max error, e.g. `max_abs_difference`; None: nothing
    is checked."""
    reference: Callable[[Inputs], Any] | None = None
    """inputs -> reference output (say, the same computation in float64); None: the
    baseline variant's output is the reference. Needs `check`."""
    tolerance: Callable[[Case, torch.device], float] = _exact
    """(case, device) -> the largest max error that still agrees (a function of the case
    alone is accepted), or one number >= 0 for every case (default 0: exact). Derive it
    from how the value is computed (`rounding_tolerance`: dtype, device, depth), not from
    what passed on one machine."""
    skip: Callable[[str, Case, torch.device], str | None] = _never
    """(variant, case, device) -> why this cell is not run, or None; `"needs CUDA"` is
    reported as such."""
    peers: tuple[str, ...] = ()
    """Variants that are other libraries' code, timed as comparators: reported like the
    others, but neither gated (`harness.gate`) nor counted as our best method."""
    margin: float | None = None
    """The practical margin of this finding's words (a fraction in (0, 1), e.g. 0.1: a
    change within 10% either way is *same*); None: the run's `--margin` (default 5%)."""
    proposed: str | None = None
    """The variant the claim proposes (the fix under review): the report's headline
    variant. None: the finding's only other variant, or else its fastest at the headline
    case."""
    long: bool = False
    """A long finding (learning runs, many episodes): it runs only when named with
    `--findings` or with `--all`, never in the default run; its quick cases stay CI-sized."""
    ours: tuple[str, ...] = ()
    """Variants of this project's own design, beyond the review's fix: reported as ours,
    never as the review's (a list is accepted)."""
    recording: Recording = field(default_factory=Recording)
    """How its calls are sampled and what each records beside its time (`Recording`)."""
    reading: Reading = field(default_factory=Reading)
    """How the report reads the measurement against the claim (`Reading`)."""
    about: About = field(default_factory=About)
    """Where the claim comes from and what a reader should know (`About`): text for the
    report and `--list`, none of it changing what is measured."""
    gated: bool = True
    """Whether `harness.gate` checks it (its counters, and its A/B timing): True unless its
    counts are not deterministic (they depend on state that varies from run to run)."""

    def __post_init__(self) -> None:
        self._check_text()
        self._check_variants()
        self._check_callables()
        if self.reference is not None and self.check is None:
            self._bad("check", "a callable (output, reference) -> max error, since a "
                      "reference is given (without it the reference is never compared)",
                      self.check)

    def margin_under(self, run_margin: float) -> float:
        """The margin of this finding's words in a run whose `--margin` is `run_margin`:
        the finding's own where it declares one, else the run's (a fraction)."""
        return run_margin if self.margin is None else self.margin

    def _bad(self, name: str, expected: str, received: Any) -> None:
        raise ValueError(f"Finding {self.id!r}: {name}: expected {expected}; got {received!r}")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalising a field of the frozen instance

    def _check_text(self) -> None:
        if not isinstance(self.id, str) or not ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"Finding: id: expected a str of letters, digits, '.', '_' or '-' "
                             f"starting with a letter or digit, e.g. 'MY-claim-1'; got {self.id!r}")
        for name in ("title", "claim"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                self._bad(name, "a non-empty str", value)
        for name, kind in (("recording", Recording), ("reading", Reading), ("about", About)):
            if not isinstance(getattr(self, name), kind):
                self._bad(name, f"{kind.__name__}(...), from harness", getattr(self, name))
        self.about.check(self._bad)
        for name in ("gated", "long"):
            if not isinstance(getattr(self, name), bool):
                self._bad(name, "True or False", getattr(self, name))
        if self.margin is not None:
            self._set("margin", self._fraction("margin", self.margin, "None or "))
        self._set("recording", self._checked_recording(self.recording))
        self._set("reading", self._checked_reading(self.reading))

    def _checked_recording(self, r: Recording) -> Recording:
        """`r` checked field by field (errors name `recording.<field>`), normalised."""
        if not isinstance(r.paired, bool):
            self._bad("recording.paired", "True or False", r.paired)
        if r.profile_max_s is not None and not (is_real(r.profile_max_s) and r.profile_max_s > 0):
            self._bad("recording.profile_max_s", "None or seconds > 0", r.profile_max_s)
        if not (is_real(r.budget_factor) and r.budget_factor > 0):
            self._bad("recording.budget_factor", "a finite number > 0", r.budget_factor)
        for name, signature in (("extra_metrics", "(variant, inputs) -> dict"),
                                ("sample_metrics", "(variant, inputs) -> dict"),
                                ("min_bytes", "case -> bytes"),
                                ("caches_cold", "() -> bool")):
            value = getattr(r, name)
            if value is not None and not callable(value):
                self._bad(f"recording.{name}", f"None or a callable {signature}", value)
        phases = self._names("recording.phases", r.phases, allow_empty=True)
        groups = r.compile_groups
        if isinstance(groups, str) or not isinstance(groups, Sequence):
            self._bad("recording.compile_groups", "a tuple of tuples of variant names", groups)
        groups = tuple(self._names("recording.compile_groups", g, allow_empty=False)
                       for g in groups)
        flat = [v for g in groups for v in g]
        stray = sorted({v for v in flat if v not in self.variants})
        if stray:
            self._bad("recording.compile_groups", "names of the finding's variants "
                      f"({', '.join(self.variants)}); {', '.join(stray)} is not one", groups)
        twice = sorted({v for v in flat if flat.count(v) > 1})
        if twice:
            self._bad("recording.compile_groups", f"each variant in one group ({', '.join(twice)} "
                      "is in more)", groups)
        return dataclasses.replace(r, phases=phases, compile_groups=groups)

    def _checked_reading(self, r: Reading) -> Reading:
        """`r` checked field by field (errors name `reading.<field>`), normalised; its
        claim factor read from `claim` where it gives none."""
        factor = r.claim_factor
        if factor is None:
            factor = claim_factor_of(self.claim)
        elif not (is_real(factor) and factor > 0):
            self._bad("reading.claim_factor", "None or a finite speed-up > 0, e.g. 4.0 for "
                      "'~4x'", factor)
        if not (is_real(r.claim_tolerance) and 0 < r.claim_tolerance <= 1):
            self._bad("reading.claim_tolerance", "a fraction in (0, 1], e.g. 0.25",
                      r.claim_tolerance)
        if r.headline_case is not None and not callable(r.headline_case):
            self._bad("reading.headline_case", "None or a callable cases -> Case",
                      r.headline_case)
        per_iteration = r.per_iteration
        if per_iteration is not None:
            if not (isinstance(per_iteration, (tuple, list)) and len(per_iteration) == 2
                    and is_real(per_iteration[0]) and per_iteration[0] > 0
                    and isinstance(per_iteration[1], str) and per_iteration[1].strip()):
                self._bad("reading.per_iteration", "None or (calls per training iteration "
                          "> 0, id of the finding whose baseline call is one iteration)",
                          per_iteration)
            per_iteration = (float(per_iteration[0]), per_iteration[1])
        answer = self._names("reading.answer", r.answer, allow_empty=True)
        return dataclasses.replace(r, answer=answer, claim_factor=factor,
                                   per_iteration=per_iteration)

    def _fraction(self, name: str, value: Any, prefix: str = "") -> float:
        """`value` as a float in (0, 1); else the field's ValueError."""
        if not (is_real(value) and 0 < value < 1):
            self._bad(name, f"{prefix}a fraction in (0, 1), e.g. 0.05", value)
        return float(value)

    def _names(self, name: str, value: Any, *, allow_empty: bool, unique: bool = True
               ) -> tuple[str, ...]:
        """`value` as a tuple of non-empty strs (a list or tuple is accepted)."""
        if isinstance(value, str) or not isinstance(value, Sequence):
            self._bad(name, "a tuple of str", value)
        items = tuple(value)
        if not allow_empty and not items:
            self._bad(name, "at least one name", value)
        if not all(isinstance(v, str) and v.strip() for v in items):
            self._bad(name, "non-empty strs", value)
        repeated = sorted({v for v in items if items.count(v) > 1})
        if unique and repeated:
            self._bad(name, f"each name once ({', '.join(repeated)} repeated)", value)
        return items

    def _check_variants(self) -> None:
        self._set("variants", self._names("variants", self.variants, allow_empty=False))
        if PLACEBO in self.variants:
            self._bad("variants", f"names other than {PLACEBO!r} (the run's placebo row, the "
                      "baseline timed against itself, is called so)", self.variants)
        if self.baseline not in self.variants:
            self._bad("baseline", f"one of the variants ({', '.join(self.variants)})",
                      self.baseline)
        self._set("peers", self._names("peers", self.peers, allow_empty=True))
        stray = [p for p in self.peers if p not in self.variants]
        if stray:
            self._bad("peers", f"variants of the finding ({', '.join(self.variants)})", stray)
        if self.baseline in self.peers:
            self._bad("peers", "variants other than the baseline (a peer is a comparator)",
                      self.peers)
        self._set("ours", self._names("ours", self.ours, allow_empty=True))
        stray = [v for v in self.ours if v not in self.variants or v in self.peers
                 or v == self.baseline]
        if stray:
            self._bad("ours", "variants other than the baseline and the peers (a design of "
                      "this project's own)", stray)
        if self.proposed is not None and (self.proposed not in self.variants
                                          or self.proposed == self.baseline):
            self._bad("proposed", f"None or a variant other than the baseline "
                      f"({', '.join(v for v in self.variants if v != self.baseline)})",
                      self.proposed)

    def _check_callables(self) -> None:
        if isinstance(self.cases, (list, tuple)):
            if not self.cases or not all(isinstance(c, Case) for c in self.cases):
                self._bad("cases", "a non-empty list of Case (or a function quick -> list "
                          "of Case)", self.cases)
            check_cases(self, list(self.cases), "cases")
            self._set("cases", _Listed(tuple(self.cases)))
        tolerance = self.tolerance
        if is_real(tolerance, finite=False):
            if not (math.isfinite(tolerance) and tolerance >= 0):
                self._bad("tolerance", "a number >= 0 or a function (case[, device]) -> "
                          "number", tolerance)
            self._set("tolerance", _Constant(float(tolerance)))
        elif callable(tolerance) and _arguments(tolerance) == 1:
            self._set("tolerance", _ForEveryDevice(tolerance))
        required = {"cases": "quick -> list of Case", "build": "(case, device, seed) -> inputs",
                    "make_call": "(variant, inputs) -> zero-argument callable",
                    "tolerance": "(case[, device]) -> max error allowed", "skip":
                    "(variant, case, device) -> reason or None"}
        optional = {"check": "(output, reference) -> max error",
                    "reference": "inputs -> reference output"}
        for name, signature in required.items():
            if not callable(getattr(self, name)):
                self._bad(name, f"a callable {signature}", getattr(self, name))
        for name, signature in optional.items():
            value = getattr(self, name)
            if value is not None and not callable(value):
                self._bad(name, f"None or a callable {signature}", value)


#: the names of `Finding`'s fields, in order (frozen by tests/harness/test_public_api.py)
FIELDS = tuple(f.name for f in fields(Finding))


def check_cases(finding: Finding, cases: Any, where: str) -> list[Case]:
    """`cases` if it is a non-empty list of `Case` with distinct labels; else ValueError
    naming `where` (`cases`, or `cases(quick=True)` for what the function returned)."""
    if not isinstance(cases, (list, tuple)) or not cases:
        finding._bad(where, "a non-empty list of Case", cases)
    strays = [c for c in cases if not isinstance(c, Case)]
    if strays:
        finding._bad(where, "Case objects (Case.of(name=value, ...))", strays[0])
    labels = [c.label for c in cases]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        finding._bad(where, f"distinct cases ({'; '.join(repeated)} repeated)", labels)
    return list(cases)


#: the one case of a finding whose `cases` function failed (`planned`)
CASES_FAILED = Case.of(cases="failed")


class CasesError(RuntimeError):
    """A finding's `cases(quick)` raised, or returned something other than a list of cases."""


def planned(finding: Finding, quick: bool) -> Finding:
    """`finding` with its `cases(quick)` called once and checked, for one run.

    The result's `cases` returns that list whatever `quick` is. When `cases(quick)`
    raises or returns no valid list, the result is a stand-in with one case,
    `CASES_FAILED`, whose `build` raises a `CasesError` naming the cause (with the
    cause's traceback): the runner and the gate record it as the finding's failed row,
    and the run goes on.
    """
    where = f"cases(quick={quick})"
    try:
        returned = finding.cases(quick)
    except Exception as err:  # user code: any error becomes the finding's failed row
        return _failed(finding, CasesError(f"{where} raised {type(err).__name__}: {err}")
                       .with_traceback(err.__traceback__))
    try:
        cases = check_cases(finding, returned, where)
    except ValueError as err:
        return _failed(finding, CasesError(str(err)))
    return dataclasses.replace(finding, cases=_Listed(tuple(cases)))


def _failed(finding: Finding, failure: CasesError) -> Finding:
    """The stand-in of a finding whose cases could not be listed (see `planned`)."""
    def build(case: Case, device: torch.device, seed: int) -> Inputs:
        raise failure

    return dataclasses.replace(finding, cases=_Listed((CASES_FAILED,)), build=build, skip=_never)


def max_abs_difference(output: torch.Tensor, reference: torch.Tensor) -> float:
    """max |output - reference| in float64: the check of findings whose variants must agree."""
    return (output.double().cpu() - reference.double().cpu()).abs().max().item()


@dataclass(frozen=True)
class PlantTarget:
    """A callable of the code under test that `harness.gate.quality` may wrap to plant a
    known regression (a slowdown, an extra allocation): `module.attribute[key]`, an entry
    of a dict of functions (e.g. `mylib.ops`, `KERNELS`, `fast`)."""

    module: str
    """The module that holds the dict, importable by name (e.g. `mylib.ops`)."""
    attribute: str
    """The dict's name in that module."""
    key: str
    """The entry wrapped."""

    def __post_init__(self) -> None:
        for name in ("module", "attribute", "key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"PlantTarget.{name}: expected a non-empty str; got {value!r}")

    @property
    def file(self) -> Path:
        """The module's file, relative to the root of a tree that holds it."""
        return Path(*self.module.split(".")).with_suffix(".py")

    def __str__(self) -> str:
        return f"{self.module}.{self.attribute}[{self.key!r}]"


@dataclass(frozen=True)
class Defaults:
    """What a findings module may set for the commands that measure it, where neither the
    command line nor `[tool.esper-bench]` says otherwise. Declared with `set_defaults`."""

    invariants: Path | None = None
    """`harness.gate` check b's config (speed ratios to keep), when --config is not given."""
    ab_findings: tuple[str, ...] = ()
    """`harness.gate --against`'s findings when --findings is not given (empty: every gated
    finding)."""
    plant: PlantTarget | None = None
    """Where `harness.gate.quality` plants its regressions."""
    flamegraph: tuple[str, ...] = ()
    """`python` arguments of a short program py-spy records for `harness.run --pyspy`
    (e.g. `("-m", "mypkg.train", "--steps", "10")`); empty: no flamegraph."""
    commands: tuple[tuple[str, str], ...] = ()
    """More `esper-bench` subcommands: (name, module whose `main(argv)` it calls)."""

    def __post_init__(self) -> None:
        if self.invariants is not None and not isinstance(self.invariants, (str, Path)):
            raise ValueError(f"Defaults.invariants: expected None or a path; got {self.invariants!r}")
        if self.invariants is not None:
            object.__setattr__(self, "invariants", Path(self.invariants))
        for name in ("ab_findings", "flamegraph"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"Defaults.{name}: expected a tuple of str; got {value!r}")
            object.__setattr__(self, name, tuple(value))
        if self.plant is not None and not isinstance(self.plant, PlantTarget):
            raise ValueError(f"Defaults.plant: expected None or a PlantTarget; got {self.plant!r}")
        pairs = tuple(tuple(p) for p in self.commands)
        if not all(len(p) == 2 and all(isinstance(v, str) and v for v in p) for p in pairs):
            raise ValueError(f"Defaults.commands: expected (name, module) pairs of str; got "
                             f"{self.commands!r}")
        object.__setattr__(self, "commands", pairs)


#: findings module -> what it declared with `set_defaults`
DEFAULTS: dict[str, Defaults] = {}


def set_defaults(defaults: Defaults) -> Defaults:
    """Declare `defaults` for the findings module being imported (call it at its top level,
    beside its `register` calls); a second call replaces the first."""
    if not isinstance(defaults, Defaults):
        raise ValueError(f"set_defaults: defaults: expected a Defaults; got "
                         f"{type(defaults).__name__}")
    caller = sys._getframe(1).f_globals.get("__name__", "set_defaults()")
    DEFAULTS[_loading[-1] if _loading else caller] = defaults
    return defaults


def defaults(modules: Sequence[str]) -> Defaults:
    """The defaults in effect for the findings modules `modules` (loaded): each field as
    the last of them that sets it set it (none sets it: the field's default)."""
    merged: dict = {}
    for origin, found in DEFAULTS.items():
        if not within(origin, modules):
            continue
        for f in fields(Defaults):
            value = getattr(found, f.name)
            if value not in (None, ()):
                merged[f.name] = value
    return Defaults(**merged)


FINDINGS: dict[str, Finding] = {}
#: finding id -> the findings module that registered it: the one being loaded by
#: `load_findings_module`, else the module that called `register`
ORIGINS: dict[str, str] = {}
#: ids registered outside `load_findings_module` (a package imported directly): they
#: belong to the packages that hold their module too
_DIRECT: set[str] = set()
_loading: list[str] = []  # the modules being imported for their register calls, innermost last


def register(finding: Finding) -> Finding:
    """Add `finding` to the registry (what `harness.run` measures) and return it.

    Its id must be new: a second finding with the id of one already registered is a
    ValueError naming where the first came from.
    """
    if not isinstance(finding, Finding):
        raise ValueError(f"register: finding: expected a Finding; got {type(finding).__name__}")
    if finding.id in FINDINGS:
        raise ValueError(f"register: finding id {finding.id!r} is already registered "
                         f"({ORIGINS.get(finding.id, 'by an earlier register call')}); "
                         "choose another id")
    FINDINGS[finding.id] = finding
    # the module named to load_findings_module, else the module that called register
    caller = sys._getframe(1).f_globals.get("__name__", "register()")
    ORIGINS[finding.id] = _loading[-1] if _loading else caller
    if not _loading:
        _DIRECT.add(finding.id)
    return finding


class FindingsModuleError(ValueError):
    """A findings module that cannot be imported, or whose findings cannot be registered."""


def load_findings_module(name: str) -> list[str]:
    """Import the module `name` (`pkg.module`) for its `register` calls; the ids it added.

    An id that clashes with one registered before is an error. A module that fails to
    import registers nothing: what it registered before failing is taken back, and the
    error names the module and shows the cause.
    """
    if name in sys.modules:  # imported earlier (by an earlier run in this process)
        return from_modules([name])
    before = set(FINDINGS)
    _loading.append(name)
    try:
        importlib.import_module(name)
    except Exception as err:  # any error while importing user code: named, with its cause
        for added in set(FINDINGS) - before:
            del FINDINGS[added], ORIGINS[added]
        sys.modules.pop(name, None)
        where = _user_frame(err)
        hint = (" (a module is found through sys.path, which starts with the current folder)"
                if isinstance(err, ModuleNotFoundError) and err.name
                and name.startswith(err.name) else "")
        raise FindingsModuleError(
            f"--findings-module {name}: expected an importable module that registers "
            f"findings; importing it raised {type(err).__name__}: {err}{where}{hint}") from err
    finally:
        _loading.pop()
    return [i for i in FINDINGS if i not in before]


def from_modules(modules: Sequence[str]) -> list[str]:
    """The ids of the registered findings that the modules `modules` registered, in
    registry order: while `load_findings_module` imported them, or, for a package
    imported directly, from one of its modules."""
    return [i for i, origin in ORIGINS.items() if i in FINDINGS and (
        origin in modules or (i in _DIRECT and within(origin, modules)))]


def owners(ids: Sequence[str], modules: Sequence[str]) -> tuple[str, ...]:
    """Those of the findings modules `modules` that registered one of the findings `ids`,
    in their order: what a worker process imports to measure them (the others can take
    seconds to import, torch's compiler for one)."""
    return tuple(m for m in modules
                 if any(i in ORIGINS and within(ORIGINS[i], [m]) for i in ids))


def within(module: str, modules: Sequence[str]) -> bool:
    """Whether `module` is one of `modules` or a submodule of one."""
    return any(module == m or module.startswith(f"{m}.") for m in modules)


def _user_frame(err: BaseException) -> str:
    """` (at file.py:12)`: the innermost frame of the traceback in the user's code (not in
    importlib or the harness, whose frames say nothing about the cause), or ''."""
    harness_folder = Path(__file__).resolve().parents[1]
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<")  # <frozen importlib>, dataclass code
              and Path(f.filename).resolve().parent != Path(importlib.__file__).parent
              and harness_folder not in Path(f.filename).resolve().parents]
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""


def select(ids: list[str] | None, include_long: bool = False,
           modules: Sequence[str] | None = None) -> list[Finding]:
    """The findings named by `ids`, in registry order; when None, every finding that is
    not `long` (all of them with `include_long`) of the findings modules `modules` (of
    the whole registry when None: what earlier runs in this process loaded too). An
    unknown id is a ValueError naming the nearest one of `modules`' findings."""
    known = list(from_modules(modules) if modules is not None else FINDINGS)
    if not ids:
        return [FINDINGS[i] for i in known if include_long or not FINDINGS[i].long]
    unknown = [i for i in ids if i not in FINDINGS]
    if unknown:
        named = ", ".join(i if i.isprintable() else repr(i) for i in unknown)  # one line
        near = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.5)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"--findings: unknown id(s) {named}{hint}; known: "
                         f"{', '.join(known) or 'none (no findings module loaded)'}")
    return [FINDINGS[i] for i in FINDINGS if i in ids]
