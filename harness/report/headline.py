"""A finding's headline: one case, one variant, its verdict and the counter that moved most.

The summary table at the top of a report, the first lines of a finding's section, the
markdown summary (`--markdown`) and the history page all read the same `Headline`, so
that they cannot disagree.

- The headline case is the one the run marked (`Reading.headline_case`, recorded on the
  rows as `headline`); for runs made before that, the case nearest 4 envs x 25 steps (the
  size the built-in findings headlined then) where the baseline was timed.
- The headline variant is the one the claim proposes (`Finding.proposed`, recorded in the
  run); for a finding that names none, its only other variant, or else its fastest at the
  headline case.
- Its ratio comes with its size: the time difference per call (the ratio less 1, times
  the baseline's median) and, for a finding that says how many calls one training
  iteration makes (`Reading.per_iteration`), per iteration and as a share of the
  iteration's own baseline time in the same run.
- The headline cell's placebo (the baseline timed against itself) is the run's noise
  floor there: when it reads faster or slower, or inconclusive, the verdict says so
  first.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import pandas as pd

from harness.measure.estimate import PairedEstimate
from harness.measure.stats import Verdict
from harness.report.summary import signed_seconds
from harness.report.verdicts import case_phrase, present

#: per-call counters a headline reports: column -> label
COUNTERS = {"allocations": "allocations", "host_syncs": "host syncs",
            "kernel_launches": "kernel launches"}
#: runs made before the headline case was recorded headlined the case nearest this size
OLDER_RUNS_SIZE = {"p_num_envs": 4, "p_max_steps": 25}
_COMPARED = {Verdict.FASTER.value, Verdict.SLOWER.value, Verdict.SAME.value,
             Verdict.INCONCLUSIVE.value, Verdict.WITHIN_FACTOR.value,
             Verdict.NO_DIFFERENCE.value}
#: the words of runs made before paired estimates (an interval of unpaired samples)
OLDER_WORDS = {Verdict.WITHIN_FACTOR.value, Verdict.NO_DIFFERENCE.value}
#: a headline's "fastest" is chosen among k variants: each interval at 1 - ALPHA / k
ALPHA = 0.05
_BROKEN = {Verdict.FAILED.value, Verdict.MISMATCH.value}


@dataclass(frozen=True)
class CounterChange:
    """One per-call counter of the headline variant against the baseline, same case."""

    name: str
    """A COUNTERS label: 'host syncs'."""
    baseline: float
    variant: float

    @property
    def size(self) -> float:
        """How much it moved: |log((variant + 1) / (baseline + 1))| (+1 so that 0 counts)."""
        return abs(math.log((self.variant + 1) / (self.baseline + 1)))

    def text(self) -> str:
        """'host syncs 204 -> 0'."""
        return f"{self.name} {self.baseline:,.0f} \u2192 {self.variant:,.0f}"


@dataclass(frozen=True)
class Estimate:
    """An answer field of one variant (`Reading.answer`): a value and its 95% interval."""

    name: str
    """The row field, e.g. `heldout_return_diff`."""
    variant: str
    value: float
    low: float
    high: float

    def text(self) -> str:
        """'+0.012 [-0.001, +0.025]' for a difference, '0.25 [0.05, 0.7]' otherwise."""
        sign = "+" if self.name.endswith("_diff") else ""
        return (f"{self.value:{sign}.3g} [{self.low:{sign}.3g}, {self.high:{sign}.3g}]")


def estimate(row: dict, name: str) -> Estimate | None:
    """Field `name` of `row` with its `_low`/`_high` interval, or None where it has none."""
    values = [row.get(k) for k in (name, f"{name}_low", f"{name}_high")]
    if not all(present(v) for v in values):
        return None
    return Estimate(name, row["variant"], *(float(v) for v in values))


def estimate_fields(rows: pd.DataFrame) -> list[str]:
    """Every field of these rows that is an estimate with an interval (`X` with `X_low`
    and `X_high`), in column order; the time ratio (ci_low / ci_high) is not one."""
    columns = set(rows.columns)
    return [c for c in rows.columns
            if f"{c}_low" in columns and f"{c}_high" in columns and rows[c].notna().any()]


@dataclass(frozen=True)
class Headline:
    """What a finding answers, at one case, for one variant against the baseline."""

    finding: str
    claim: str
    baseline: str
    case: str | None
    """The case label in the results (`rows=256,cols=64`); None when
    the run holds no row of this finding."""
    where: str
    """The case in words: '4 envs x 25 steps (dones=episode)'."""
    variant: str | None
    verdict: str | None
    """A `Verdict` value of the headline row (None: no such row)."""
    ratio: float | None
    """Time ratio variant / baseline; with its interval below (`ci_level`)."""
    ci_low: float | None
    ci_high: float | None
    reason: str
    """Why the headline row has no ratio (needs CUDA, skipped, the error)."""
    claim_factor: float | None
    """The speed-up the ticket estimated ('~4x' -> 4.0), or None."""
    counters: tuple[CounterChange, ...]
    """Counters that changed, the largest change first."""
    counted: bool
    """Whether the headline row and its baseline carry counters at all (a profiled run)."""
    fastest: tuple[str, float] | None
    """Another variant clearly faster than the headline one here (`fastest`: chosen among
    k with a Bonferroni correction): (name, speed-up over the baseline)."""
    broken: tuple[str, ...]
    """Variants that failed or disagreed with the reference in any case."""
    cases_measured: int
    cases_expected: int | None
    """How many cases the finding has in a run of this kind (quick or not), if known."""
    answers: tuple[Estimate, ...] = ()
    """The finding's answer fields (`Reading.answer`) at the headline case: the headline
    variant's and, where it has the field, the baseline's."""
    lean: str | None = None
    """Which word an inconclusive ratio leans to."""
    rounds_to_decide: float | None = None
    """About how many rounds would decide an inconclusive word."""
    processes_to_decide: float | None = None
    """About how many fresh processes would decide it, where a process's offset weighs."""
    one_thread: tuple[str, float, float, float] | None = None
    """The same row at one torch thread (the run's headline cells timed again so): (word,
    ratio, ci_low, ci_high); None where the run had one thread or did not."""
    one_thread_loaded: bool = False
    """Whether other processes kept every core busy while it was timed at one thread."""
    claim_word: str | None = None
    """The claim's word about its factor (met, exceeded, not met, inconclusive)."""
    claim_tolerance: float | None = None
    margin: float | None = None
    """The practical margin of the words."""
    ci_level: float | None = None
    """The level of the interval (above 0.95 where sampling looked more than once)."""
    decision: str = ""
    """The answer in words, where the headline row carries them in a `decision` field
    (e.g. 'cannot decide: ...'); '' where it does not."""
    baseline_s: float | None = None
    """The baseline's median seconds per call at the headline case."""
    per_iteration: tuple[float, str] | None = None
    """`Reading.per_iteration`: (calls one training iteration makes, the id of the finding
    whose baseline call is one iteration)."""
    iteration_s: float | None = None
    """That finding's baseline median seconds at its headline case, in the same run."""
    floor: tuple[str, float | None, float | None, float | None] | None = None
    """The headline cell's placebo: (word, ratio, ci_low, ci_high); None without one."""
    ours: tuple[str, ...] = ()
    """The finding's variants of this project's own design (`Finding.ours`)."""

    def answer_text(self) -> str:
        """'changed other scale rate: per_optimizer 0 [0, 0.49] vs shared 1 [0.51, 1]'; ''.
        A `decision` comes first."""
        parts = [self.decision] if self.decision else []
        for name in dict.fromkeys(a.name for a in self.answers):
            mine = [a for a in self.answers if a.name == name and a.variant == self.variant]
            base = [a for a in self.answers if a.name == name and a.variant == self.baseline]
            text = name.replace("_", " ") + ": "
            text += " vs ".join(f"{a.variant} {a.text()}" for a in mine + base)
            parts.append(text)
        return "; ".join(parts)

    @property
    def speedup(self) -> tuple[float, float, float] | None:
        """(speed-up, low, high) = 1 / (ratio, ci_high, ci_low); None without a ratio."""
        if self.ratio is None:
            return None
        return 1.0 / self.ratio, 1.0 / self.ci_high, 1.0 / self.ci_low

    def ratio_text(self) -> str:
        """'faster: 11.8x [11.2-13.9]', 'slower: 1.3x [1.2-1.4]', 'same: time ratio 1.02
        [0.99-1.04], within +-5%', 'inconclusive: time ratio 1.04 [1.01-1.07], leans same,
        ~90 rounds would decide'; '' without a ratio."""
        if self.ratio is None:
            return ""
        interval = f"[{self.ci_low:.3g}-{self.ci_high:.3g}]"
        margin = f"\u00b1{100 * self.margin:.2g}%" if self.margin else "the margin"
        if self.verdict == Verdict.NO_DIFFERENCE.value:
            return (f"no measurable difference: time ratio {self.ratio:.3g} {interval} "
                    "(interval from unpaired samples, older run)")
        if self.verdict == Verdict.SAME.value:
            return f"same: time ratio {self.ratio:.3g} {interval}, within {margin}"
        if self.verdict == Verdict.INCONCLUSIVE.value:
            text = f"inconclusive: time ratio {self.ratio:.3g} {interval}"
            if self.lean:
                text += f", leans {self.lean}"
            if self.processes_to_decide:
                text += f", ~{self.processes_to_decide:,.0f} processes would decide"
            elif self.rounds_to_decide:
                text += f", ~{self.rounds_to_decide:,.0f} rounds would decide"
            return text
        if self.ratio < 1.0:
            speed, low, high = self.speedup
            text = f"{speed:.3g}x faster [{low:.3g}-{high:.3g}]"
        else:
            text = f"{self.ratio:.3g}x slower {interval}"
        if self.verdict in OLDER_WORDS:
            text += ", below the factor that counts (interval from unpaired samples, older run)"
        return text

    def size_text(self) -> str:
        """The ratio's size: '-1.64 ms a call, -1.64 ms an iteration (1 call), -0.28% of an
        iteration'; '' without a ratio or a baseline time."""
        if self.ratio is None or self.baseline_s is None:
            return ""
        per_call = (self.ratio - 1.0) * self.baseline_s
        parts = [f"{_plus(per_call)} a call"]
        if self.per_iteration is not None:
            calls, iteration = self.per_iteration
            per_iteration = per_call * calls
            if calls != 1.0 or iteration != self.finding:
                parts.append(f"{_plus(per_iteration)} an iteration ({calls:g} "
                             f"call{'s' * (calls != 1.0)})")
            if self.iteration_s:
                parts.append(f"{100 * per_iteration / self.iteration_s:+.2g}% of an iteration")
        return ", ".join(parts)

    def floor_text(self) -> str:
        """'noise floor failed: placebo slower, 1.15 [1.12-1.18]' where the headline cell's
        placebo (its baseline against itself) is not *same*; '' where it is (or has none).
        Short: it comes first in the first screen's verdict cell."""
        if self.floor is None:
            return ""
        word, ratio, low, high = self.floor
        if word in (Verdict.FASTER.value, Verdict.SLOWER.value):
            head = f"noise floor failed: placebo {word}"
        elif word == Verdict.INCONCLUSIVE.value:
            head = "noise floor not shown: placebo inconclusive"
        else:
            return ""
        return head + (f", {ratio:.3g} [{low:.3g}-{high:.3g}]" if ratio is not None else "")

    def claim_text(self) -> str:
        """"ticket said ~4x: exceeded (tolerance 25%)"; '' where the claim states no factor."""
        if self.claim_factor is None:
            return ""
        text = f"ticket said ~{self.claim_factor:g}x"
        if self.claim_word:
            tolerance = (f" (tolerance {100 * self.claim_tolerance:.0f}%)"
                         if self.claim_tolerance else "")
            text += f": {self.claim_word}{tolerance}"
        return text

    def verdict_text(self) -> str:
        """'scan 11.8x faster [11.2-13.9]; ticket said ~4x; fastest: numba 90x'."""
        if self.case is None:
            return "not measured: the run holds no row of this finding"
        if self.variant is None:
            return f"not compared: only {self.baseline} has a row at {self.where}"
        if self.answers:  # a stability or learning claim: its answer first, then the cost
            parts = [self.answer_text()]
            if self.ratio is not None:
                parts.append(f"time: {self.variant} {self.ratio_text()}")
        elif self.ratio is not None:
            separator = ": " if self.verdict == Verdict.NO_DIFFERENCE.value else " "
            size = self.size_text()
            parts = [f"{self.variant}{separator}{self.ratio_text()}"
                     + (f" ({size})" if size else "")]
            if self.claim_factor is not None:
                parts.append(self.claim_text())
            if self.fastest is not None:
                name, speedup = self.fastest
                text = f"fastest: {name} {speedup:.3g}x"
                if name in self.ours:  # how far ours goes beyond the headline variant
                    text += f" (ours; {speedup * self.ratio:.3g}x {self.variant})"
                parts.append(text)
        else:
            parts = [f"{self.variant}: {_status_words(self.verdict, self.reason)}"]
        if self.broken:
            parts.append(f"{len(self.broken)} variant{'s' * (len(self.broken) > 1)} failed "
                         f"or disagreed ({', '.join(self.broken)})")
        threads = self.threads_text()
        if threads:
            parts.append(threads)
        floor = self.floor_text()
        return "; ".join([floor, *parts] if floor else parts)

    def threads_text(self) -> str:
        """'at 1 thread: slower 1.3x [1.2-1.4], where the run's threads read faster: the
        thread count decides this word' (or that load, where other processes kept every
        core busy meanwhile), where the word at one thread differs; ''."""
        if self.one_thread is None or self.one_thread[0] == self.verdict:
            return ""
        word, ratio, low, high = self.one_thread
        cause = ("timed while other processes kept every core busy: the thread count or "
                 "that load decides this word" if self.one_thread_loaded
                 else "the thread count decides this word")
        return (f"at 1 thread: {word} {ratio:.3g} [{low:.3g}-{high:.3g}], where the run's "
                f"threads read {self.verdict}: {cause}")

    def counter_text(self) -> str:
        """The counter that moved most ('host syncs 204 -> 0'), 'unchanged' or 'not counted'."""
        if self.counters:
            return self.counters[0].text()
        return "unchanged" if self.counted else "not counted"

    def counters_text(self) -> str:
        """Every counter that moved, largest change first ('-' if none)."""
        return ", ".join(c.text() for c in self.counters) or self.counter_text()

    def coverage_text(self) -> str:
        """'7 of 27 cases' when the run measured fewer cases than the finding has, else ''."""
        if self.cases_expected is not None and self.cases_measured < self.cases_expected:
            return f"{self.cases_measured} of {self.cases_expected} cases"
        return ""

    @property
    def css(self) -> str:
        """The verdict as a CSS class (colours the summary row)."""
        return self.verdict or "not_timed"


