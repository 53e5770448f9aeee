"""`auto` runs, per shape, the method the CROSSOVERS table ranks first among those present."""

from __future__ import annotations

import pytest
import torch

from esper import gae
from esper.gae.auto import CROSSOVERS, UNBOUNDED, choose
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
