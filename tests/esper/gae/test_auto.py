"""`auto` runs, per shape, the method the CROSSOVERS table ranks first among those present."""

from __future__ import annotations

import pytest
import torch

from esper import gae
from esper.gae.crossovers import CROSSOVERS, UNBOUNDED
from esper.gae.methods import choose
from tests.gae_inputs import make_case

SHAPES = [(1, 25), (4, 128), (16, 256), (64, 128), (256, 1024), (1024, 256), (4096, 8192)]


def table_says(device_type: str, num_envs: int, max_steps: int) -> str:
    """Read the table by hand: the first row bounding the shape, then its first method
    registered here for the device."""
    row = next(r for r in CROSSOVERS if r.device_type == device_type
               and num_envs <= r.max_envs and max_steps <= r.max_steps)
    return next(m for m in row.ranking
                if m in gae.METHODS and device_type in gae.DEVICE_TYPES[m])


def test_every_device_has_a_catch_all_last_row():
    for device_type in ("cpu", "cuda"):
        rows = [r for r in CROSSOVERS if r.device_type == device_type]
        assert (rows[-1].max_envs, rows[-1].max_steps) == (UNBOUNDED, UNBOUNDED)
    assert all(r.measured for r in CROSSOVERS if r.device_type == "cpu")
    assert not any(r.measured for r in CROSSOVERS if r.device_type == "cuda")


@pytest.mark.parametrize(("num_envs", "max_steps"), SHAPES)
def test_choose_follows_the_table(num_envs, max_steps):
    assert choose("cpu", num_envs, max_steps) == table_says("cpu", num_envs, max_steps)
    cuda = "triton" if "cuda" in gae.DEVICE_TYPES.get("triton", ()) else "scan"
    assert choose("cuda", num_envs, max_steps) == cuda


@pytest.mark.parametrize(("num_envs", "max_steps"), SHAPES[:5])
def test_auto_returns_what_the_chosen_method_returns(num_envs, max_steps):
    case = make_case(num_envs, max_steps, seed=num_envs, dtype=torch.float32)
    chosen = table_says("cpu", num_envs, max_steps)
    got = gae.compute_gae(*case.args(True), gamma=0.99, gae_lambda=0.95, method="auto")
    want = gae.compute_gae(*case.args(True), gamma=0.99, gae_lambda=0.95, method=chosen)
    for g, w in zip(got, want):
        assert torch.equal(g, w), f"auto at {num_envs}x{max_steps} is not {chosen}"


def test_methods_device_types_and_autograd_all_come_from_the_one_table():
    from esper.gae.methods import TABLE

    here = [m for m in TABLE if m.device_types]
    assert list(gae.METHODS) == [m.name for m in here]
    assert list(gae.METHODS)[0] == "loop"  # the original first: Variants.original() takes it
    assert gae.DEVICE_TYPES == {m.name: m.device_types for m in here}
    assert gae.NON_DIFFERENTIABLE == {m.name for m in TABLE if not m.differentiable}
    assert gae.NON_DIFFERENTIABLE == {"numba", "triton"}


def test_auto_is_one_method_of_the_table_and_chooses_only_from_it():
    from esper.gae.methods import TABLE, gae_auto

    assert gae.METHODS["auto"] is gae_auto
    assert [m.name for m in TABLE].count("auto") == 1
    for device_type in ("cpu", "cuda"):
        for num_envs, max_steps in SHAPES:
            for differentiable in (False, True):
                chosen = choose(device_type, num_envs, max_steps, differentiable)
                assert chosen == "scan" or device_type in gae.DEVICE_TYPES[chosen]
                assert not (differentiable and chosen in gae.NON_DIFFERENTIABLE)
