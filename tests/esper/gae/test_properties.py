"""Property: every `compute_gae` input is computed right, or rejected naming the argument.

For every method of `METHODS` that runs on the CPU (`triton` too, under Triton's
interpreter in a second process), hypothesis draws calls: well-formed ones over every
dtype of `FLOAT_DTYPES`, step counts as lists, tuples and int64/int32/uint8 tensors,
ragged counts (0 and full included), terminals and truncations anywhere, NaN in the
padding, inputs that require grad (`NO_GRAD_DRAWN` says where not); and calls with one defect each (`DEFECTS`): counts
past `max_steps` or negative, counts of the wrong length, type or dtype, non-sequences
(a generator, a set, a dict, None, an int, a NumPy array), tensors of the wrong type,
rank, shape or dtype, NaN, infinite and out-of-range `gamma` / `gae_lambda`, an unknown
method or reset. Each call either returns outputs within `tolerance` of the float64
reference, with the inputs' dtype and shape (and a graph when an input requires grad and
the method keeps autograd and some step is valid: with none, outputs are constant 0s
and may carry no graph), or raises `ValueError` whose message names the argument.

Not drawn: mismatched devices (every tensor here is on the CPU; `test_gae.py` checks the
device comparison's message on shapes it can build), and NaN or inf at valid steps, which
`compute_gae` does not read (its docstring says so; `RolloutBuffer.add` rejects them).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper.gae import FLOAT_DTYPES, NON_DIFFERENTIABLE, RESETS, compute_gae
from esper.gae.reference import reference_gae
from tests.gae_inputs import CPU_METHODS, make_case, method_params

REPO = Path(__file__).resolve().parents[3]
#: examples per method: a few seconds each; compiled compiles a graph per dtype and for
#: autograd, and Triton's interpreter runs a kernel in Python
EXAMPLES = {"compiled": 15, "triton": 12, "loop": 60}
#: methods drawn without inputs that require grad: `compiled` (and `auto`, which runs it
#: when an input requires grad) compiles a backward graph per dtype, about 20 s each on
#: a 2-core CPU; `test_gae.py` checks their gradients against the loop's on float64
NO_GRAD_DRAWN = {"compiled", "auto"}

#: float32 tolerance relative to the largest |reference value| (at least 1): each output
#: is a sum along a row of at most 40 terms weighted by products of factors in [0, 1],
#: each rounded once or twice: 40 x 2 x 2**-24 (unit roundoff) < 1e-5.
#: float64: the same argument with 2**-53 gives 1e-14; 1e-10 leaves room.
#: float16 / bfloat16: computed in float32 and rounded once to the dtype: the float32
#: tolerance plus one unit roundoff (2**-11, 2**-8) of each value.
RELATIVE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5}
UNIT_ROUNDOFF = {torch.float64: 0.0, torch.float32: 0.0, torch.float16: 2.0**-11,
                 torch.bfloat16: 2.0**-8}


def tolerance(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise bound on |output - reference| for outputs of `dtype`."""
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    return RELATIVE[dtype] * scale + UNIT_ROUNDOFF[dtype] * want.abs()


# ---------------------------------------------------------------------------- defects

def _set(index, value):
    def mutate(call, draw):
        call["args"][index] = value(call["args"][index]) if callable(value) else value
    return mutate


def _set_counts(make):
    def mutate(call, draw):
        call["args"][5] = make(call, draw)
    return mutate


def _count_past(call, draw):
    counts = list(call["counts"])
    counts[draw(st.integers(0, len(counts) - 1))] = call["max_steps"] + draw(st.integers(1, 3))
    return _as_kind(counts, draw(st.sampled_from(["list", "int64", "int32"])))


def _count_negative(call, draw):
    counts = list(call["counts"])
    counts[draw(st.integers(0, len(counts) - 1))] = -draw(st.integers(1, 3))
    return _as_kind(counts, draw(st.sampled_from(["list", "tuple", "int64", "int32"])))


def _discount(name, value):
    def mutate(call, draw):
        call[name] = value
    return mutate


def _needs_envs(mutate):
    """A defect that needs at least one env (an out-of-range count)."""
    mutate.needs_envs = True
    return mutate


