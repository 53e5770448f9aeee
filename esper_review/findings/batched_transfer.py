"""Rollout-buffer audit 1.3: `get_batched_sequences` moving 20+ tensors one `.to()` each
vs one flat (pinned, non-blocking on CUDA) copy split into views on the device."""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.rollout.buffer import RolloutBuffer
from esper.variants import Variants
from harness.findings import About, Case, Finding, Reading, Recording, max_abs_difference, register
from esper_review.findings.copies import copies_metric
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration

VARIANTS = ("per_tensor", "flat")
STATE_DIM, HIDDEN = 218, 128


def _cases(quick: bool) -> list[Case]:
    sizes = [(4, 25)] if quick else [(4, 25), (16, 150)]
    return [Case.of(num_envs=e, max_steps=t) for e, t in sizes]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One full host-resident buffer per variant, with the same random contents."""
    n, m = case["num_envs"], case["max_steps"]
    buffers = {}
    for variant in VARIANTS:
        g = torch.Generator().manual_seed(seed)
        buffer = RolloutBuffer(n, m, STATE_DIM, lstm_hidden_dim=HIDDEN,
                               variants=Variants(transfer=variant))
        for t in range(m):
            for env in range(n):
                actions = {h: int(torch.randint(0, k, (), generator=g)) for h, k in HEAD_SIZES.items()}
                # random masks that allow the action taken (add() rejects a forbidden one)
                masks = {h: (torch.rand(k, generator=g) < 0.5) | (torch.arange(k) == actions[h])
                         for h, k in HEAD_SIZES.items()}
                buffer.add(
                    env, torch.randn(STATE_DIM, generator=g),
                    actions=actions,
                    log_probs={h: float(-torch.rand((), generator=g)) for h in HEAD_NAMES},
                    value=float(torch.randn((), generator=g)),
                    reward=float(torch.randn((), generator=g)), done=t == m - 1,
                    masks=masks,
                    hidden_h=torch.randn(1, 1, HIDDEN, generator=g),
                    hidden_c=torch.randn(1, 1, HIDDEN, generator=g),
                    truncated=t == m - 1, bootstrap_value=float(torch.randn((), generator=g)))
        buffer.compute_advantages_and_returns(gamma=0.995, gae_lambda=0.98)
        buffers[variant] = buffer
    return {"buffers": buffers, "target": device}


def _make_call(variant: str, inputs: dict):
    buffer, target = inputs["buffers"][variant], inputs["target"]
    return lambda: buffer.get_batched_sequences(target)


def _pairs(output: dict, reference: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pairs = []
    for key, value in reference.items():
        if isinstance(value, dict):
            pairs += [(output[key][head], t) for head, t in value.items()]
        else:
            pairs.append((output[key], value))
    return pairs


def batch_difference(output: dict, reference: dict) -> float:
    """Largest difference over every tensor of two `get_batched_sequences` dicts; inf
    where a key, shape, dtype or device differs."""
    if output.keys() != reference.keys():
        return float("inf")
    worst = 0.0
    for out, ref in _pairs(output, reference):
        if (out.shape, out.dtype, out.device) != (ref.shape, ref.dtype, ref.device):
            return float("inf")
        worst = max(worst, max_abs_difference(out, ref))
    return worst


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    """The transfer is the claim: a CPU run has no device to move the batch to."""
    return None if device.type == "cuda" else "needs CUDA"


register(Finding(
    id="AUDIT-1.3-batched-transfer",
    title="get_batched_sequences to the device: one .to() per tensor vs one flat copy",
    claim="The dictionary comprehension pattern with 20+ .to() calls may not be optimal ... "
          "If ever called in a tight loop, consider batching transfers or using pinned memory",
    variants=VARIANTS,
    baseline="per_tensor",
    proposed="flat",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=batch_difference,
    tolerance=lambda case: 0.0,
    skip=_skip,
    about=About(
        ticket="rollout-buffer-audit.md",
        reviewed="src/esper/simic/agent/rollout_buffer.py:445-504 @599f3895 "
                 "(get_batched_sequences: 31 .to(device, non_blocking=nb) and 2 "
                 "permute().contiguous().to() in a dict comprehension)",
        fix="the audit's 'consider batching transfers or using pinned memory': the fields "
            "packed into one pinned host buffer, one copy, views split on the device (flat, "
            "esper.rollout.transfer.FlatTransfer)",
        premise="The audit's case is hypothetical ('if ever called in a tight loop'): at "
                "599f3895 the buffer is allocated on the agent's device (ppo.py:318-325) and read "
                "with device=self.device (ppo.py:502), so every .to() is a no-op and nothing is "
                "transferred. This finding times a host-resident buffer moved to the device, "
                "which the original never does.",
        duration_s=(1.5, 4.0),
        notes=(
            "One timed call = get_batched_sequences of a full host-resident buffer (218 state "
            "features, LSTM 128) to the GPU: the reviewed lines op for op (the valid mask, then "
            "33 tensors, one .to(device, non_blocking=True) each, the step-0 hidden states "
            "permuted and made contiguous first), or the same fields packed byte-wise into one "
            "pinned host buffer allocated once, one copy, views split on the device.",
            "Needs CUDA: on the CPU there is no device to copy to, and a stand-in target "
            "would time the host side of one variant against a real copy in the other, an "
            "answer fixed before measuring. On CUDA the check compares every value exactly, "
            "and host syncs count the flat path's wait for the previous copy out of its "
            "pinned buffer.",
            "The trainer's buffer lives on the update's device, so it moves nothing: this "
            "matters for a host-resident buffer feeding a GPU update.",
        ),
    ),
    recording=Recording(
        extra_metrics=copies_metric(_make_call, "target"),
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # one update
        headline_case=nearest_trainer_size,
    ),
))
