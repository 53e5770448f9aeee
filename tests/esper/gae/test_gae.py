"""Every GAE method x reset equals the float64 pure-Python reference."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper.gae import METHODS, NON_DIFFERENTIABLE, check_gae_inputs, compute_gae
from esper.gae import RESETS as GAE_RESETS
from esper.gae.inputs import device_count_check
from esper.gae.methods import TABLE, _load
from esper.gae.reference import reference_gae
from harness.measure.counters import profile_call
from tests.gae_inputs import COMPILED, CPU_METHODS, CUDA_METHODS, make_case, method_params

#: the methods these tests call on CPU tensors (on a CUDA machine `triton` is tested on
#: CUDA tensors, at the end of this file)
FAST_METHODS = [m for m in CPU_METHODS if m != "loop"]
#: the fast methods but the compiled one, whose property test is its own (`slow`)
UNCOMPILED_FAST = [m for m in FAST_METHODS if m != COMPILED]
RESETS = list(GAE_RESETS)
#: the resets that run the reviewed lines, which read `truncated` only where `dones` is set
REVIEWED_LINES = ["clone", "mask", "assign"]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def assert_matches_reference(case, method, reset, gamma, lam, dtype, counts_as_tensor=False):
    adv, ret = compute_gae(
        *case.args(counts_as_tensor), gamma=gamma, gae_lambda=lam, method=method, reset=reset
    )
    ref_adv, ref_ret = reference_gae(*case.args(), gamma=gamma, gae_lambda=lam)
    assert adv.dtype == dtype and ret.dtype == dtype
    assert adv.shape == case.rewards.shape
    for got, want in ((adv, ref_adv), (ret, ref_ret)):
        scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
        err = (got.double() - want).abs().max().item() if want.numel() else 0.0
        assert err <= TOLERANCE[dtype] * scale, f"{method}/{reset}: max error {err} (scale {scale})"


@pytest.mark.parametrize("method", method_params(CPU_METHODS))
def test_hand_checked_vector(method):
    """ESPER_NOTES.md: gamma .9, lambda .5 -> A [1.0625, 0.75, 11.8575, 4.85]."""
    args = (
        torch.tensor([[1.0, 1.0, 10.0, 2.0]], dtype=torch.float64),
        torch.tensor([[0.5, 0.25, 1.0, 0.75]], dtype=torch.float64),
        torch.tensor([[False, True, False, True]]),
        torch.tensor([[False, False, False, True]]),
        torch.tensor([[0.0, 0.0, 0.0, 4.0]], dtype=torch.float64),
        [4],
    )
    expected = torch.tensor([[1.0625, 0.75, 11.8575, 4.85]], dtype=torch.float64)
    ref_adv, _ = reference_gae(*args, gamma=0.9, gae_lambda=0.5)
    torch.testing.assert_close(ref_adv, expected, rtol=0, atol=1e-12)
    for reset in RESETS:
        adv, ret = compute_gae(*args, gamma=0.9, gae_lambda=0.5, method=method, reset=reset)
        torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(ret, expected + args[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", method_params(CPU_METHODS))
def test_interior_truncation_cuts_the_trace(method):
    """Truncated at t=1 mid-row: A_1 bootstraps from b_1 and A_0 does not see A_2."""
    rewards = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    values = torch.tensor([[0.0, 0.0, 100.0]], dtype=torch.float64)
    dones = torch.tensor([[False, True, False]])
    truncated = torch.tensor([[False, True, False]])
    boot = torch.tensor([[0.0, 5.0, 7.0]], dtype=torch.float64)
    adv, _ = compute_gae(rewards, values, dones, truncated, boot, [3],
                         gamma=1.0, gae_lambda=1.0, method=method)
    # A_1 = 2 + 5 - 0 = 7; A_0 = 1 + V_1 - V_0 + A_1 = 8; A_2 = 3 + 7 - 100 = -90
    torch.testing.assert_close(adv, torch.tensor([[8.0, 7.0, -90.0]], dtype=torch.float64))


gammas = st.sampled_from([0.0, 1.0, 0.9, 0.995]) | st.floats(0.0, 1.0)
lambdas = st.sampled_from([0.0, 1.0, 0.5, 0.98]) | st.floats(0.0, 1.0)


@st.composite
def cases(draw, max_envs, max_steps):
    num_envs = draw(st.integers(1, max_envs))
    steps = draw(st.integers(1, max_steps))
    counts = draw(
        st.lists(st.sampled_from([0, steps]) | st.integers(0, steps),
                 min_size=num_envs, max_size=num_envs)
    )
    p_done = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    p_trunc = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    case = make_case(num_envs, steps, seed, p_done=p_done, p_trunc=p_trunc,
                     dtype=dtype, step_counts=counts)
    return case, dtype


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=cases(max_envs=64, max_steps=300), gamma=gammas, lam=lambdas,
       method=st.sampled_from(UNCOMPILED_FAST), counts_as_tensor=st.booleans())
def test_fast_methods_equal_reference(data, gamma, lam, method, counts_as_tensor):
    case, dtype = data
    assert_matches_reference(case, method, "mask", gamma, lam, dtype, counts_as_tensor)


@pytest.mark.slow
@pytest.mark.skipif(COMPILED not in METHODS, reason="no C++ compiler for torch.compile")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=cases(max_envs=64, max_steps=300), gamma=gammas, lam=lambdas,
       counts_as_tensor=st.booleans())
def test_compiled_equals_reference(data, gamma, lam, counts_as_tensor):
    """`test_fast_methods_equal_reference` for the compiled method (30 of its share of
    examples): it compiles its graph once per dtype, then every shape reuses it."""
    case, dtype = data
    assert_matches_reference(case, COMPILED, "mask", gamma, lam, dtype, counts_as_tensor)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=cases(max_envs=6, max_steps=40), gamma=gammas, lam=lambdas,
       reset=st.sampled_from(RESETS), counts_as_tensor=st.booleans())
def test_loop_equals_reference(data, gamma, lam, reset, counts_as_tensor):
    """Every reset on inputs whose truncations come with done set (as the reviewed trainer
    stores a time limit); `restructured` on any input."""
    case, dtype = data
    if reset in REVIEWED_LINES:
        case.dones |= case.truncated
    assert_matches_reference(case, "loop", reset, gamma, lam, dtype, counts_as_tensor)


@pytest.mark.parametrize("method", method_params(FAST_METHODS))
@pytest.mark.parametrize("trace", [0.999, 0.5])
def test_float32_long_rows(method, trace):
    """T=4096 in float32: finite and within tolerance of the float64 reference."""
    gamma = 0.999 if trace == 0.999 else 0.99
    lam = trace / gamma
    case = make_case(8, 4096, seed=3, p_done=0.001, p_trunc=0.0005, dtype=torch.float32,
                     step_counts=[4096, 4096, 4000, 1, 0, 2048, 4095, 4096])
    adv, ret = compute_gae(*case.args(), gamma=gamma, gae_lambda=lam, method=method)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert_matches_reference(case, method, "mask", gamma, lam, torch.float32)


@pytest.mark.parametrize("method", method_params(CPU_METHODS))
def test_outputs_zero_past_step_counts_and_dtype_kept(method):
    case = make_case(5, 30, seed=1, dtype=torch.float32, step_counts=[0, 30, 7, 1, 29])
    adv, ret = compute_gae(*case.args(), gamma=0.99, gae_lambda=0.95, method=method)
    pad = torch.arange(30)[None, :] >= torch.tensor(case.step_counts)[:, None]
    assert (adv[pad] == 0).all() and (ret[pad] == 0).all()
    assert adv.dtype == torch.float32 and adv.device == case.rewards.device


def _syncs(method, reset="mask"):
    """The counters of one call after a first one: a first call of `compiled` compiles,
    and compiling reads values (4 host reads seen on a GPU machine's CPU, where no other
    test of the worker had compiled first)."""
    case = make_case(4, 25, seed=2, p_done=0.2, stale_padding=False, step_counts=[25] * 4)

    def call():
        return compute_gae(*case.args(counts_as_tensor=True), gamma=0.99, gae_lambda=0.95,
                           method=method, reset=reset)

    call()
    return profile_call(call)


@pytest.mark.parametrize("method", method_params(FAST_METHODS))
def test_fast_methods_never_sync_the_host(method):
    assert _syncs(method).host_syncs == 0


def test_loop_syncs_the_host():
    assert _syncs("loop").host_syncs > 0


def test_clone_reset_allocates_more_than_assign_and_restructured():
    """On an input with many true terminals (p=0.3) the clone resets outnumber the
    restructured loop's one-off precompute of the not-done multiplier; `assign` makes
    the clone's every other allocation (B4-DRL-03's allocation alone), and option 3
    (`mask`) more than the clone: one tensor more per step for `1 - done_mask[t]`."""
    case = make_case(4, 25, seed=5, p_done=0.3, p_trunc=0.0, stale_padding=False,
                     step_counts=[25] * 4)
    terminals = int((case.dones & ~case.truncated).sum())
    counts = {
        reset: profile_call(lambda r=reset: compute_gae(
            *case.args(), gamma=0.99, gae_lambda=0.95, method="loop", reset=r)).allocations
        for reset in RESETS
    }
    assert terminals > 10
    assert counts["clone"] - counts["assign"] == 4 + terminals, counts  # per env and terminal
    assert counts["clone"] > counts["restructured"], counts
    assert counts["mask"] > counts["clone"], counts


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda a: a.__setitem__(0, a[0][0]), "rewards"),
        (lambda a: a.__setitem__(1, a[1][:, :-1]), "values.shape"),
        (lambda a: a.__setitem__(2, a[2].float()), "dones.dtype"),
        (lambda a: a.__setitem__(3, a[3][:1]), "truncated.shape"),
        (lambda a: a.__setitem__(4, a[4].float()), "bootstrap_values.dtype"),
        (lambda a: a.__setitem__(5, [3, 3]), "len(step_counts)"),
        (lambda a: a.__setitem__(5, [3, 3, 99]), "step_counts"),
        (lambda a: a.__setitem__(5, torch.zeros(3, 1, dtype=torch.long)), "step_counts.shape"),
        (lambda a: a.__setitem__(5, torch.zeros(3)), "step_counts.dtype"),
    ],
)
def test_bad_input_names_the_field(mutate, field):
    case = make_case(3, 10, seed=0)
    args = list(case.args())
    mutate(args)
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        compute_gae(*args, gamma=0.9, gae_lambda=0.9)


def test_unknown_method_and_bad_hyperparameters():
    case = make_case(2, 5, seed=0)
    with pytest.raises(ValueError, match="method.*loop"):
        compute_gae(*case.args(), gamma=0.9, gae_lambda=0.9, method="fast")
    with pytest.raises(ValueError, match="gamma"):
        compute_gae(*case.args(), gamma=1.5, gae_lambda=0.9)
    with pytest.raises(ValueError, match="reset"):
        compute_gae(*case.args(), gamma=0.9, gae_lambda=0.9, reset="zero")


def test_reset_is_the_loop_methods_parameter_only():
    """Only `loop` has a terminal reset to choose; every other method takes no `reset`
    (it had one that did nothing), and `compute_gae` passes it to `loop` alone."""
    for method in TABLE:
        if method.name in METHODS:
            function = method.function if callable(method.function) else _load(method.function)
            takes_reset = "reset" in inspect.signature(function).parameters
            assert takes_reset == (method.name == "loop"), method.name


@pytest.mark.parametrize("method", method_params(FAST_METHODS))
def test_a_clone_reset_with_another_method_is_no_error_and_changes_nothing(method):
    """The Variants axes `reset` and `gae` are independent: `reset=clone` with a method
    other than the loop computes what every other reset does."""
    case = make_case(3, 12, seed=4, p_done=0.3, p_trunc=0.1)
    first, *others = (compute_gae(*case.args(), gamma=0.9, gae_lambda=0.8, method=method,
                                  reset=reset) for reset in RESETS)
    for other in others:
        for a, b in zip(first, other):
            assert torch.equal(a, b)


@pytest.mark.integration  # launches a Python process
@pytest.mark.skipif("numba" not in METHODS, reason="numba is not installed")
def test_numba_parallel_kernel_keeps_torchs_thread_count():
    """The first parallel call launches numba's OpenMP pool, which set the caller's OpenMP
    thread count, and so torch's, to numba's (1 -> all cores). A fresh process: the pool
    launches once per process."""
    code = ("import torch; torch.get_num_threads(); torch.set_num_threads(1); "
            "from esper.gae.numba_kernel import warm_up; warm_up(); print(torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"


# ------------------------------------------------- bad inputs, edge cases, dtypes, autograd

def _with_counts(case, counts):
    return (*case.args()[:5], counts)


@pytest.mark.parametrize("method", CPU_METHODS)
@pytest.mark.parametrize("counts", [[9, 4], [-1, 4], [5, 4]], ids=["past", "negative", "one-past"])
@pytest.mark.parametrize("kind", ["list", "int64", "int32"])
def test_out_of_range_step_counts_are_rejected(method, counts, kind):
    """Counts past max_steps made scan/batched/compiled return wrong numbers and negative
    counts all zeros; tensor counts are now range-checked like lists (on the CPU)."""
    case = make_case(2, 4, seed=0, step_counts=[4, 4])
    as_arg = counts if kind == "list" else torch.tensor(counts, dtype=getattr(torch, kind))
    with pytest.raises(ValueError, match=r"step_counts.*\[0, 4\]") as err:
        compute_gae(*_with_counts(case, as_arg), gamma=0.9, gae_lambda=0.9, method=method)
    assert str(counts[0]) in str(err.value)


@pytest.mark.parametrize("counts, got", [
    ((c for c in [4, 4]), "generator"),
    ({4}, "set"),
    ({0: 4, 1: 4}, "dict"),
    (None, "NoneType"),
    (4, "int"),
    ("44", "str"),
    (torch.tensor([4, 4]).numpy(), "ndarray"),
])
def test_non_sequence_step_counts_are_rejected(counts, got):
    """A generator used to be consumed by the length check and then read as empty."""
    case = make_case(2, 4, seed=0, step_counts=[4, 4])
    with pytest.raises(ValueError, match="step_counts") as err:
        compute_gae(*_with_counts(case, counts), gamma=0.9, gae_lambda=0.9, method="scan")
    assert got in str(err.value)


@pytest.mark.parametrize("counts", [[True, 4], [4.0, 4], [4, "4"]])
def test_step_counts_that_are_not_ints_are_rejected(counts):
    case = make_case(2, 4, seed=0, step_counts=[4, 4])
    with pytest.raises(ValueError, match="step_counts"):
        compute_gae(*_with_counts(case, counts), gamma=0.9, gae_lambda=0.9, method="scan")


def test_tuple_range_and_numpy_int_step_counts_are_accepted():
    case = make_case(3, 4, seed=0, step_counts=[0, 1, 2])
    want, _ = reference_gae(*case.args(), gamma=0.9, gae_lambda=0.9)
    for counts in ((0, 1, 2), range(3), list(torch.arange(3).numpy())):
        adv, _ = compute_gae(*_with_counts(case, counts), gamma=0.9, gae_lambda=0.9)
        torch.testing.assert_close(adv, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["gamma", "gae_lambda"])
@pytest.mark.parametrize("value", [float("nan"), -0.1, 1.5, float("inf"), "0.9", None, True,
                                   torch.tensor(0.9)])
def test_bad_discounts_are_rejected(name, value):
    case = make_case(2, 4, seed=0)
    kwargs = {"gamma": 0.9, "gae_lambda": 0.9, name: value}
    with pytest.raises(ValueError, match=name):
        compute_gae(*case.args(), **kwargs)


@pytest.mark.parametrize("mutate, field", [
    (lambda a: a.__setitem__(0, a[0].tolist()), "rewards"),
    (lambda a: a.__setitem__(0, a[0].long()), "rewards.dtype"),
    (lambda a: a.__setitem__(1, a[1].tolist()), "values"),
    (lambda a: a.__setitem__(2, None), "dones"),
    (lambda a: a.__setitem__(5, torch.tensor([True, False, True])), "step_counts.dtype"),
])
def test_non_tensors_and_integer_rewards_are_rejected(mutate, field):
    args = list(make_case(3, 10, seed=0).args())
    mutate(args)
    with pytest.raises(ValueError, match=re.escape(field)):
        compute_gae(*args, gamma=0.9, gae_lambda=0.9)


@pytest.mark.parametrize("method", CPU_METHODS)
@pytest.mark.parametrize("num_envs, max_steps", [(3, 0), (0, 5), (0, 0)])
def test_empty_inputs_give_empty_outputs(method, num_envs, max_steps):
    """`batched` with 0 steps raised IndexError where the others returned an empty result."""
    case = make_case(num_envs, max_steps, seed=0, dtype=torch.float32,
                     step_counts=[0] * num_envs)
    for counts_as_tensor in (False, True):
        adv, ret = compute_gae(*case.args(counts_as_tensor), gamma=0.9, gae_lambda=0.9,
                               method=method)
        assert adv.shape == ret.shape == (num_envs, max_steps)
        assert adv.dtype == ret.dtype == torch.float32


#: largest relative rounding error of a result cast to the dtype (unit roundoff)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


@pytest.mark.parametrize("method", method_params(CPU_METHODS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(method, dtype):
    """numba/auto said only "NotImplementedError: float16". Every method now computes
    float16/bfloat16 inputs in float32 and rounds the result once: each output is within
    one rounding (unit roundoff x |value|) plus float32's tolerance of the float64
    reference on the same (half-precision) inputs."""
    case = make_case(5, 30, seed=4, dtype=dtype, step_counts=[30, 0, 17, 1, 29])
    adv, ret = compute_gae(*case.args(), gamma=0.99, gae_lambda=0.95, method=method)
    want_adv, want_ret = reference_gae(*case.args(), gamma=0.99, gae_lambda=0.95)
    assert adv.dtype == ret.dtype == dtype
    for got, want in ((adv, want_adv), (ret, want_ret)):
        bound = UNIT_ROUNDOFF[dtype] * want.abs() + TOLERANCE[torch.float32] * max(1.0, want.abs().max())
        assert ((got.double() - want).abs() <= bound).all(), (got.double() - want).abs().max()


def test_unsupported_float_dtypes_are_rejected_listing_the_working_ones():
    case = make_case(2, 4, seed=0)
    args = [t.to(torch.float8_e5m2) if t.is_floating_point() else t for t in case.args()[:5]]
    with pytest.raises(ValueError, match="rewards.dtype.*float32.*float64.*float16.*bfloat16"):
        compute_gae(*args, case.step_counts, gamma=0.9, gae_lambda=0.9)


DIFFERENTIABLE = [m for m in CPU_METHODS if m not in NON_DIFFERENTIABLE]


def _grads(method, dtype=torch.float64):
    """Gradients of sum(w * A) + sum(w * R) with respect to rewards, values, bootstrap."""
    case = make_case(3, 12, seed=6, dtype=dtype, step_counts=[12, 7, 0], stale_padding=False)
    leaves = [t.clone().requires_grad_() for t in (case.rewards, case.values, case.bootstrap_values)]
    adv, ret = compute_gae(leaves[0], leaves[1], case.dones, case.truncated, leaves[2],
                           case.step_counts, gamma=0.95, gae_lambda=0.9, method=method)
    weights = torch.linspace(-1, 1, adv.numel(), dtype=dtype).reshape(adv.shape)
    ((adv * weights).sum() + (ret * weights).sum()).backward()
    return [leaf.grad for leaf in leaves]


#: `auto`, given inputs that require grad at 3 x 12, runs the compiled method (its backward
#: compiles too): both are `slow`
DIFFERENTIABLE_PARAMS = [pytest.param(m, marks=pytest.mark.slow) if m in (COMPILED, "auto") else m
                         for m in DIFFERENTIABLE]


@pytest.mark.parametrize("method", DIFFERENTIABLE_PARAMS)
def test_differentiable_methods_give_the_gradients_of_the_loop(method):
    """Every method but numba and triton keeps autograd; `auto` picks among those when an
    input requires grad, so its gradients are those of the others."""
    for got, want in zip(_grads(method), _grads("loop")):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("method", sorted(NON_DIFFERENTIABLE & set(CPU_METHODS)))
def test_non_differentiable_methods_refuse_inputs_that_require_grad(method):
    """numba computes outside autograd: it used to drop the gradient silently."""
    case = make_case(2, 5, seed=0)
    values = case.values.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"values.requires_grad.*no_grad"):
        compute_gae(case.rewards, values, *case.args()[2:], gamma=0.9, gae_lambda=0.9,
                    method=method)
    with torch.no_grad():  # no graph is asked for: it runs
        adv, _ = compute_gae(case.rewards, values, *case.args()[2:], gamma=0.9,
                             gae_lambda=0.9, method=method)
    assert adv.grad_fn is None


def test_tensor_step_counts_on_the_cpu_are_checked_without_an_op_or_sync():
    """The range check of a CPU count tensor reads its memory directly: the profiler
    sees no aten op at all in the whole input check."""
    args = make_case(16, 25, seed=2, step_counts=[25] * 16).args(counts_as_tensor=True)
    counters = profile_call(lambda: check_gae_inputs(*args, 0.99, 0.95))
    assert (counters.op_calls, counters.host_syncs) == (0, 0), counters.ops


def test_device_side_count_check_fires_on_bad_counts_only():
    """Stand-in for CUDA, which this machine lacks: `device_count_check` builds the
    condition that CUDA tensors get checked with (`torch._assert_async`); on CPU tensors
    `_assert_async` raises at once. It cannot prove that CUDA does not sync the host (the
    CUDA test below does, where there is a GPU)."""
    device_count_check(torch.tensor([0, 3, 4]), 4)
    for bad in ([5, 0], [-1, 2]):
        with pytest.raises(RuntimeError, match=r"step_counts.*\[0, 4\]"):
            device_count_check(torch.tensor(bad), 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_count_check_adds_no_host_sync():
    case = make_case(4, 25, seed=2, stale_padding=False, step_counts=[25] * 4)
    args = [t.cuda() for t in case.args(counts_as_tensor=True)]
    counters = profile_call(lambda: check_gae_inputs(*args, 0.99, 0.95))
    assert counters.host_syncs == 0, counters.ops


META = r"\.device: expected a device that holds values \(cpu or cuda\); got meta"


def _on(device: str, case):
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in case.args()]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("counts", ["list", "cpu tensor", "meta tensor"])
def test_meta_inputs_get_one_error_from_compute_gae_and_from_every_method(method, counts):
    """Meta tensors have shapes but no values. They used to get a different answer from
    each method: `loop` a RuntimeError from `.item()`, `batched`/`scan`/`auto` meta
    outputs with no error, `compiled` an inductor failure, `numba` a device error."""
    args = _on("meta", make_case(3, 5, seed=0))
    args[5] = {"list": [5, 2, 0], "cpu tensor": torch.tensor([5, 2, 0]),
               "meta tensor": torch.tensor([5, 2, 0], device="meta")}[counts]
    with pytest.raises(ValueError, match=r"^compute_gae: rewards" + META):
        compute_gae(*args, gamma=0.9, gae_lambda=0.9, method=method)
    with pytest.raises(ValueError, match=r": rewards" + META):
        METHODS[method](*args, gamma=0.9, gae_lambda=0.9)


@pytest.mark.parametrize("method", list(METHODS))
def test_meta_step_counts_with_real_inputs_get_the_same_error(method):
    args = list(make_case(3, 5, seed=0).args())
    args[5] = torch.tensor([5, 2, 0], device="meta")
    with pytest.raises(ValueError, match=r"^compute_gae: step_counts" + META):
        compute_gae(*args, gamma=0.9, gae_lambda=0.9, method=method)
    with pytest.raises(ValueError, match=r": step_counts" + META):
        METHODS[method](*args, gamma=0.9, gae_lambda=0.9)


@pytest.mark.parametrize("index, name", [(1, "values"), (2, "dones"), (4, "bootstrap_values")])
def test_one_meta_input_among_real_ones_is_named_by_compute_gae(index, name):
    args = list(make_case(3, 5, seed=0).args())
    args[index] = args[index].to("meta")
    with pytest.raises(ValueError, match=rf"^compute_gae: {name}" + META):
        compute_gae(*args, gamma=0.9, gae_lambda=0.9)


# ------------------------------------------------------------------- on CUDA tensors

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", CUDA_METHODS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("counts_as_tensor", [False, True])
def test_cuda_methods_equal_the_reference_on_cuda_tensors(method, dtype, counts_as_tensor):
    """Every method that takes CUDA tensors (`triton` among them) against the float64
    reference computed on the CPU, on stale padding and mixed terminals: float64/float32
    within `TOLERANCE` x scale, 16-bit inputs within one rounding of the result on top of
    float32's tolerance (they are computed in float32)."""
    case = make_case(7, 40, seed=11, dtype=dtype, p_done=0.2, p_trunc=0.1,
                     step_counts=[40, 0, 17, 1, 39, 40, 25])
    args = [t.cuda() if isinstance(t, torch.Tensor) else t for t in case.args(counts_as_tensor)]
    adv, ret = compute_gae(*args, gamma=0.99, gae_lambda=0.95, method=method)
    want_adv, want_ret = reference_gae(*case.args(), gamma=0.99, gae_lambda=0.95)
    assert adv.device.type == ret.device.type == "cuda" and adv.dtype == ret.dtype == dtype
    rounding = UNIT_ROUNDOFF.get(dtype, 0.0)
    tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    for got, want in ((adv.cpu(), want_adv), (ret.cpu(), want_ret)):
        bound = rounding * want.abs() + tolerance * max(1.0, want.abs().max().item())
        assert ((got.double() - want).abs() <= bound).all(), (got.double() - want).abs().max()
