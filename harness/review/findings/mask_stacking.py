"""H5 (vectorized-training review): per-step stacking of the action masks vs pre-allocated
mask tensors filled in place."""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.env.mask_batch import MODES, MaskBatcher
from harness.findings import Case, Finding, register
from harness.review.findings.copies import copies_metric
from harness.review.findings.trainer_size import nearest_trainer_size


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=n) for n in ((4,) if quick else (4, 16))]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """Each env's masks `{head: [K] bool}` on the host (at least one True per head), and
    one `MaskBatcher` per variant."""
    g = torch.Generator().manual_seed(seed)
    n = case["num_envs"]
    per_env = []
    for _ in range(n):
        masks = {h: torch.rand(k, generator=g) < 0.5 for h, k in HEAD_SIZES.items()}
        for mask in masks.values():
            mask[0] = True
        per_env.append(masks)
    return {"per_env": per_env, "device": device,
            "batchers": {mode: MaskBatcher(n, device, mode) for mode in MODES}}


def _make_call(variant: str, inputs: dict):
    batcher, per_env = inputs["batchers"][variant], inputs["per_env"]
    return lambda: batcher(per_env)


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
    title="A step's action masks: stacked per head every step vs pre-allocated tensors",
    claim="This creates intermediate lists and stacks tensors inside a dict comprehension "
          "every epoch. The masks are boolean tensors that could be pre-allocated",
    ticket="vectorized-training-review.md",
    variants=MODES,
    baseline="stack",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=masks_difference,
    tolerance=lambda case: 0.0,
    extra_metrics=copies_metric(_make_call),
    duration_s=(1.0, 3.0),
    notes=(
        "One timed call = one step's masks of num_envs envs, {head: [N, K] bool} on the "
        "run's device, from each env's {head: [K]} (esper.env.mask_batch, as the trainer "
        "builds them; one env step is one host epoch, the review's 'every epoch').",
        "stack = torch.stack per head (8 new tensors), then this trainer's one packed "
        "transfer (the reviewed code's .to(device) per head would be 8 transfers on CUDA); "
        "preallocated = one torch.cat(..., out=) into a host buffer allocated once (pinned "
        "on CUDA), one copy into a device buffer allocated once, views per head.",
        "Check: the two batches must be equal entry for entry.",
    ),
))
