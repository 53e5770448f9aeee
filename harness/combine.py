"""A run's words from every process that measured it: the process level measured in the run.

Each cell is timed in two or more fresh processes (`harness.replica`), and its journal
keeps every process's rounds (sample rows with their `process`). Once the run has its
cells, each row (a variant against its reference at one cell) becomes a `RowProcesses`;
the spread of the processes' estimates is pooled over the run's rows by call length and
held against how often rows disagree (`harness.measure.estimate`), and every row's ratio,
interval and word are computed from it (`word_fields`). Nothing here reads the machine:
the same files give the same words, so `harness.report` can word a run it reads back,
an interrupted one included.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from harness.measure.decision import (
    Word, claim_word, decide, lean, rounds_to_decide, word_p_value,
)
from harness.measure.estimate import (
    DISAGREE_LEVEL, Calibration, PairedEstimate, ProcessSpread, RowProcesses, calibrate,
    disagreement, long_run_factor, pool_spread, row_estimate,
)
from harness.measure.stats import Verdict

#: the interval level of a row whose sampling looked once (its checks raise it otherwise)
DEFAULT_LEVEL = 0.95


def word_fields(estimate: PairedEstimate, level: float, margin: float, variant: str,
                info: dict, placebo: bool = False) -> dict:
    """A row's ratio, interval at `level`, word at `margin` and, for a claim that states a
    factor (`info`: the finding's recorded `claim_factor`, `claim_tolerance`, `peers`), the
    claim's word (not for the `placebo`); where the word is inconclusive, which way it
    leans and about how many rounds would decide it."""
    low, high = estimate.interval(level)
    word = decide(low, high, margin)
    fields = dict(ratio=estimate.ratio, ci_low=low, ci_high=high, ci_level=level,
                  speedup=1.0 / estimate.ratio, ci_halfwidth=(high - low) / 2.0 / estimate.ratio,
                  verdict=Verdict(word.value).value, margin=margin, interval="paired",
                  log_se=estimate.se, df=estimate.df, processes=estimate.processes,
                  pvalue=word_p_value(estimate, word, margin))
    if word is Word.INCONCLUSIVE:
        fields.update(lean=lean(estimate.ratio, margin).value,
                      rounds_to_decide=rounds_to_decide(estimate, level, margin))
        if estimate.processes > 1:  # where a process's offset weighs, processes decide
            more = rounds_to_decide(dataclasses.replace(estimate, rounds=estimate.processes),
                                    level, margin)
            if more is not None:
                fields["processes_to_decide"] = more
    factor = info.get("claim_factor")
    if factor is not None and not placebo and variant not in info.get("peers", ()):
        tolerance = info.get("claim_tolerance", 0.25)
        fields.update(claim_factor=factor, claim_tolerance=tolerance,
                      claim_word=claim_word(1.0 / high, 1.0 / low, factor, tolerance).value)
    return fields


def _rounds(samples: Sequence[dict]) -> dict[tuple[str, str], dict[int, dict[str, list]]]:
    """(finding, case) -> process -> variant -> its seconds per call in round order."""
    found: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row in sorted(samples, key=lambda r: (r.get("process") or 1, r.get("round") or 0)):
        found[(row["finding"], row["case"])][row.get("process") or 1][row["variant"]].append(
            row["seconds"])
    return found


def row_processes(summary: Sequence[dict], samples: Sequence[dict]
                  ) -> dict[tuple[str, str, str], RowProcesses]:
    """(finding, case, variant) -> its rounds in every process that timed both it and its
    reference (`compared_to`), paired by round, for every timed row but the reference."""
    rounds = _rounds(samples)
    paired = {}
    for row in summary:
        reference = row.get("compared_to")
        if row.get("status") != "ok" or not reference or row["variant"] == reference:
            continue
        pairs = []
        for by_variant in rounds.get((row["finding"], row["case"]), {}).values():
            own, base = by_variant.get(row["variant"], []), by_variant.get(reference, [])
            n = min(len(own), len(base))
            if n >= 2:
                pairs.append((own[:n], base[:n]))
        if pairs:
            paired[(row["finding"], row["case"], row["variant"])] = (pairs, row)
    # the correlation of neighbouring rounds, measured over the run's rows at once
    long_run = long_run_factor([pair for pairs, _ in paired.values() for pair in pairs])
    return {key: RowProcesses.of(pairs, pooled=not row.get("placebo"), long_run=long_run)
            for key, (pairs, row) in paired.items()}


@dataclass(frozen=True)
class Combined:
    """A run's rows worded from all their processes, and the process level behind them."""

    summary: list[dict]
    spread: ProcessSpread
    calibration: Calibration
    rows: dict[tuple[str, str, str], RowProcesses]

    def undecided(self, max_processes: int) -> list[tuple[str, str, str]]:
        """The rows whose word is still inconclusive and whose processes disagree with
        their band, or that at most `max_processes` processes would decide (a lone row,
        say, whose process level has one degree of freedom): the cells to measure in more
        processes."""
        worded = {(r["finding"], r["case"], r["variant"]): r for r in self.summary}
        wanted = []
        for key, row in self.rows.items():
            word = worded.get(key, {})
            if row.processes < 2 or word.get("verdict") != Verdict.INCONCLUSIVE.value:
                continue
            more = word.get("processes_to_decide")
            if (disagreement(row, self.spread) < DISAGREE_LEVEL
                    or (more is not None and more <= max_processes)):
                wanted.append(key)
        return wanted

    def noise(self) -> dict:
        """What run.json keeps of the process level: per band, the offset's standard
        deviation (log units), its degrees of freedom, the rows it was pooled from (its
        own, or the run's) and the rows it worded; the calibration."""
        lengths = [self.spread.bands.index(self.spread.band(r.seconds))
                   for r in self.rows.values()]
        return {"bands": [{"upper_s": None if math.isinf(b.upper_s) else b.upper_s,
                           "sd": math.sqrt(b.tau2 * self.spread.inflation), "df": b.df,
                           "rows": b.rows, "own": b.own, "worded": lengths.count(index)}
                          for index, b in enumerate(self.spread.bands)],
                "calibration": asdict(self.calibration)}


def combine(summary: Sequence[dict], samples: Sequence[dict], finding_info: dict[str, dict],
            margin: float, threads: int | None = None) -> Combined:
    """Every row of `summary` worded from all its processes' rounds in `samples` (module
    docstring); `finding_info` (run.json's) gives each finding's margin and claim, `margin`
    the run's where a finding records none. Samples taken at another thread count than the
    run's `threads` (its headline cells again at one thread) word the rows' `one_thread_*`
    fields instead, held to the same process spread."""
    main = [r for r in samples if threads is None or r.get("threads", threads) == threads]
    other = [r for r in samples if threads is not None and r.get("threads", threads) != threads]
    rows = row_processes(summary, main)
    spread, calibration = calibrate(list(rows.values()), pool_spread(list(rows.values())))
    one_thread = row_processes(summary, other) if other else {}
    worded = []
    for row in summary:
        key = (row["finding"], row["case"], row["variant"])
        if key not in rows:
            worded.append(dict(row))
            continue
        info = finding_info.get(row["finding"], {})
        processes = rows[key]
        estimate = row_estimate(processes, spread)
        band = spread.band(processes.seconds)
        # the margin the run recorded for the finding (Finding.margin_under); else the run's
        wording = dict(level=row.get("ci_level") or DEFAULT_LEVEL,
                       margin=info.get("margin") or margin, variant=row["variant"], info=info,
                       placebo=bool(row.get("placebo")))
        fields = word_fields(estimate, **wording)
        fields.update(process_sd=math.sqrt(band.tau2 * spread.inflation),
                      process_df=band.df, process_p=disagreement(processes, spread))
        if key in one_thread:
            alone = word_fields(row_estimate(one_thread[key], spread), **wording)
            fields.update(one_thread_ratio=alone["ratio"], one_thread_ci_low=alone["ci_low"],
                          one_thread_ci_high=alone["ci_high"],
                          one_thread_verdict=alone["verdict"])
        worded.append({**{k: v for k, v in row.items() if k not in (
            "lean", "rounds_to_decide", "processes_to_decide", "claim_word")}, **fields})
    return Combined(worded, spread, calibration, rows)