def _plus(seconds: float) -> str:
    """'+3.4 ms', '-43 ns': a time difference with its sign."""
    return ("+" if seconds >= 0 else "") + signed_seconds(seconds)


def _status_words(verdict: str | None, reason: str) -> str:
    words = {Verdict.NEEDS_CUDA.value: "needs CUDA, not measured on this machine",
             Verdict.FAILED.value: f"failed ({reason})",
             Verdict.MISMATCH.value: f"disagrees with the reference ({reason})",
             Verdict.NOT_TIMED.value: f"not timed ({reason})"}
    return words.get(verdict, f"{verdict or 'no verdict'} ({reason})" if reason else
                     verdict or "no verdict")


def _value(row: dict, key: str):
    value = row.get(key)
    return value if present(value) else None


def headline_case(rows: pd.DataFrame, baseline: str) -> str | None:
    """The case (label) the run marked as the finding's headline (`headline` rows, from
    `Reading.headline_case`); for runs made before that, the case nearest OLDER_RUNS_SIZE
    where `baseline` was timed, else nearest of all.

    Distance: the sum over the size params a case has of |log(value / default)|; ties
    go to the first case in run order (so 'dones=episode' before 'random').
    """
    if rows.empty:
        return None
    if "headline" in rows:
        marked = rows.loc[rows["headline"].fillna(False).astype(bool), "case"]
        if len(marked):
            return str(marked.iloc[0])
    cases = list(dict.fromkeys(rows["case"]))
    timed = rows[(rows["variant"] == baseline) & rows.get("median_s", pd.Series(
        dtype=float, index=rows.index)).notna()]
    candidates = [c for c in cases if c in set(timed["case"])] or cases
    first = {c: rows[rows["case"] == c].iloc[0] for c in candidates}

    def distance(case: str) -> float:
        row = first[case]
        total = 0.0
        for param, default in OLDER_RUNS_SIZE.items():
            value = row.get(param)
            if present(value) and isinstance(value, numbers.Real) and value > 0:
                total += abs(math.log(float(value) / default))
        return total

    return min(candidates, key=lambda c: (distance(c), candidates.index(c)))


