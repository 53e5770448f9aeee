"""`Variants.step_counts`: where the buffer turns its step counts into a tensor, per
update, for each bookkeeping (the B4-PT-05 ticket).

`original_normalize` and `original_valid_mask` are the original's, re-typed from
esper-lite at 599f3895, src/esper/simic/agent/rollout_buffer.py:418-443
(`normalize_advantages`) and 456-460 (the valid mask of `get_batched_sequences`), `self.x`
made arguments, nothing else changed.
"""

from __future__ import annotations

import pytest
import torch

from esper.variants import Variants
from harness.measure.counters import profile_call
from tests.esper.rollout.test_buffer import fill, make_buffer, poison_padding

COUNTS = [5, 0, 3]


def original_normalize(advantages: torch.Tensor, step_counts: list[int]) -> None:
    """599f3895 rollout_buffer.py:418-443, verbatim but for `self.`; in place."""
    num_envs = advantages.shape[0]
    # Collect all valid advantages
    all_advantages = []
    for env_id in range(num_envs):
        num_steps = step_counts[env_id]
        if num_steps > 0:
            all_advantages.append(advantages[env_id, :num_steps])

    if not all_advantages:
        return

    # Compute global stats
    all_adv = torch.cat(all_advantages)
    mean = all_adv.mean()
    # Use correction=0 to avoid NaNs for single-element tensors.
    # (Bessel correction is undefined for n=1.)
    std = all_adv.std(correction=0)

    # Normalize in-place
    for env_id in range(num_envs):
        num_steps = step_counts[env_id]
        if num_steps > 0:
            advantages[env_id, :num_steps] = (
                advantages[env_id, :num_steps] - mean
            ) / (std + 1e-8)


def original_valid_mask(step_counts: list[int], max_steps: int, device) -> torch.Tensor:
    """599f3895 rollout_buffer.py:456-460."""
    # Build valid mask - vectorized (avoids Python loop)
    # step_idx < step_counts[env_id] using broadcasting
    step_counts_tensor = torch.tensor(step_counts, device=device).unsqueeze(1)
    step_indices = torch.arange(max_steps, device=device).unsqueeze(0)
    valid_mask = step_indices < step_counts_tensor  # [num_envs, max_steps]
    return valid_mask


def filled(kind: str):
    buffer = make_buffer(3, 5, variants=Variants(step_counts=kind), add_checks="none")
    fill(buffer, COUNTS)
    poison_padding(buffer, COUNTS)
    buffer.compute_advantages_and_returns(gamma=0.99, gae_lambda=0.95)
    return buffer


def test_the_list_normalises_as_the_original_by_slices_and_makes_no_count_tensor():
    """The list path reads its counts as Python ints, as the original: no list-to-tensor
    conversion (no arange of a valid mask), the original's ops and values."""
    buffer = filled("list")
    theirs = buffer.advantages.clone()
    ours_ops = profile_call(buffer.normalize_advantages).ops
    theirs_ops = profile_call(lambda: original_normalize(theirs, COUNTS)).ops
    assert ours_ops.get("aten::arange", 0) == theirs_ops.get("aten::arange", 0) == 0
    assert ours_ops.get("aten::cat") == theirs_ops.get("aten::cat") == 1
    torch.testing.assert_close(buffer.advantages, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("kind, masks", [("list", 1), ("cached", 1), ("tensor", 2)])
def test_valid_masks_built_per_update(kind, masks):
    """normalize_advantages + get_batched_sequences, as PPOAgent runs them once per
    update. The list (and cached) bookkeeping builds one valid mask, as the original
    (its line 459: one arange); the tensor one builds a second for its masked
    normalisation, from counts already a tensor (no list-to-tensor conversion)."""
    buffer = filled(kind)
    counters = profile_call(lambda: (buffer.normalize_advantages(),
                                     buffer.get_batched_sequences("cpu")))
    # (the profiler counts an arange as two aten::arange: the op and its out= overload)
    per_mask = profile_call(lambda: original_valid_mask(COUNTS, 5, "cpu")).ops["aten::arange"]
    assert counters.ops.get("aten::arange", 0) == masks * per_mask
    assert torch.equal(buffer.valid_mask(), original_valid_mask(COUNTS, 5, "cpu"))


def test_the_cached_count_tensor_is_rebuilt_only_after_the_counts_change():
    """The ticket's second option: a list, and a count tensor rebuilt when a dirty flag
    says the list changed (add and reset set it)."""
    buffer = make_buffer(2, 3, variants=Variants(step_counts="cached"))
    assert isinstance(buffer.step_counts, list) and buffer.step_counts_dirty
    fill(buffer, [2, 1])
    first = buffer.step_counts_tensor()
    assert not buffer.step_counts_dirty and first.tolist() == [2, 1]
    assert buffer.step_counts_tensor() is first  # a hit: nothing built
    assert profile_call(buffer.step_counts_tensor).op_calls == 0
    fill(buffer, [0, 1], seed=1)
    assert buffer.step_counts_dirty
    assert buffer.step_counts_tensor().tolist() == [2, 2]
    buffer.reset()
    assert buffer.step_counts_dirty and buffer.step_counts_tensor().tolist() == [0, 0]


@pytest.mark.parametrize("kind", ["list", "tensor", "cached"])
def test_step_counts_tensor_holds_the_counts_on_the_device_asked(kind):
    buffer = filled(kind)
    counts = buffer.step_counts_tensor("meta")
    assert counts.device.type == "meta" and counts.shape == (3,)
    assert buffer.step_counts_tensor().tolist() == COUNTS
