"""The small-call path of `compute_gae`: what a call does besides the kernel, by count.

Counts, not times (`python -m esper_review.gae_tools.floor` times them): the input check of
well-formed tensors dispatches no aten op and reads step counts in place, even through
its cache of count views; the numba method hands tensors to its kernel by address, its
only ops the two output allocations, and still gets strided, lazily negated and
non-int64 inputs right; `auto` looks its choice up in the table once per shape, dtype,
device type and autograd need; the compiled method builds no discounts tensor per call on
the CPU.
"""

from __future__ import annotations

import pytest
import torch

from esper import gae
from esper.gae import METHODS, check_gae_inputs, compute_gae
from esper.gae.reference import reference_gae
from harness.measure.counters import profile_call
from tests.gae_inputs import make_case

GAMMA, LAMBDA = 0.99, 0.95
needs_numba = pytest.mark.skipif("numba" not in METHODS, reason="numba is not installed")


def _args(num_envs: int, max_steps: int, seed: int = 0, dtype=torch.float32) -> list:
    case = make_case(num_envs, max_steps, seed=seed, dtype=dtype, stale_padding=False,
                     step_counts=[max_steps] * num_envs)
    return list(case.args(counts_as_tensor=True))


@pytest.mark.parametrize("num_envs", [1, 4, 64, 65, 256])
def test_the_check_of_well_formed_cpu_tensors_dispatches_no_op(num_envs):
    """Up to 64 envs the counts are read through the cached view, above through
    `host_view` and NumPy: no aten op either way."""
    args = _args(num_envs, 25)
    check_gae_inputs(*args, GAMMA, LAMBDA)  # fills the view cache: its second use counts too
    counters = profile_call(lambda: check_gae_inputs(*args, GAMMA, LAMBDA))
    assert (counters.op_calls, counters.host_syncs) == (0, 0), counters.ops


def test_the_check_returns_shape_and_dtype():
    args = _args(3, 7, dtype=torch.float64)
    assert check_gae_inputs(*args, GAMMA, LAMBDA) == ((3, 7), torch.float64)


def test_a_cached_count_view_reads_the_counts_as_they_are_now():
    """The view is cached per address; a count written after a call that passed, in the
    same tensor or in another tensor at the same address, is still caught."""
    args = _args(4, 10)
    base = torch.full((8,), 10, dtype=torch.int64)
    args[5] = base[:4]
    check_gae_inputs(*args, GAMMA, LAMBDA)
    base[2] = 11
    with pytest.raises(ValueError, match=r"compute_gae: step_counts: expected ints in \[0, 10\]; "
                                         r"got \[11\] in a torch.int64 tensor"):
        check_gae_inputs(*args, GAMMA, LAMBDA)
    base[2] = 10
    args[5] = base[:4].clone()[:4]  # another tensor
    check_gae_inputs(*args, GAMMA, LAMBDA)
    same_address = base[:4]  # a new tensor object at the cached address
    same_address[0] = -1
    args[5] = same_address
    with pytest.raises(ValueError, match=r"got \[-1\] in a torch.int64 tensor"):
        check_gae_inputs(*args, GAMMA, LAMBDA)


@pytest.mark.parametrize("num_envs", [4, 100])
def test_counts_equal_to_the_last_that_passed_still_meet_a_smaller_max_steps(num_envs):
    """Counts byte-equal to the last that passed at their address skip the scan only
    while they are within the new max_steps; a change is scanned (NumPy above 64 envs)."""
    counts = torch.full((num_envs,), 9, dtype=torch.int64)
    long, short = _args(num_envs, 10), _args(num_envs, 8)
    long[5] = short[5] = counts
    check_gae_inputs(*long, GAMMA, LAMBDA)
    check_gae_inputs(*long, GAMMA, LAMBDA)  # the same bytes again
    with pytest.raises(ValueError, match=r"expected ints in \[0, 8\]; got \[9, 9, 9, 9"):
        check_gae_inputs(*short, GAMMA, LAMBDA)
    counts[-1] = 3
    check_gae_inputs(*long, GAMMA, LAMBDA)
    counts[-1] = 11
    with pytest.raises(ValueError, match=r"expected ints in \[0, 10\]; got \[11\]"):
        check_gae_inputs(*long, GAMMA, LAMBDA)


@pytest.mark.parametrize("counts, bad", [
    (torch.tensor([3, 0, 11, 0, 3, 0, 3, 0])[::2], "[11]"),  # strided: not read in place
    (torch._neg_view(torch.tensor([-3, -3, -11, -3])), "[11]"),  # lazily negated
    (torch.tensor([3, 3, 11, 3], dtype=torch.int32), "[11]"),
])
def test_counts_the_fast_path_cannot_read_in_place_are_still_checked(counts, bad):
    args = _args(4, 10)
    args[5] = counts
    with pytest.raises(ValueError, match=r"step_counts: expected ints in \[0, 10\]; got "
                                         + bad.replace("[", r"\[").replace("]", r"\]")):
        check_gae_inputs(*args, GAMMA, LAMBDA)