def fastest(at: dict[str, dict], compared: list[str], variant: str) -> tuple[str, float] | None:
    """Another variant clearly faster than `variant` at one case, chosen so that picking
    the best of k does not favour the luckiest: each candidate's speed-up interval is
    widened to the level 1 - ALPHA / k (Bonferroni over the k variants compared), the
    best is the one whose interval's lower end is highest, and it is named only when that
    lower end lies above the upper end of `variant`'s widened interval. Rows without a
    paired standard error (older runs) use their own intervals. (name, speed-up) or None."""
    candidates = [v for v in compared if present(at[v].get("ratio"))]
    if variant not in candidates or len(candidates) < 2:
        return None
    level = 1.0 - ALPHA / len(candidates)

    def bounds(name: str) -> tuple[float, float]:
        """(low, high) of the speed-up at `level`."""
        row = at[name]
        if present(row.get("log_se")) and present(row.get("df")):
            return PairedEstimate(-math.log(row["ratio"]), row["log_se"], row["df"],
                                  rounds=1).interval(level)
        return 1.0 / row["ci_high"], 1.0 / row["ci_low"]

    best = max((v for v in candidates if v != variant), key=lambda v: bounds(v)[0])
    if bounds(best)[0] > bounds(variant)[1]:
        return best, 1.0 / float(at[best]["ratio"])
    return None