#: name -> (mutation, the argument its error must name)
DEFECTS = {
    "count past max_steps": (_needs_envs(_set_counts(_count_past)), "step_counts"),
    "negative count": (_needs_envs(_set_counts(_count_negative)), "step_counts"),
    "one count too many": (_set_counts(lambda c, d: [*c["counts"], 0]), "step_counts"),
    "count tensor too long": (_set_counts(lambda c, d: torch.zeros(len(c["counts"]) + 1,
                                                                   dtype=torch.long)),
                              "step_counts"),
    "2-D count tensor": (_set_counts(lambda c, d: torch.tensor([c["counts"]])), "step_counts"),
    "float count tensor": (_set_counts(lambda c, d: torch.tensor(c["counts"], dtype=torch.float32)),
                           "step_counts"),
    "bool count tensor": (_set_counts(lambda c, d: torch.ones(len(c["counts"]), dtype=torch.bool)),
                          "step_counts"),
    "bool count": (_needs_envs(_set_counts(lambda c, d: [True, *c["counts"][1:]])), "step_counts"),
    "float count": (_needs_envs(_set_counts(lambda c, d: [0.0, *c["counts"][1:]])), "step_counts"),
    "generator of counts": (_set_counts(lambda c, d: (n for n in c["counts"])), "step_counts"),
    "set of counts": (_set_counts(lambda c, d: set(c["counts"])), "step_counts"),
    "dict of counts": (_set_counts(lambda c, d: dict(enumerate(c["counts"]))), "step_counts"),
    "counts None": (_set_counts(lambda c, d: None), "step_counts"),
    "counts an int": (_set_counts(lambda c, d: c["max_steps"]), "step_counts"),
    "counts a NumPy array": (_set_counts(lambda c, d: torch.tensor(c["counts"], dtype=torch.long)
                                         .numpy()), "step_counts"),
    "rewards a list": (_set(0, lambda t: t.tolist()), "rewards"),
    "rewards 1-D": (_set(0, lambda t: t.reshape(-1)), "rewards"),
    "rewards 3-D": (_set(0, lambda t: t[None]), "rewards"),
    "integer rewards": (_set(0, lambda t: torch.zeros(t.shape, dtype=torch.int32)), "rewards"),
    "float8 rewards": (_set(0, lambda t: torch.zeros(t.shape, dtype=torch.float8_e4m3fn)),
                       "rewards"),
    "values of another dtype": (_set(1, lambda t: t.to(torch.float64 if t.dtype != torch.float64
                                                       else torch.float32)), "values"),
    "values one step short": (_set(1, lambda t: t[:, :-1] if t.shape[1] else t[:, None]),
                              "values"),
    "values None": (_set(1, None), "values"),
    "float dones": (_set(2, lambda t: t.float()), "dones"),
    "dones one env short": (_set(2, lambda t: t[:-1] if t.shape[0] else t[None]), "dones"),
    "int8 truncated": (_set(3, lambda t: t.to(torch.int8)), "truncated"),
    "truncated transposed": (_set(3, lambda t: t.T if t.shape[0] != t.shape[1] else t[None]),
                             "truncated"),
    "bootstrap_values of another dtype": (_set(4, lambda t: t.to(torch.float64 if t.dtype !=
                                                                 torch.float64 else torch.float16)),
                                          "bootstrap_values"),
    "bootstrap_values 1-D": (_set(4, lambda t: t.reshape(-1)), "bootstrap_values"),
    "gamma NaN": (_discount("gamma", float("nan")), "gamma"),
    "gamma above 1": (_discount("gamma", 1.0 + 1e-9), "gamma"),
    "gamma negative": (_discount("gamma", -0.5), "gamma"),
    "gamma a string": (_discount("gamma", "0.99"), "gamma"),
    "gamma a tensor": (_discount("gamma", torch.tensor(0.99)), "gamma"),
    "gae_lambda NaN": (_discount("gae_lambda", float("nan")), "gae_lambda"),
    "gae_lambda infinite": (_discount("gae_lambda", float("inf")), "gae_lambda"),
    "gae_lambda None": (_discount("gae_lambda", None), "gae_lambda"),
    "gae_lambda a bool": (_discount("gae_lambda", True), "gae_lambda"),
    "unknown method": (_discount("method", "fast"), "method"),
    "unknown reset": (_discount("reset", "zero"), "reset"),
}


def _as_kind(counts: list[int], kind: str):
    if kind == "list":
        return list(counts)
    if kind == "tuple":
        return tuple(counts)
    return torch.tensor(counts, dtype=getattr(torch, kind))


