"""esper_review.gae_tools.floor: sampling with a stand-in clock, the targets from hand-made
samples, the command's exit codes, and one short real run (ratios only, with margins)."""

from __future__ import annotations

import importlib.metadata
import time

import numpy as np
import pytest
import torch

from esper.gae import METHODS
from esper_review.gae_tools import floor
from esper_review.gae_tools.floor import (
    CHECK, FLOOR_NUMPY, NO_OP, SMALL, ShapeResult, batch_sizes, check_targets, main,
    markdown, sample_rounds,
)

pytestmark = [pytest.mark.skipif("numba" not in METHODS, reason="the floor is a numba no-op"),
              pytest.mark.usefixtures("one_thread")]


class StandInClock:
    """Nanoseconds that move only when a stand-in call says it took some."""

    def __init__(self) -> None:
        self.now = 0
        self.ran: list[str] = []

    def __call__(self) -> int:
        return self.now

    def call(self, name: str, ns: int):
        def run():
            self.ran.append(name)
            self.now += ns
        return run


def test_samples_are_seconds_per_call_and_each_round_runs_every_call_once_in_its_own_order():
    clock = StandInClock()
    calls = {"a": clock.call("a", 1_000), "b": clock.call("b", 3_000), "c": clock.call("c", 500)}
    samples = sample_rounds(calls, {"a": 2, "b": 1, "c": 4}, rounds=30, clock=clock)
    for name, seconds in {"a": 1e-6, "b": 3e-6, "c": 5e-7}.items():
        assert samples[name] == pytest.approx(np.full(30, seconds), rel=1e-12)
    rounds = []
    for k in range(30):  # each round: a twice, b once, c four times, one name after another
        ran = clock.ran[k * 7:(k + 1) * 7]
        assert sorted(ran) == ["a"] * 2 + ["b"] + ["c"] * 4
        rounds.append(tuple(dict.fromkeys(ran)))
    assert len(set(rounds)) > 1  # not one fixed order (30 equal orders: chance 6**-29)
    assert {r[0] for r in rounds} == {"a", "b", "c"}  # every call runs first in some round


def test_batches_hold_about_one_sample_of_calls():
    clock = StandInClock()
    sizes = batch_sizes({"fast": clock.call("fast", 10_000), "slow": clock.call("slow", 10**9)},
                        clock, sample_s=100e-6)
    assert sizes == {"fast": 10, "slow": 1}


def _result(shape, **microseconds) -> ShapeResult:
    """Samples over 40 rounds with a little spread around the given microseconds."""
    spread = np.linspace(0.98, 1.02, 40)
    return ShapeResult(shape, {name: us * 1e-6 * spread for name, us in microseconds.items()},
                       auto_pick="numba")


def _calls(numba_us: float, auto_us: float, check_us: float) -> dict:
    return dict(floor=2.0, floor_numpy=6.0, numba=numba_us, auto=auto_us, scan=200.0,
                check=check_us + 0.2, no_op_call=0.2)


def test_targets_from_hand_made_samples():
    held = check_targets([_result(SMALL, **_calls(8.0, 8.5, 0.8)),
                          _result((64, 128), **_calls(20.0, 20.5, 0.9))])
    assert [t.held for t in held] == [True] * 5
    assert "1.33x" in held[0].evidence and "4.00x" in held[0].evidence  # NumPy floor; address

    missed = check_targets([_result(SMALL, **_calls(9.5, 11.0, 2.5)),
                            _result((64, 128), **_calls(20.0, 20.5, 0.9))])
    assert [t.held for t in missed] == [False, False, False, True, True]
    assert "+1.50 us" in missed[1].evidence and "2.50 us" in missed[2].evidence
    assert "under 2.00 us" in missed[2].name  # every check kept: the 1 us target is withdrawn


def test_a_target_whose_method_was_left_out_is_not_measured_not_missed():
    samples = _calls(8.0, 8.5, 0.8)
    del samples["numba"], samples["auto"]
    targets = check_targets([_result(SMALL, **samples)])
    assert [t.held for t in targets] == [None, None, True]


def test_markdown_has_a_row_per_call_with_its_multiple_of_the_floor():
    result = _result(SMALL, **_calls(8.0, 8.5, 0.8))
    text = markdown([result], ["numba", "auto", "scan"])
    assert "| floor | 2.00 | 1.00x (1.00-1.00) | 0.33x |" in text
    assert "| numba | 8.00 | 4.00x (4.00-4.00) | 1.33x |" in text
    assert "| auto (picks numba) | 8.50 |" in text
    assert "- input check: 0.80 us" in text


def test_the_floors_allocate_outputs_as_the_numba_method_does():
    args = floor.shape_args(SMALL)
    for name, call in floor.floor_calls(args).items():
        advantages, returns = call()
        assert advantages.shape == returns.shape == args[0].shape, name
        assert advantages.dtype == torch.float32 and advantages.is_contiguous(), name


def test_usage_errors_exit_2(capsys):
    assert main(["--rounds", "5"]) == 2
    assert "--rounds: expected an integer >= 10; got '5'" in capsys.readouterr().err
    assert main(["--methods", "numba,fast"]) == 2
    assert "--methods: expected a comma-separated list of" in capsys.readouterr().err


def test_version_and_exit_codes_in_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == (
        f"python -m esper_review.gae_tools.floor {importlib.metadata.version('esper-bench')}\n")
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert "  1    a target missed" in help_text and "  2    usage or input error" in help_text


def test_an_unexpected_exception_exits_3(monkeypatch, capsys):
    def planted(*args, **kwargs):
        raise RuntimeError("planted bug")

    monkeypatch.setattr(floor, "measure_shape", planted)
    assert main(["--methods", "numba", "--rounds", "10"]) == 3
    assert "RuntimeError: planted bug" in capsys.readouterr().err


def test_a_short_real_run_orders_the_calls_as_their_work_does(capsys):
    """Real calls, few rounds: only ratios with wide margins. The numba call does the
    address floor's work and more (the check, the kernel); a NumPy view dispatches four
    aten ops, an address none. The printed report has every part; its exit status depends
    on this machine's speed, so only its range is checked."""
    result = floor.measure_shape(SMALL, ["numba"], rounds=30, clock=time.perf_counter_ns)
    assert result.over_floor("numba").value > 1.2
    assert result.over_floor(FLOOR_NUMPY).value > 1.3
    assert result.median_s(CHECK) > result.median_s(NO_OP)

    assert main(["--methods", "numba,auto", "--rounds", "10"]) in (0, 1)
    out = capsys.readouterr()
    assert "1 torch thread" in out.out and "| auto (picks numba) |" in out.out
    assert "| target | held |" in out.out and "compiled vs scan: not measured" in out.out
    assert "measuring 64x128 (10 rounds)" in out.err
