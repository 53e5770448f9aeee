"""The run's budget: one number of wall seconds, shared out as the run goes.

A run has `budget_s` seconds, its report included. What is not sampling (loading the
findings, each cell's inputs, first calls, checks and profiling, the workers' start, the
report: what the last report took a finding, `report_s`) is a cost to be paid; what is
left is shared out over the cells by their weight
(`Recording.budget_factor`, times the variants a cell times) and over the processes that
time each cell. The plan starts from what the cells cost in the newest earlier runs of
the same results folder (else a guess), and is made again before every cell from what
this run has spent so far, so a slower machine samples less rather than running longer;
each process always takes its minimum rounds. Every finding's headline cell is measured;
the others come after them, and a cell that would start past the budget (less its
reserve; with what an earlier run says it costs, where one did) is left out, said in its
rows (`BUDGET_LEFT_OUT`), so that a slower machine answers every finding's headline and
as much of the rest as its budget pays, and ends in time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: a cell's fixed cost (inputs, first calls, checks, profile) when no earlier run knows it
GUESS_FIXED_S = 1.5
#: the share of the budget kept for rows whose processes disagree (more processes)
RESERVE_SHARE = 0.06
#: seconds of report (figures, page) per finding where no earlier report says (`report_s`)
GUESS_REPORT_S = 0.3
#: seconds to combine and print the run's rows, beside the report
FINISH_S = 1.0
#: the most of the budget the report's reserve takes, whatever an earlier report took
REPORT_MAX_SHARE = 0.25
#: the least sampling a process gets for a cell (its minimum rounds come on top)
FLOOR_S = 0.02
#: how the row of a variant begins whose profile the run's budget could not pay
#: (`Plan.spare_s`)
BUDGET_UNPROFILED = "not profiled to keep the run's budget"
#: how the reason of a row begins whose cell the run's budget could not pay (`Plan.fits`)
BUDGET_LEFT_OUT = "left out to keep the run's budget"


@dataclass
class Plan:
    """Shares `budget_s` out over `weights` (cell key -> weight) timed in `processes`."""

    budget_s: float
    weights: dict[tuple[str, str], float]
    processes: int
    known_fixed_s: dict[tuple[str, str], float] = field(default_factory=dict)
    """A cell's fixed cost in an earlier run, where one is known."""
    known_cost_s: dict[tuple[str, str], float] = field(default_factory=dict)
    """A cell's whole seconds (all processes) in an earlier run, where one is known."""
    started: float = field(default_factory=time.perf_counter)
    spent_fixed_s: float = 0.0
    """Fixed costs paid so far (all processes)."""
    spent_sampling_s: float = 0.0
    done: set = field(default_factory=set)
    _scale: float = 1.0
    """This run's fixed costs over the plan's estimate of the cells done (a slower machine
    pays more than an earlier run did)."""
    _estimated_done_s: float = 0.0
    report_s: float = 0.0
    """Seconds kept at the end for combining the rows and the report (`report_s`)."""

    def end_s(self) -> float:
        """Seconds from the start by which the cells end: the budget less the reserve for
        more processes and the report's seconds."""
        return self.budget_s * (1.0 - RESERVE_SHARE) - self.report_s

    def _fixed(self, key: tuple[str, str]) -> float:
        return self.known_fixed_s.get(key, GUESS_FIXED_S * self.processes)

    def remaining_fixed_s(self) -> float:
        """The fixed costs of the cells still to measure, as this run pays them."""
        return self._scale * sum(self._fixed(k) for k in self.weights if k not in self.done)

    def sampling_s(self) -> float:
        """Seconds of sampling left to share out over the cells still to measure."""
        elapsed = time.perf_counter() - self.started
        left = self.end_s() - elapsed - self.remaining_fixed_s()
        return max(left, 0.0)

    def share(self, key: tuple[str, str]) -> float:
        """One process's seconds of sampling of the cell `key`, from what is left now."""
        weight_left = sum(w for k, w in self.weights.items() if k not in self.done)
        if weight_left <= 0:
            return FLOOR_S
        return max(FLOOR_S, self.sampling_s() * self.weights[key] / weight_left
                   / self.processes)

    def left_s(self) -> float:
        """Seconds until the budget less its reserve is spent (negative once past it)."""
        return self.end_s() - (time.perf_counter() - self.started)

    def fits(self, key: tuple[str, str]) -> bool:
        """Whether the cell `key` may still be measured: the budget less its reserve is not
        spent, nor would be by what the cell cost in an earlier run (where one did)."""
        return self.known_cost_s.get(key, 0.0) <= self.left_s()

    def left_out(self, key: tuple[str, str]) -> None:
        """The cell `key` is not measured: its fixed cost leaves the plan."""
        self.done.add(key)

    def spare_s(self, key: tuple[str, str]) -> float:
        """Seconds the cell `key`, being measured, may still spend (on its profile) without
        the run ending past its budget: what is left of it less the reserve, the fixed
        costs of the cells still to come and their least sampling; 0 when nothing is."""
        coming = [k for k in self.weights if k not in self.done and k != key]
        elapsed = time.perf_counter() - self.started
        left = (self.end_s() - elapsed
                - self._scale * sum(self._fixed(k) for k in coming)
                - FLOOR_S * self.processes * len(coming))
        return max(left, 0.0)

    def measured(self, key: tuple[str, str], fixed_s: float, sampling_s: float) -> None:
        """Record what the cell `key` cost (all processes), and learn the run's pace."""
        self.done.add(key)
        self.spent_fixed_s += fixed_s
        self.spent_sampling_s += sampling_s
        self._estimated_done_s += self._fixed(key)
        if self._estimated_done_s > 0:
            self._scale = max(self.spent_fixed_s / self._estimated_done_s, 0.05)

    def describe(self) -> str:
        """The plan as the run starts it: cells, processes, budget, how it splits."""
        fixed = self.remaining_fixed_s()
        sampling = self.sampling_s()
        cells = len(self.weights)
        source = "from earlier runs" if self.known_fixed_s else "a guess"
        if sampling > 0:
            per_cell = sampling / max(cells, 1) / self.processes
            split = (f"about {sampling:.0f} s of sampling ({per_cell:.2g} s a cell per "
                     f"process), {fixed:.0f} s of inputs, first calls, checks and profiling "
                     f"({source})")
        else:  # the guess alone spends the budget: the measured pace decides
            split = (f"{fixed:.0f} s of inputs, first calls, checks and profiling ({source}: "
                     "more than the budget; sampling is shared out from the pace measured "
                     "cell by cell)")
        return (f"plan: {cells} cells, each timed in {self.processes} processes, within "
                f"{self.budget_s:.0f} s: {split}, {RESERVE_SHARE * self.budget_s:.0f} s kept "
                f"for rows whose processes disagree and {self.report_s:.0f} s to combine the "
                "rows and report them")


