"""One step's masks per `Variants.masks` (esper.env.mask_batch), held to esper-lite's code
and to the review's fix: transcriptions of their lines, compared on outputs and op counts
(each op on CUDA is a kernel launch, or a view that launches none)."""

from __future__ import annotations


import pytest
import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES, OP_INDEX, OPS
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.env.mask_batch import MODES, MaskBatcher
from esper.env.seed_slot import NUM_SLOTS, Stage
from tests.esper.env.test_env import AtenOps

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
N = 5
SMALL = EnvConfig(num_envs=N, train_batches=1, batch_size=8, val_size=8)


@pytest.fixture(scope="module")
def envs() -> list[MorphoEnv]:
    """Env i has seeds in its first i slots: op and slot masks differ from env to env
    (env 3's slots are all full: no GERMINATE); the last env's (env 4) seeds are
    fossilized, so that only WAIT is valid there."""
    made = [MorphoEnv(SMALL, i) for i in range(N)]
    for i, env in enumerate(made):
        for slot in range(min(i, NUM_SLOTS)):
            env.apply_action({**{h: 0 for h in HEAD_NAMES}, "op": OP_INDEX["GERMINATE"],
                              "slot": slot, "blueprint": 2})
    for slot in made[-1].slots:
        slot.stage = Stage.FOSSILIZED
    assert made[-1].action_masks()["op"].tolist() == [True] + [False] * (len(OPS) - 1)
    return made


def compute_action_masks(slot_ops: list[tuple[str, ...]], device) -> dict[str, torch.Tensor]:
    """2df957ed src/esper/tamiyo/policy/action_masks.py:122-172 transcribed, with esper's
    heads and rules (each slot's valid ops; every slot allowed when only WAIT is valid):
    torch.zeros / torch.ones per head on the device, one element write per allowed entry. The original has 4 heads (slot, blueprint, blend, op); the 6 esper heads that
    allow every choice are built as its blend mask is (torch.ones)."""
    device = device or torch.device("cpu")
    valid_ops = {"WAIT"}.union(*slot_ops)
    # Slot mask: only enabled slots are selectable in canonical order
    slot_mask = torch.zeros(NUM_SLOTS, dtype=torch.bool, device=device)
    for idx, ops in enumerate(slot_ops):
        if ops or len(valid_ops) == 1:
            slot_mask[idx] = True
    heads = {}
    for head in HEAD_NAMES:
        if head not in ("slot", "op"):
            heads[head] = torch.ones(HEAD_SIZES[head], dtype=torch.bool, device=device)
    # Op mask: depends on slot states across ALL enabled slots
    op_mask = torch.zeros(len(OPS), dtype=torch.bool, device=device)
    op_mask[OP_INDEX["WAIT"]] = True  # WAIT always valid
    for op in OPS[1:]:
        if op in valid_ops:
            op_mask[OP_INDEX[op]] = True
    return {"slot": slot_mask, **heads, "op": op_mask}


def original_masks_batch(envs: list[MorphoEnv], device) -> dict[str, torch.Tensor]:
    """2df957ed src/esper/simic/training/vectorized.py:1553-1571 transcribed: per env
    `compute_action_masks(..., device=torch.device(device))`, then the dict comprehension."""
    all_masks = []
    for env_state in envs:
        mask = compute_action_masks([slot.valid_ops() for slot in env_state.slots],
                                    device=torch.device(device))
        all_masks.append(mask)
    # Stack dict masks into batched dict: {key: [n_envs, head_dim]}
    masks_batch = {
        key: torch.stack([m[key] for m in all_masks]).to(device)
        for key in all_masks[0].keys()
    }
    return masks_batch


def review_fix(batch_masks: dict[str, torch.Tensor], all_masks) -> dict[str, torch.Tensor]:
    """vectorized-training-review.md H5's recommendation transcribed: per step, copy each
    env's masks into `batch_masks`, pre-allocated `[n_envs, K]` on the device."""
    # In loop, copy instead of stack
    for i, mask in enumerate(all_masks):
        for key in mask:
            batch_masks[key][i] = mask[key]
    return batch_masks


def batched(mode: str, envs: list[MorphoEnv], batcher: MaskBatcher | None = None):
    batcher = batcher or MaskBatcher(N, CPU, mode)
    return batcher([env.action_masks(batcher.source) for env in envs])


def assert_same_masks(got: dict, want: dict) -> None:
    assert set(got) == set(want) == set(HEAD_NAMES)
    for head in HEAD_NAMES:
        assert got[head].dtype == torch.bool and torch.equal(got[head], want[head]), head


def test_stack_is_the_original_path_in_outputs_and_op_counts(envs):
    with AtenOps() as ours:
        got = batched("stack", envs)
    with AtenOps() as original:
        want = original_masks_batch(envs, CPU)
    assert_same_masks(got, want)
    assert len({tuple(got["op"][i].tolist()) for i in range(N)}) > 1  # the envs differ
    assert ours.ops == original.ops
    assert ours.ops["stack.default"] == len(HEAD_NAMES)  # 8 here; 2df957ed's 4 heads: 4


def test_preallocated_is_the_review_s_row_copies_into_buffers_allocated_once(envs):
    batcher = MaskBatcher(N, CPU, "preallocated")
    buffers = {h: t.data_ptr() for h, t in batcher._batch.items()}
    per_env = [env.action_masks(batcher.source) for env in envs]
    with AtenOps() as ours:
        got = batcher(per_env)
    fix = {h: torch.zeros(N, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
    with AtenOps() as review:
        want = review_fix(fix, per_env)
    assert_same_masks(got, want)
    assert ours.ops == review.ops
    assert ours.ops["copy_.default"] == N * len(HEAD_NAMES) and "stack.default" not in ours.ops
    assert {h: t.data_ptr() for h, t in batched("preallocated", envs, batcher).items()} == buffers


def test_packed_builds_on_the_host_and_gives_the_same_masks_in_one_cat(envs):
    batcher = MaskBatcher(N, CPU, "packed")
    assert batcher.source is None and MaskBatcher(N, CPU, "stack").source == CPU
    per_env = [env.action_masks(batcher.source) for env in envs]
    with AtenOps() as ours:
        got = batcher(per_env)
    assert_same_masks(got, original_masks_batch(envs, CPU))
    assert ours.ops["cat.out"] == 1 and "stack.default" not in ours.ops
    pointer = got["op"].data_ptr()
    assert batched("packed", envs, batcher)["op"].data_ptr() == pointer


def test_mask_batcher_checks_its_mode_and_the_number_of_envs(envs):
    assert MODES == ("stack", "preallocated", "packed")
    with pytest.raises(ValueError, match="MaskBatcher: mode: expected one of stack, "
                                         "preallocated, packed; got 'stacked'"):
        MaskBatcher(N, CPU, "stacked")
    with pytest.raises(ValueError, match="expected the masks of 5 envs; got 3"):
        MaskBatcher(N, CPU, "stack")([env.action_masks() for env in envs[:3]])
