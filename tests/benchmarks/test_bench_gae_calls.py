"""pytest-benchmark entries for the small GAE calls `python -m esper_review.gae_tools.floor`
measures: the dispatch floors, every `compute_gae` method but the loop, and the input
check, at 4 x 25 and 64 x 128, on one torch thread.

The same calls, built by the same code (`esper_review.gae_tools.floor.shape_calls`), so a
regression here reads the same in the floor command. Run as docs/gate.md shows.
"""

from __future__ import annotations

import pytest

from esper.gae import DEVICE_TYPES, METHODS
from esper_review.gae_tools import floor

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif("numba" not in METHODS, reason="the floor is a numba no-op")]

METHODS_TIMED = [m for m in METHODS if m != "loop" and "cpu" in DEVICE_TYPES[m]]
CALLS = [floor.FLOOR, floor.FLOOR_NUMPY, *METHODS_TIMED, floor.CHECK]


@pytest.fixture(scope="module")
def calls():
    """shape -> name -> the zero-argument call."""
    return {shape: floor.shape_calls(floor.shape_args(shape), METHODS_TIMED)
            for shape in floor.SHAPES}


@pytest.mark.parametrize("shape", floor.SHAPES, ids=[f"{e}x{t}" for e, t in floor.SHAPES])
@pytest.mark.parametrize("name", CALLS)
def test_gae_call(benchmark, calls, shape, name):
    call = calls[shape][name]
    call()  # a first call compiles (compiled, numba) outside the timing
    benchmark.group = f"gae call {shape[0]}x{shape[1]}"
    benchmark(call)