@needs_numba
def test_the_numba_call_dispatches_only_its_output_allocations():
    """No `.numpy()` views (four aten ops each), no detach, no flag reinterpretation:
    the kernel gets addresses."""
    args = _args(4, 25)
    compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="numba")
    counters = profile_call(lambda: compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA,
                                                method="numba"))
    assert set(counters.ops) == {"aten::empty_like", "aten::empty_strided"}, counters.ops
    assert counters.ops["aten::empty_like"] == 2
    assert counters.allocations == 2


def _transposed(tensor: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor (a transposed copy, transposed back)."""
    return tensor.t().contiguous().t()


@needs_numba
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["strided", "negated", "int32 counts", "list counts"])
def test_numba_reads_every_input_layout_right(dtype, layout):
    """Inputs the kernel cannot read in place are copied first; the results equal the
    float64 reference either way."""
    case = make_case(6, 9, seed=3, dtype=dtype)
    args = list(case.args(counts_as_tensor=True))
    if layout == "strided":
        args[:5] = [_transposed(t) for t in args[:5]]
        assert not args[0].is_contiguous()
    elif layout == "negated":
        args[1] = torch._neg_view(-args[1])
        assert args[1].is_neg()
    elif layout == "int32 counts":
        args[5] = args[5].to(torch.int32)
    else:
        args[5] = case.step_counts
    adv, ret = compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="numba")
    ref_adv, ref_ret = reference_gae(*case.args(), gamma=GAMMA, gae_lambda=LAMBDA)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(adv.double(), ref_adv, rtol=0, atol=tolerance * 10)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=0, atol=tolerance * 10)


@needs_numba
def test_numba_refuses_counts_on_another_device_by_name():
    """A direct call (compute_gae checks devices first): a CUDA-typed fake tensor stands
    in for CUDA, which this machine may lack (a meta tensor gets every method's meta
    error instead, tests/esper/gae/test_gae.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from esper.gae.numba_kernel import gae_numba

    args = _args(2, 3)
    with FakeTensorMode():
        args[5] = torch.zeros(2, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="gae_numba: step_counts.device: expected cpu; got cuda"):
        gae_numba(*args, gamma=GAMMA, gae_lambda=LAMBDA)


@needs_numba
def test_a_lazy_method_takes_its_own_place_in_methods_on_first_call():
    from esper.gae.numba_kernel import gae_numba

    compute_gae(*_args(2, 3), gamma=GAMMA, gae_lambda=LAMBDA, method="numba")
    assert METHODS["numba"] is gae_numba


def test_auto_looks_its_choice_up_once_per_shape_dtype_device_type_and_autograd_need():
    from esper.gae.methods import cached_choice, choose

    cached_choice.cache_clear()
    args = _args(4, 25)
    for _ in range(3):
        compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="auto")
    assert (cached_choice.cache_info().misses, cached_choice.cache_info().hits) == (1, 2)
    compute_gae(*_args(4, 26), gamma=GAMMA, gae_lambda=LAMBDA, method="auto")
    compute_gae(*_args(4, 25, dtype=torch.float64), gamma=GAMMA, gae_lambda=LAMBDA, method="auto")
    assert cached_choice.cache_info().misses == 3
    # a shape whose differentiable pick is eager (scan): no compile in a unit test
    args = _args(300, 30)
    compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="auto")
    args[1] = args[1].clone().requires_grad_()
    adv, _ = compute_gae(*args, gamma=GAMMA, gae_lambda=LAMBDA, method="auto")
    assert cached_choice.cache_info().misses == 5
    assert adv.grad_fn is not None  # a method that keeps the graph was chosen
    assert cached_choice((300, 30), torch.float32, "cpu", True) == choose(
        "cpu", 300, 30, differentiable=True)


@pytest.mark.skipif("compiled" not in METHODS, reason="no C++ compiler for torch.compile")
def test_the_compiled_call_reuses_its_cpu_discounts():
    """One discounts tensor per (gamma, lambda, dtype) on the CPU; the values it holds
    are the ones asked for."""
    from esper.gae.compiled import _discounts

    like = torch.zeros(1, dtype=torch.float32)
    first = _discounts(0.9, 0.5, like)
    assert _discounts(0.9, 0.5, like) is first
    assert first.tolist() == [0.8999999761581421, 0.5]
    other = _discounts(0.9, 0.25, like)
    assert other is not first and other.tolist()[1] == 0.25
    assert _discounts(0.9, 0.5, like.double()).dtype == torch.float64


def test_step_counts_already_int64_on_the_device_are_used_as_they_are():
    counts = torch.tensor([1, 2])
    assert gae.step_counts_tensor(counts, counts.device) is counts
    assert gae.step_counts_tensor(counts.to(torch.int32), counts.device).dtype == torch.int64
