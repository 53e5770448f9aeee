"""`Variants.add_checks`: `RolloutBuffer.add` as the original wrote it (`none`) or with
every argument checked first (`checked`), and what the original really did with a mask
of the wrong length (the rollout-buffer audit's section 5.1).

`original_add_writes` is the original's add, re-typed from esper-lite at 599f3895,
src/esper/simic/agent/rollout_buffer.py:295-345 (`self.x` made arguments, its 8 heads'
per-head arguments folded into dicts keyed by head name, nothing else changed). The
audit read the same writes at 181a4c41, src/esper/simic/tamiyo_buffer.py:222-254 (4 heads).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.rollout.buffer import RolloutBuffer
from esper.variants import AXES, Variants
from harness.measure.counters import profile_call
from tests.esper.rollout.test_buffer import HIDDEN, LAYERS, STATE_DIM, make_buffer, snapshot, step_args

NAN = float("nan")


def original_add_writes(buffer: RolloutBuffer, step_counts: list[int], env_id, state, actions,
                        log_probs, value, reward, done, masks, hidden_h, hidden_c,
                        truncated=False, bootstrap_value=0.0) -> None:
    """esper-lite 599f3895 rollout_buffer.py:295-345 (`TamiyoRolloutBuffer.add`), verbatim
    but for `self.` and the per-head arguments, written into `buffer`'s tensors."""
    step_idx = step_counts[env_id]

    if step_idx >= buffer.max_steps:
        raise RuntimeError(
            f"Environment {env_id} exceeded max_steps ({buffer.max_steps}). "
            f"Call reset() or compute_advantages_and_returns() first."
        )

    # Helper to detach tensors to prevent gradient graph retention
    def _detach(x):
        return x.detach() if isinstance(x, torch.Tensor) else x

    # Direct tensor assignment
    buffer.states[env_id, step_idx] = state.detach()
    for head in HEAD_NAMES:  # 309-316: slot_actions ... op_actions
        buffer.actions[head][env_id, step_idx] = actions[head]
    for head in HEAD_NAMES:  # 319-326
        buffer.log_probs[head][env_id, step_idx] = _detach(log_probs[head])
    buffer.values[env_id, step_idx] = _detach(value)
    buffer.rewards[env_id, step_idx] = reward
    buffer.dones[env_id, step_idx] = done
    buffer.truncated[env_id, step_idx] = truncated
    buffer.bootstrap_values[env_id, step_idx] = _detach(bootstrap_value)
    for head in HEAD_NAMES:  # 332-339
        buffer.masks[head][env_id, step_idx] = masks[head].detach().bool()
    # Hidden state: LSTM returns [num_layers, batch, hidden_dim]
    # Squeeze batch dim (dim=1) to get [num_layers, hidden_dim]
    buffer.hidden_h[env_id, step_idx] = hidden_h.detach().squeeze(1)
    buffer.hidden_c[env_id, step_idx] = hidden_c.detach().squeeze(1)

    step_counts[env_id] = step_idx + 1


def unchecked(num_envs=2, max_steps=4) -> RolloutBuffer:
    return make_buffer(num_envs, max_steps, add_checks="none")


def test_the_axis_presets_and_the_default_of_a_buffer_made_without_variants():
    assert AXES["add_checks"] == ("none", "mask_shapes", "checked")
    assert Variants.original().add_checks == Variants().add_checks == "none"
    assert Variants.reviews().add_checks == "mask_shapes"
    assert Variants.ours().add_checks == "checked"
    assert RolloutBuffer(2, 3, STATE_DIM).variants.add_checks == "checked"
    assert RolloutBuffer(2, 3, STATE_DIM, variants=Variants.original()).variants.add_checks == "none"


@pytest.mark.parametrize("kwargs, field", [
    (dict(variants="ours"), "variants"),
    (dict(variants={"gae": "scan"}), "variants"),
    (dict(num_envs=True, variants="ours"), "num_envs"),
])
def test_constructor_names_the_bad_argument_what_it_expected_and_got(kwargs, field):
    """`variants='ours'` used to fail deep inside with AttributeError ('str' object
    has no attribute 'step_counts')."""
    with pytest.raises((TypeError, ValueError), match=rf"RolloutBuffer: {field}: expected .*; got "):
        RolloutBuffer(**{"num_envs": 2, "max_steps": 3, "state_dim": STATE_DIM, **kwargs})