@st.composite
def gae_calls(draw, method: str, defect: str | None = None) -> dict:
    """One `compute_gae` call as a dict (args, gamma, gae_lambda, method, reset, and what
    the call should do), with `defect` (a key of DEFECTS) applied, if given."""
    needs_envs = defect is not None and getattr(DEFECTS[defect][0], "needs_envs", False)
    num_envs = draw(st.integers(1 if needs_envs else 0, 5))
    max_steps = draw(st.integers(0, 40))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    counts = draw(st.lists(st.sampled_from([0, max_steps]) | st.integers(0, max_steps),
                           min_size=num_envs, max_size=num_envs))
    case = make_case(num_envs, max_steps, draw(st.integers(0, 2**31 - 1)),
                     p_done=draw(st.sampled_from([0.0, 0.1, 0.5])),
                     p_trunc=draw(st.sampled_from([0.0, 0.1, 0.5])),
                     dtype=dtype, step_counts=counts)
    reset = draw(st.sampled_from(RESETS))
    if reset != "restructured":  # the reviewed lines read truncated only where done is set
        case.dones |= case.truncated
    requires_grad = method not in NO_GRAD_DRAWN and draw(st.booleans())
    floats = [t.clone().requires_grad_(requires_grad)
              for t in (case.rewards, case.values, case.bootstrap_values)]
    kind = draw(st.sampled_from(["list", "tuple", "int64", "int32", "uint8"]))
    call = {
        "args": [floats[0], floats[1], case.dones, case.truncated, floats[2],
                 _as_kind(counts, kind)],
        "gamma": draw(st.sampled_from([0.0, 1.0, 0.99]) | st.floats(0.0, 1.0)),
        "gae_lambda": draw(st.sampled_from([0.0, 1.0, 0.95]) | st.floats(0.0, 1.0)),
        "method": method,
        "reset": reset,
        "counts": counts, "max_steps": max_steps, "dtype": dtype,
        "requires_grad": requires_grad,
    }
    call["defect"] = defect
    if defect is not None:
        DEFECTS[defect][0](call, draw)
    return call


def expected_error(call: dict) -> str | None:
    """The argument the call's ValueError must name, or None if it must compute."""
    if call["defect"] is not None:
        return DEFECTS[call["defect"]][1]
    if call["requires_grad"] and call["method"] in NON_DIFFERENTIABLE:
        return "requires_grad"
    return None


def check_call(call: dict) -> None:
    kwargs = {k: call[k] for k in ("gamma", "gae_lambda", "method", "reset")}
    field = expected_error(call)
    if field is not None:
        with pytest.raises(ValueError, match=field) as err:
            compute_gae(*call["args"], **kwargs)
        assert "expected" in str(err.value) and "got" in str(err.value), err.value
        return
    adv, ret = compute_gae(*call["args"], **kwargs)
    dtype, counts = call["dtype"], call["counts"]
    inputs = list(call["args"][:5]) + [counts]
    want_adv, want_ret = reference_gae(*inputs, gamma=call["gamma"], gae_lambda=call["gae_lambda"])
    for name, got, want in (("advantages", adv, want_adv), ("returns", ret, want_ret)):
        assert got.dtype == dtype and got.shape == want.shape, (name, got.dtype, got.shape)
        error = (got.detach().double() - want).abs()
        assert (error <= tolerance(want, dtype)).all(), (name, error.max().item())
        if call["requires_grad"] and sum(counts):  # NON_DIFFERENTIABLE raised above
            assert got.grad_fn is not None, name


@pytest.mark.parametrize("method", method_params(CPU_METHODS))
def test_well_formed_inputs_are_computed_right(method):
    """Computed within tolerance of the reference; or, for a method that computes outside
    autograd given an input that requires grad, rejected naming `requires_grad`."""
    @settings(max_examples=EXAMPLES.get(method, 100), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(call=gae_calls(method))
    def check(call):
        check_call(call)

    check()


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_is_rejected_naming_the_argument_by_every_method(defect):
    """Every defect for every method: drawn one defect at a time so that each is tried
    (a draw over all of them leaves some out at CI-sized example counts). The call is
    drawn once and given to each method in turn (its `method` replaced, unless the
    defect is the method)."""
    @settings(max_examples=8, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(call=gae_calls(CPU_METHODS[0], defect))
    def check(call):
        for method in CPU_METHODS:
            check_call(call if defect == "unknown method" else {**call, "method": method})

    check()


@pytest.mark.slow
@pytest.mark.integration  # a pytest process under TRITON_INTERPRET=1
@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (the `dev` extra installs it on Linux)")
@pytest.mark.skipif("triton" in CPU_METHODS, reason="this process already runs triton on the CPU")
def test_triton_under_the_interpreter():
    """The property for `triton`, run by Triton's CPU interpreter: TRITON_INTERPRET must
    be set before triton is imported, so in a fresh pytest process."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    test = f"{Path(__file__).relative_to(REPO)}::test_well_formed_inputs_are_computed_right[triton]"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]
