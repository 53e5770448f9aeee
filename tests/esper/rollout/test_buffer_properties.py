"""Property: every `RolloutBuffer.add` stores exactly the given step, or raises
`ValueError` naming the argument and changes nothing.

Hypothesis draws a small buffer (list or tensor step counts) and a sequence of adds into
random envs (so rows fill up and overflow), each with arguments in every accepted form
(Python and NumPy numbers, 0-d and [1] tensors, float64 tensors, tensors that require
grad, 0/1 flags) and, for some, one defect from `tests.esper.rollout.test_buffer.BAD_INPUTS` (wrong
types, shapes, dtypes, out-of-range or float actions, actions their mask forbids, NaN,
infinite or positive log-probs, non-finite values, rewards and bootstrap values, flags
that are not bools, truncation without a bootstrap value). After each call the whole
buffer (every tensor and the step counts) is compared with what it must hold: the step
written at [env, count] and nothing else, or nothing changed at all.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.variants import AXES, Variants
from tests.esper.rollout.test_buffer import BAD_INPUTS, HIDDEN, LAYERS, STATE_DIM, make_buffer, snapshot

finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)
log_prob_values = st.floats(-50.0, 0.0, width=32)


@st.composite
def numbers(draw, values):
    """A float from `values` in one of the forms `add` accepts for a scalar."""
    x = draw(values)
    form = draw(st.sampled_from(["float", "int", "np.float64", "np.float32", "tensor",
                                 "tensor[1]", "float64 tensor", "requires grad"]))
    return {
        "float": x, "int": int(x), "np.float64": np.float64(x), "np.float32": np.float32(x),
        "tensor": torch.tensor(x), "tensor[1]": torch.tensor([x]),
        "float64 tensor": torch.tensor(x, dtype=torch.float64),
        "requires grad": torch.tensor(x, requires_grad=True),
    }[form]


@st.composite
def flags(draw):
    x = draw(st.booleans())
    return draw(st.sampled_from([x, np.bool_(x), int(x), torch.tensor(x), torch.tensor([x])]))


@st.composite
def action_and_mask(draw, size):
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    action = draw(st.integers(0, size - 1))
    mask[action] = True
    form = draw(st.sampled_from([action, np.int64(action), torch.tensor(action),
                                 torch.tensor([action], dtype=torch.int32)]))
    return form, mask


@st.composite
def add_calls(draw, num_envs):
    """kwargs of one `add`, and the defect applied to them (a key of BAD_INPUTS) or None."""
    heads = {h: draw(action_and_mask(k)) for h, k in HEAD_SIZES.items()}
    truncated = draw(flags())
    kwargs = dict(
        env_id=draw(st.integers(0, num_envs - 1)),
        state=torch.tensor(draw(st.lists(finite, min_size=STATE_DIM, max_size=STATE_DIM))),
        actions={h: a for h, (a, _) in heads.items()},
        log_probs={h: draw(numbers(log_prob_values)) for h in HEAD_NAMES},
        value=draw(numbers(finite)),
        reward=draw(numbers(finite)),
        done=draw(flags()),
        masks={h: m for h, (_, m) in heads.items()},
        hidden_h=torch.randn(LAYERS, 1, HIDDEN),
        hidden_c=torch.randn(LAYERS, 1, HIDDEN),
        truncated=truncated,
        bootstrap_value=draw(numbers(finite) if bool(truncated) else st.none() | numbers(finite)),
    )
    defect = draw(st.none() | st.sampled_from(list(BAD_INPUTS)))
    if defect is not None:
        BAD_INPUTS[defect][0](kwargs)
    return kwargs, defect


def expected_after(before: dict, kwargs: dict, step: int) -> dict:
    """The snapshot `before` with the step of `kwargs` written at [env, step]."""
    want = {name: t.clone() if isinstance(t, torch.Tensor) else list(t) for name, t in before.items()}
    env = kwargs["env_id"]
    cell = (env, step)

    def scalar(x):
        return torch.as_tensor(x, dtype=torch.float64).detach().reshape(()).float()

    want["states"][cell] = kwargs["state"]
    for head in HEAD_NAMES:
        want[f"actions[{head}]"][cell] = int(torch.as_tensor(kwargs["actions"][head]).reshape(()))
        want[f"log_probs[{head}]"][cell] = scalar(kwargs["log_probs"][head])
        want[f"masks[{head}]"][cell] = kwargs["masks"][head]
    want["values"][cell] = scalar(kwargs["value"])
    want["rewards"][cell] = scalar(kwargs["reward"])
    want["dones"][cell] = bool(torch.as_tensor(kwargs["done"]).reshape(()))
    want["truncated"][cell] = bool(torch.as_tensor(kwargs["truncated"]).reshape(()))
    boot = kwargs["bootstrap_value"]
    want["bootstrap_values"][cell] = 0.0 if boot is None else scalar(boot)
    want["hidden_h"][cell] = kwargs["hidden_h"][:, 0]
    want["hidden_c"][cell] = kwargs["hidden_c"][:, 0]
    want["counts"][env] += 1
    if "step_counts" in want:  # the tensor variant's counts are a tensor of the buffer
        want["step_counts"][env] += 1
    return want


def assert_holds(buffer, want: dict) -> None:
    got = snapshot(buffer)
    assert got["counts"] == want["counts"]
    for name, tensor in want.items():
        if name != "counts":
            assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize("counts_kind", AXES["step_counts"])
def test_add_stores_exactly_the_step_or_rejects_it_changing_nothing(counts_kind):
    # 30 sequences of up to 8 calls for each way of keeping the counts: 120 in all
    @settings(max_examples=30, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(shape=st.tuples(st.integers(1, 3), st.integers(1, 3)), data=st.data())
    def check(shape, data):
        num_envs, max_steps = shape
        buffer = make_buffer(num_envs, max_steps, variants=Variants(step_counts=counts_kind))
        for _ in range(data.draw(st.integers(1, 8), label="calls")):
            kwargs, defect = data.draw(add_calls(num_envs), label="add")
            before = snapshot(buffer)
            env = kwargs["env_id"]
            full = isinstance(env, int) and 0 <= env < num_envs and before["counts"][env] == max_steps
            if defect is None and not full:
                buffer.add(**kwargs)
                assert_holds(buffer, expected_after(before, kwargs, before["counts"][env]))
                continue
            # a defect, or a full row: which check fires first may differ, not the outcome
            with pytest.raises(ValueError) as err:
                buffer.add(**kwargs)
            message = str(err.value)
            assert "expected" in message and "got" in message, message
            if defect is not None and not full:
                assert _names(message, BAD_INPUTS[defect][1]), (defect, message)
            elif defect is None:
                assert "env_id" in message and "buffer full" in message, message
            assert_holds(buffer, before)

    check()


def _names(message: str, pattern: str) -> bool:
    return re.search(pattern, message) is not None
