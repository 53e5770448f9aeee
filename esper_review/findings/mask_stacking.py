"""H5 (vectorized-training review): a step's action masks, built on the device per env and
stacked per head vs copied row by row into pre-allocated tensors (the review's fix) vs
built on the host and moved in one packed transfer (ours)."""

from __future__ import annotations

import dataclasses

import torch

from esper.agent.heads import HEAD_NAMES
from esper.env.config import EnvConfig
from esper.env.mask_batch import MODES, MaskBatcher
from esper.env.seed_slot import NUM_SLOTS
from esper.env.vectorized import VectorizedMorphoEnv
from harness.findings import About, Case, Finding, Reading, Recording, register
from esper_review.findings.copies import copies_metric
from esper_review.findings.inference_mode import germinate
from esper_review.findings.trainer_size import DEFAULT_SIZE, nearest_trainer_size, per_iteration

#: a small host: the envs are only asked for their masks, never trained
_HOST = EnvConfig(train_batches=1, batch_size=8, val_size=8)


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=n) for n in ((4,) if quick else (4, 16))]


def mask_envs(num_envs: int, device: torch.device, seed: int) -> VectorizedMorphoEnv:
    """`num_envs` envs in different states: env i has seeds in its first `i % (NUM_SLOTS +
    1)` slots, so their op and slot masks differ (all slots full: the slot head is left
    unconstrained, as when only WAIT is valid)."""
    envs = VectorizedMorphoEnv(dataclasses.replace(_HOST, num_envs=num_envs, seed=seed), device)
    for i, env in enumerate(envs.envs):
        for slot in range(i % (NUM_SLOTS + 1)):
            germinate(env, slot)
    return envs


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """The envs and one `MaskBatcher` per variant."""
    n = case["num_envs"]
    return {"envs": mask_envs(n, device, seed).envs, "device": device,
            "batchers": {mode: MaskBatcher(n, device, mode) for mode in MODES}}


def _make_call(variant: str, inputs: dict):
    batcher, envs = inputs["batchers"][variant], inputs["envs"]
    # each env's masks where the variant builds them (the device, or the host), then batched
    return lambda: batcher([env.action_masks(batcher.source) for env in envs])


def masks_difference(output: dict, reference: dict) -> float:
    """Entries that differ, over every head (0 when the batches are equal); a head of
    another shape counts as all its entries."""
    differing = 0
    for head in HEAD_NAMES:
        out, ref = output[head].cpu(), reference[head].cpu()
        differing += int((out != ref).sum()) if out.shape == ref.shape else ref.numel()
    return float(differing)


register(Finding(
    id="H5-mask-stacking",
    title="A step's action masks: built on the device and stacked per head vs copied row by "
          "row into pre-allocated tensors vs one packed transfer",
    claim="This creates intermediate lists and stacks tensors inside a dict comprehension "
          "every epoch. The masks are boolean tensors that could be pre-allocated",
    ours=("packed",),
    variants=MODES,
    baseline="stack",
    proposed="preallocated",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=masks_difference,
    tolerance=lambda case: 0.0,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1553-1571 and "
                 "src/esper/tamiyo/policy/action_masks.py:122-172 @2df957ed",
        fix="vectorized-training-review.md H5: `batch_masks = {key: torch.zeros(n_envs, K, "
            "dtype=torch.bool, device=device)}` allocated once, then per step `for i, mask in "
            "enumerate(all_masks): for key in mask: batch_masks[key][i] = mask[key]`",
        premise="The review's 'memory churn' is of device tensors: each env's masks are built "
                "on the device (compute_action_masks(device=torch.device(device)), "
                "vectorized.py:1555-1562; torch.zeros/ones per head and one element write per "
                "allowed entry, action_masks.py:129-172), so the stack's .to(device) "
                "(vectorized.py:1569) moves nothing. 2df957ed has 4 heads (slot, blueprint, "
                "blend, op); this measures esper's 8 (the action space of 599f3895, which the "
                "trainer's policy has), so 8 stacks or 8 x N row copies per step.",
        duration_s=(1.5, 3.5),
        notes=(
            "One timed call = one step's masks of num_envs envs, {head: [N, K] bool} on the "
            "run's device, from each env's state (esper.env.mask_batch, as the trainer builds "
            "them; one env step is one host epoch, the review's 'every epoch'): stack (the "
            "original) = each env's masks built on the device as compute_action_masks does "
            "(torch.zeros/ones per head, one element write per allowed op or slot), then "
            "torch.stack per head and a .to(device) that moves nothing; preallocated (the "
            "review's fix) = the same per-env device masks copied row by row into [N, K] "
            "device tensors allocated once (8 x N copies); packed (ours) = each env's masks "
            "built on the host, one torch.cat(..., out=) into a host buffer allocated once "
            "(pinned on CUDA), one copy into a device buffer allocated once, views per head.",
            "8 heads are measured, not 2df957ed's 4: esper's action space is 599f3895's "
            "(8 heads, K = 3, 13, 4, 3, 3, 4, 3, 6); the original's per-step count would be "
            "4 stacks (or 4 x N row copies).",
            "host_to_device_copies: 0 for stack and preallocated (masks made on the device "
            "need no transfer), 1 for packed on CUDA; 0 everywhere on the CPU.",
            "Check: the batches must be equal entry for entry.",
        ),
    ),
    recording=Recording(
        extra_metrics=copies_metric(_make_call),
    ),
    reading=Reading(
        per_iteration=per_iteration(DEFAULT_SIZE["max_steps"]),  # one batch of masks a step
        headline_case=nearest_trainer_size,
    ),
))
