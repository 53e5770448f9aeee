"""Tolerances from the arithmetic (`harness.findings.rounding`): the bound holds for
computations it was not fitted to, on every kernel path, and still catches a wrong value."""

from __future__ import annotations

import math

import pytest
import torch

from harness import max_relative_error, rounding_tolerance, unit_roundoff
from harness.findings import Case, Finding


def test_unit_roundoff_is_half_the_machine_epsilon_of_each_dtype():
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        assert unit_roundoff(dtype) == torch.finfo(dtype).eps / 2
    with pytest.raises(ValueError, match=r"unit_roundoff: dtype: expected one of .*; got torch.int64"):
        unit_roundoff(torch.int64)


def test_the_bound_grows_with_the_square_root_of_the_depth_and_refuses_a_bad_depth():
    one, hundred = rounding_tolerance(1), rounding_tolerance(100)
    assert hundred / one == pytest.approx(10.0, rel=1e-3)
    assert rounding_tolerance(100, torch.float64) < 1e-13 < rounding_tolerance(100) < 1e-5
    for depth in (0, -3, 2.5, True, "10"):
        with pytest.raises(ValueError, match=r"rounding_tolerance: depth: expected an integer >= 1"):
            rounding_tolerance(depth)


def test_tf32_is_counted_only_for_matrix_products_on_cuda():
    """CUDA's float32 matrix products may run in TF32 (cuDNN's LSTMs do by default); an
    elementwise recurrence on CUDA, or anything on the CPU, keeps float32's roundoff. No
    CUDA device is needed: the rule reads the device type and torch's flags."""
    assert unit_roundoff(torch.float32, "cpu", matmul=True) == 2.0 ** -24
    assert unit_roundoff(torch.float32, "cuda", matmul=False) == 2.0 ** -24
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        assert unit_roundoff(torch.float32, "cuda", matmul=True) == 2.0 ** -11
        assert unit_roundoff(torch.float64, "cuda", matmul=True) == 2.0 ** -53
    finally:
        torch.backends.cudnn.allow_tf32 = previous


def _chain(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """A depth-n chain in x's dtype: a running sum, one rounding per term, in `order`."""
    total = torch.zeros((), dtype=x.dtype)
    for index in order:
        total = total + x[index]
    return total


@pytest.mark.parametrize("depth", [10, 100, 1000])
def test_two_orders_of_one_float32_chain_stay_within_the_bound(depth):
    """Data the bound was not told: heavy-tailed terms (Student t, 3 df) of mixed sign,
    summed in two random orders in float32 and compared relative to the float64 scale."""
    generator = torch.Generator().manual_seed(depth)
    worst = 0.0
    for trial in range(20):
        x64 = torch.distributions.StudentT(3.0).sample((depth,)).double()
        orders = [torch.randperm(depth, generator=generator) for _ in range(2)]
        a, b = (_chain(x64.float(), order).reshape(1) for order in orders)
        # the scale the chain's roundings are relative to: the terms' own sizes
        scale = _chain(x64.abs(), orders[0]).reshape(1)
        worst = max(worst, (a.double() - b.double()).abs().item() / max(1.0, scale.item()))
    assert worst <= rounding_tolerance(depth)


def test_a_wrong_value_is_far_beyond_the_bound():
    reference = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    wrong = reference.clone()
    wrong[17] += 0.1  # one entry of one step off: what a bug looks like
    assert max_relative_error(wrong.float(), reference) > 10 * rounding_tolerance(10_000)
    assert max_relative_error(reference.float(), reference) <= rounding_tolerance(1)


def test_max_relative_error_is_relative_to_the_references_scale_at_least_one():
    assert max_relative_error(torch.tensor([101.0]), torch.tensor([100.0])) == pytest.approx(0.01)
    assert max_relative_error(torch.tensor([0.002]), torch.tensor([0.001])) == pytest.approx(0.001)


def _finding(tolerance) -> Finding:
    return Finding(id="T-tol", title="t", claim="c", variants=("a",), baseline="a",
                   cases=[Case.of(n=8)], build=lambda case, device, seed: None,
                   make_call=lambda variant, inputs: lambda: None,
                   check=max_relative_error, tolerance=tolerance)


def test_a_tolerance_may_read_the_case_alone_or_the_case_and_the_device():
    case, cpu = Case.of(n=8), torch.device("cpu")
    assert _finding(lambda case: 1e-3).tolerance(case, cpu) == 1e-3
    assert _finding(lambda case, device: 2e-3).tolerance(case, cpu) == 2e-3
    assert _finding(5e-4).tolerance(case, cpu) == 5e-4
    derived = _finding(lambda case, device: rounding_tolerance(case["n"], device=device))
    assert derived.tolerance(case, cpu) == rounding_tolerance(8)
    assert math.isfinite(derived.tolerance(case, torch.device("cuda")))