def affordable(costs: dict, start_s: float, left_s: float) -> list:
    """The keys of `costs` (cell -> seconds it costs one fresh process: inputs, first
    calls, sampling), in order, that a fresh process started now (`start_s`: its
    interpreter, torch, the findings modules) measures within the `left_s` seconds the
    budget has left; a cell that would not fit is skipped for those after it that do."""
    spent, chosen = start_s, []
    for key, cost in costs.items():
        if spent + cost <= left_s:
            spent += cost
            chosen.append(key)
    return chosen


def report_s(earlier: dict | None, findings: int, budget_s: float) -> float:
    """Seconds a run of `findings` findings (0: no report) keeps of its `budget_s` for
    combining its rows and its report: the `earlier` report's (its `import_s` once, its
    `render_s` a finding, `findings` of them), else a guess of GUESS_REPORT_S a finding;
    FINISH_S on top; at most REPORT_MAX_SHARE of the budget."""
    if findings <= 0:
        return min(FINISH_S, REPORT_MAX_SHARE * budget_s)
    if earlier:
        seconds = earlier["import_s"] + earlier["render_s"] / earlier["findings"] * findings
    else:
        seconds = GUESS_REPORT_S * findings
    return min(FINISH_S + seconds, REPORT_MAX_SHARE * budget_s)
