"""The process level measured in the run (`pool_spread`, `row_estimate`, `calibrate`),
proven on synthetic runs drawn from models the estimator is not told.

A synthetic run has rows of three call lengths, each measured in two fresh processes and,
where their estimates disagree, in two more (as the run does): rounds from the drifting,
pausing clock of test_estimate.py, and per process an offset of the ratio from one of
these models:

- gaussian: normal offsets whose size depends on the call length (the estimator's own
  picture, as far as it has one);
- heavy tails: Student t offsets with 3 degrees of freedom;
- two modes: most processes near 0, one in five shifted by 15% (a process that lands its
  data badly);
- shared shifts: most of a process's offset is common to every row that process measures
  (a process that is slow at everything), the rest its own.

The truth a row's interval must cover is the ratio of the typical process: the median
over processes (in the two-mode model, the mode four processes in five are in), as a
reference measured in many fresh processes reads it. The bars: 95% intervals cover it in
at least 93% of rows under every model, and a ratio of 1 in a quiet model reads decisive
at most 5% of the time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.measure.estimate import (
    BandSpread, ProcessSpread, RowProcesses, calibrate, disagreement, long_run_factor,
    pool_spread, row_estimate, rounds_estimate,
)
from tests.harness.measure.test_estimate import ar1

#: per call length (seconds): the size of the offsets a process gives a ratio there
SIZES = {5e-6: 0.04, 2e-4: 0.02, 2e-2: 0.008}
ROWS_PER_SIZE = 14


def _offsets(rng: np.random.Generator, model: str, size: float, count: int,
             shared: np.ndarray) -> np.ndarray:
    """`count` processes' offsets of one row's ratio under `model` (`shared`: each
    process's offset common to all its rows, in units of `size`)."""
    if model == "gaussian":
        return rng.normal(0.0, size, count)
    if model == "heavy tails":
        return size * rng.standard_t(3, count) / math.sqrt(3.0)
    if model == "two modes":
        return rng.normal(0.0, size / 4, count) + 0.15 * (rng.random(count) < 0.2)
    if model == "shared shifts":
        return size * (0.8 * shared[:count] + 0.6 * rng.normal(0.0, 1.0, count))
    raise ValueError(model)




def _process_rounds(rng, log_ratio: float, offset: float, seconds: float, rounds: int):
    drift = ar1(rng, 0.8, 0.1, (rounds,))
    own = ar1(rng, 0.2, 0.06, (2, rounds))
    paused = (rng.random((2, rounds)) < 0.03) * rng.exponential(0.5, (2, rounds))
    baseline = seconds * np.exp(drift + own[0] + paused[0])
    variant = seconds * np.exp(log_ratio + offset + drift + own[1] + paused[1])
    return variant, baseline


def synthetic_run(rng, model: str, log_ratio: float = math.log(0.8), rounds: int = 24,
                  extra: int = 2) -> list[tuple[RowProcesses, float]]:
    """(row, its truth) for every row of one synthetic run, measured as the run measures:
    two processes, then `extra` more for the rows whose processes disagree."""
    shared = rng.normal(0.0, 1.0, 2 + extra)
    plan = [(seconds, size) for seconds, size in SIZES.items() for _ in range(ROWS_PER_SIZE)]
    offsets = [_offsets(rng, model, size, 2 + extra, shared) for _, size in plan]
    processes = [[_process_rounds(rng, log_ratio, o, seconds, rounds) for o in offs[:2]]
                 for (seconds, _), offs in zip(plan, offsets)]
    long_run = long_run_factor([pair for row in processes for pair in row])
    rows = [RowProcesses.of(p, long_run=long_run) for p in processes]
    spread, _ = calibrate(rows, pool_spread(rows))
    for index, row in enumerate(rows):
        if disagreement(row, spread) < 0.05:
            seconds = plan[index][0]
            processes[index] += [_process_rounds(rng, log_ratio, o, seconds, rounds)
                                 for o in offsets[index][2:]]
    # as the run words them: the correlation of rounds measured over all its rows at once
    long_run = long_run_factor([pair for row in processes for pair in row])
    rows = [RowProcesses.of(p, long_run=long_run) for p in processes]
    return [(row, log_ratio) for row in rows]  # every model's median offset is 0


def _run_intervals(rows: list[tuple[RowProcesses, float]]) -> list[tuple[float, float, float]]:
    """(low, high, truth) in log units of every row, as the run words them."""
    plain = [row for row, _ in rows]
    spread, _ = calibrate(plain, pool_spread(plain))
    out = []
    for row, truth in rows:
        low, high = row_estimate(row, spread).interval(0.95)
        out.append((math.log(low), math.log(high), truth))
    return out


@pytest.mark.parametrize("rounds", [24, 6])  # 6: a quick run's rounds a process
@pytest.mark.parametrize("model", ["gaussian", "heavy tails", "two modes", "shared shifts"])
def test_intervals_cover_the_truth_under_models_the_estimator_is_not_told(model, rounds):
    rng = np.random.default_rng(["gaussian", "heavy tails", "two modes",
                                 "shared shifts"].index(model))
    hits = total = 0
    for _ in range(30):
        for low, high, truth in _run_intervals(synthetic_run(rng, model, rounds=rounds)):
            hits += low <= truth <= high
            total += 1
    assert hits / total >= 0.93, f"{model}: coverage {hits / total:.3f} over {total} rows"


def test_a_ratio_of_one_reads_decisive_rarely_in_a_quiet_model():
    """No difference at all, gaussian offsets: an interval wholly beyond +-5% is a false
    word; at most 5% of rows."""
    rng = np.random.default_rng(7)
    wrong = total = 0
    for _ in range(20):
        for low, high, _ in _run_intervals(synthetic_run(rng, "gaussian", log_ratio=0.0)):
            wrong += high < math.log(1 / 1.05) or low > math.log(1.05)
            total += 1
    assert wrong / total <= 0.05


def test_the_pool_finds_each_bands_offset_and_the_runs_own_degrees_of_freedom():
    """Over ten runs (a median over 14 one-degree-of-freedom spreads moves a lot within
    one), each band's offset comes out near the size the model gave that call length."""
    rng = np.random.default_rng(3)
    found = {seconds: [] for seconds in SIZES}
    for _ in range(10):
        spread = pool_spread([row for row, _ in synthetic_run(rng, "gaussian", extra=0)])
        for seconds in SIZES:
            band = spread.band(seconds)
            assert band.rows == ROWS_PER_SIZE and 0.0 < band.df <= ROWS_PER_SIZE
            found[seconds].append(math.sqrt(band.tau2))
    for seconds, size in SIZES.items():
        assert size / 2 <= float(np.median(found[seconds])) <= size * 2, (seconds, found[seconds])


def test_a_row_whose_processes_disagree_is_named_and_gets_its_own_spread():
    rng = np.random.default_rng(4)
    quiet = [RowProcesses.of([_process_rounds(rng, 0.0, o, 1e-4, 30) for o in
                              rng.normal(0.0, 0.01, 2)]) for _ in range(20)]
    split = RowProcesses.of([_process_rounds(rng, 0.0, o, 1e-4, 30) for o in (0.0, 0.3)])
    spread = pool_spread([*quiet, split])
    assert disagreement(split, spread) < 0.01
    assert sum(disagreement(r, spread) < 0.05 for r in quiet) <= 3
    own = row_estimate(split, spread)  # not held to the band: its own spread, 1 df
    assert own.df == 1.0 and own.interval(0.95)[1] / own.interval(0.95)[0] > 1.5


def test_a_run_whose_rows_disagree_too_often_is_widened_and_says_by_how_much():
    """One row in eight split by 15% between its processes, beside quiet ones: the rows
    vary little enough for the pool to keep its degrees of freedom, yet more of them
    disagree than chance allows; the calibration inflates the offset variance until chance
    explains them. (Where the rows vary more, the pool's degrees of freedom fall instead,
    which widens every interval by itself: test_the_rows_own_variety_lowers_the_pools_df.)"""
    rng = np.random.default_rng(5)
    rows = []
    for index in range(80):
        offsets = rng.normal(0.0, 0.01, 2) + (0.15 * np.array([0, 1]) if index % 8 == 0 else 0)
        rows.append(RowProcesses.of([_process_rounds(rng, 0.0, o, 1e-4, 30) for o in offsets]))
    spread, calibration = calibrate(rows, pool_spread(rows))
    assert calibration.too_narrow and calibration.disagreeing > calibration.expected
    assert spread.inflation == calibration.inflation > 1.0
    assert sum(disagreement(r, spread) < 0.05 for r in rows) <= calibration.expected


def test_the_rows_own_variety_lowers_the_pools_df():
    """One row in four split by 30%: the scaled spreads vary far beyond chi-square
    sampling, so the pooled variance carries few degrees of freedom (every row's interval
    leans on its own processes), where quiet rows (offsets of 2%, above their rounds'
    noise) let it carry most of theirs."""
    rng = np.random.default_rng(8)

    def band_df(split_every: int) -> float:
        rows = [RowProcesses.of([_process_rounds(rng, 0.0, o, 1e-4, 40) for o in
                                 rng.normal(0.0, 0.02, 2) + (0.3 * np.array([0, 1])
                                                             if i % split_every == 0 else 0)])
                for i in range(60)]
        return pool_spread(rows).band(1e-4).df

    assert band_df(4) < 3.0 < 30.0 < band_df(10**6)


def test_a_row_of_one_process_with_nothing_to_pool_is_wide_never_narrow():
    rng = np.random.default_rng(6)
    alone = RowProcesses.of([_process_rounds(rng, 0.0, 0.0, 1e-4, 30)])
    nothing = ProcessSpread(tuple(BandSpread(u, 0.0, 0.0, 0) for u in (2e-5, 2e-3, math.inf)))
    estimate = row_estimate(alone, nothing)
    own = rounds_estimate(*_process_rounds(np.random.default_rng(6), 0.0, 0.0, 1e-4, 30))
    assert estimate.df == 1.0 and estimate.se > own.se


def test_rows_without_processes_are_refused():
    with pytest.raises(ValueError, match="processes: expected at least one"):
        RowProcesses.of([])


@pytest.mark.parametrize("phi", [0.0, 0.3, 0.6])
def test_the_long_run_factor_is_measured_over_the_runs_rows_at_once(phi):
    """60 processes of 12 rounds, their log ratios AR(1) with correlation `phi`: pooled,
    the factor lands near (1 + phi) / (1 - phi); one process's own factor, from its 12
    rounds, scatters from 1 to many times that."""
    rng = np.random.default_rng(int(phi * 10))
    processes = []
    for _ in range(60):
        noise = ar1(rng, phi, 0.05, (12,))
        baseline = 1e-3 * np.exp(rng.normal(0.0, 0.01, 12))
        processes.append((baseline * np.exp(noise), baseline))
    truth = (1 + phi) / (1 - phi)
    assert truth / 1.35 <= long_run_factor(processes) <= truth * 1.35
    own = [long_run_factor([p]) for p in processes]
    assert max(own) / min(own) > 2.0