def test_unchecked_add_writes_what_the_original_writes_with_the_same_ops():
    g = torch.Generator().manual_seed(0)
    steps = [(env, step_args(g, done=t == 2, truncated=t == 2)) for t in range(3) for env in (0, 1)]
    ours, theirs = unchecked(), unchecked()
    counts: list[int] = [0, 0]
    for env, args in steps:
        ours_ops = profile_call(lambda: ours.add(env, **args)).ops
        theirs_ops = profile_call(lambda: original_add_writes(theirs, counts, env, **args)).ops
        assert ours_ops == theirs_ops
    got, want = snapshot(ours), snapshot(theirs)
    assert got["counts"] == counts
    for name, tensor in want.items():
        if name != "counts":
            assert torch.equal(got[name], tensor), name


@pytest.mark.parametrize("head", HEAD_NAMES)
def test_a_wrong_length_mask_broadcasts_only_at_length_one_and_never_truncates(head):
    """The audit: the buffer "will silently accept mismatched masks during add()
    (broadcasting or truncation)". The original's write broadcasts a [1] mask over all K
    actions; every other wrong length raises (RuntimeError from the copy); nothing is
    ever truncated. The unchecked add does the same, the checked one raises ValueError."""
    size = HEAD_SIZES[head]
    for length in (1, size - 1, size + 1, 2 * size):
        if length == size:
            continue
        args = step_args(torch.Generator().manual_seed(length))
        args["masks"][head] = torch.ones(length, dtype=torch.bool)
        outcomes = []
        for write in (lambda b: original_add_writes(b, [0, 0], 0, **args),
                      lambda b: b.add(0, **args)):
            buffer = unchecked()
            try:
                write(buffer)
            except RuntimeError as err:
                outcomes.append(("raises", "must match" in str(err) or "size" in str(err)))
            else:
                outcomes.append(("stored", buffer.masks[head][0, 0].tolist()))
        if length == 1:
            assert outcomes == [("stored", [True] * size)] * 2  # broadcast, silently
        else:
            assert outcomes == [("raises", True)] * 2
        with pytest.raises(ValueError, match=rf"masks\['{head}'\].shape: expected \({size},\)"):
            make_buffer(2, 4).add(0, **args)


def test_unchecked_add_stores_a_nan_state_that_the_checked_add_rejects():
    """With checks off a NaN state is stored as the original stored it (a later update
    then computes NaN losses); with checks on it is a ValueError naming the field."""
    args = step_args(torch.Generator().manual_seed(1))
    args["state"][3] = NAN
    buffer = unchecked()
    buffer.add(1, **args)
    assert torch.isnan(buffer.states[1, 0, 3])
    with pytest.raises(ValueError, match=r"env 1 step 0: state: expected finite numbers; got"):
        make_buffer(2, 4).add(1, **args)


def test_unchecked_add_still_refuses_to_overflow_a_row():
    """The original's one check (its line 297): without it a full row would be written
    past its end. Kept, as a ValueError like the checked add's."""
    buffer = unchecked(num_envs=1, max_steps=1)
    buffer.add(0, **step_args(torch.Generator().manual_seed(2)))
    with pytest.raises(ValueError, match="buffer full"):
        buffer.add(0, **step_args(torch.Generator().manual_seed(3)))


def test_both_add_paths_store_the_same_step():
    g = torch.Generator().manual_seed(4)
    args = [step_args(g, truncated=t == 1) for t in range(2)]
    buffers = {checks: make_buffer(1, 2, add_checks=checks) for checks in ("none", "checked")}
    for buffer in buffers.values():
        for a in args:
            buffer.add(0, **a)
    a, b = (snapshot(b) for b in buffers.values())
    for name in b:
        if name != "counts":
            assert torch.equal(a[name], b[name]), name
    assert dataclasses.replace(buffers["none"].variants, add_checks="checked") == buffers["checked"].variants