def _floor(at: dict[str, dict], placebos: set[str]) -> tuple | None:
    """`Headline.floor` from a case's rows: the placebo's (word, ratio, ci_low, ci_high)."""
    for name in placebos:
        row = at.get(name)
        if row is not None and _value(row, "verdict") is not None:
            return (row["verdict"], *(float(row[k]) if _value(row, k) is not None else None
                                      for k in ("ratio", "ci_low", "ci_high")))
    return None


def counter_changes(row: dict, base: dict) -> tuple[tuple[CounterChange, ...], bool]:
    """Counters of `row` that differ from `base` (same case), largest change first, and
    whether both carry counters at all."""
    changes, counted = [], False
    for key, label in COUNTERS.items():
        a, b = _value(base, key), _value(row, key)
        if a is None or b is None:
            continue
        counted = True
        if a != b:
            changes.append(CounterChange(label, float(a), float(b)))
    return tuple(sorted(changes, key=lambda c: -c.size)), counted


def headline(finding: str, rows: pd.DataFrame, *, claim: str, baseline: str,
             claim_factor: float | None = None, peers: tuple[str, ...] = (),
             cases_expected: int | None = None, answer: tuple[str, ...] = (),
             proposed: str | None = None, ours: tuple[str, ...] = (),
             per_iteration: tuple[float, str] | None = None,
             iteration_s: float | None = None) -> Headline:
    """The headline of one finding from its summary rows (one row per case x variant);
    `answer`: the finding's answer fields (`Reading.answer`); `proposed`: the variant the
    claim proposes (`Finding.proposed`); `ours`: `Finding.ours`; `per_iteration`:
    `Reading.per_iteration`, with `iteration_s` the iteration's baseline seconds."""
    empty = dict(finding=finding, claim=claim, baseline=baseline, claim_factor=claim_factor,
                 cases_expected=cases_expected, counters=(), counted=False, fastest=None,
                 ratio=None, ci_low=None, ci_high=None, reason="", variant=None, verdict=None,
                 ours=tuple(ours), per_iteration=per_iteration, iteration_s=iteration_s)
    case = headline_case(rows, baseline)
    if case is None:
        return Headline(case=None, where="", broken=(), cases_measured=0, **empty)
    records = rows.to_dict("records")
    broken = tuple(dict.fromkeys(r["variant"] for r in records if r.get("status") in _BROKEN))
    at = {r["variant"]: r for r in records if r["case"] == case}
    where = case_phrase(next(iter(at.values())))
    placebos = set(rows.loc[rows["placebo"].fillna(False).astype(bool), "variant"]) \
        if "placebo" in rows else set()
    common = dict(case=case, where=where, broken=broken,
                  cases_measured=len(dict.fromkeys(rows["case"])),
                  floor=_floor(at, placebos), baseline_s=_value(at.get(baseline, {}), "median_s"))
    others = [v for v in dict.fromkeys(rows["variant"]) if v != baseline and v not in placebos]
    if not others:
        return Headline(**common, **empty)
    compared = [v for v in others if v in at and at[v].get("verdict") in _COMPARED
                and at[v].get("compared_to") in (None, baseline)]
    variant = proposed if proposed in others else None
    if variant is None:
        own = [v for v in others if v not in peers]
        if len(own) == 1:
            variant = own[0]
        else:
            timed = [v for v in compared if v not in peers]
            variant = min(timed, key=lambda v: at[v]["ratio"]) if timed else (own or others)[0]
    row = at.get(variant, {})
    fields = dict(empty, variant=variant,
                  verdict=_value(row, "verdict") or _value(row, "status"),
                  reason=str(_value(row, "error") or _value(row, "reason") or ""))
    if variant in compared:
        fields.update(ratio=float(row["ratio"]), ci_low=float(row["ci_low"]),
                      ci_high=float(row["ci_high"]), lean=_value(row, "lean"),
                      rounds_to_decide=_value(row, "rounds_to_decide"),
                      processes_to_decide=_value(row, "processes_to_decide"),
                      claim_word=_value(row, "claim_word"),
                      claim_tolerance=_value(row, "claim_tolerance"),
                      margin=_value(row, "margin"), ci_level=_value(row, "ci_level"))
        fields["fastest"] = fastest(at, compared, variant)
        if _value(row, "one_thread_verdict") is not None:
            fields["one_thread"] = (row["one_thread_verdict"], float(row["one_thread_ratio"]),
                                    float(row["one_thread_ci_low"]),
                                    float(row["one_thread_ci_high"]))
            fields["one_thread_loaded"] = bool(_value(row, "one_thread_beside_load"))
    if baseline in at and variant in at:
        fields["counters"], fields["counted"] = counter_changes(at[variant], at[baseline])
    elif not row:
        fields["verdict"] = None
        fields["reason"] = f"the run has no {variant} row at {where}"
    fields["answers"] = tuple(found for name in answer for r in (row, at.get(baseline, {}))
                              if r for found in [estimate(r, name)] if found is not None)
    if answer and isinstance(row.get("decision"), str):
        fields["decision"] = row["decision"]
    return Headline(**common, **fields)
