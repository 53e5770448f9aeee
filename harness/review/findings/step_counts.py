"""B4-PT-05: "step_counts is a Python list, not a tensor - ... requires CPU-GPU round trips"."""

from __future__ import annotations

import torch

from esper.agent.heads import HEAD_NAMES, HEAD_SIZES
from esper.env.mask_batch import masks_to_device
from esper.rollout.buffer import RolloutBuffer
from esper.variants import Variants
from harness.findings import Case, Finding, max_abs_difference, register
from harness.review.findings.trainer_size import nearest_trainer_size

STATE_DIM, HIDDEN = 218, 128


def _cases(quick: bool) -> list[Case]:
    sizes = [(4, 25)] if quick else [(4, 25), (16, 150)]
    return [Case.of(num_envs=e, max_steps=t) for e, t in sizes]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One buffer per variant on `device`, and every step's data prepared in advance.

    Each step holds its action masks as the envs give them, `{head: [N, K]}` on the host,
    and one add() per env without masks; states and hidden states are on `device`, as the
    policy leaves them.
    """
    num_envs, max_steps = case["num_envs"], case["max_steps"]
    g = torch.Generator().manual_seed(seed)
    steps = []
    for t in range(max_steps):
        host_masks = {h: torch.ones(num_envs, k, dtype=torch.bool) for h, k in HEAD_SIZES.items()}
        adds = [dict(
            env_id=env,
            state=torch.randn(STATE_DIM, generator=g).to(device),
            actions={h: int(torch.randint(0, k, (), generator=g)) for h, k in HEAD_SIZES.items()},
            log_probs={h: float(-torch.rand((), generator=g)) for h in HEAD_NAMES},
            value=float(torch.randn((), generator=g)),
            reward=float(torch.randn((), generator=g)),
            done=t == max_steps - 1,
            hidden_h=torch.randn(1, 1, HIDDEN, generator=g).to(device),
            hidden_c=torch.randn(1, 1, HIDDEN, generator=g).to(device),
            truncated=t == max_steps - 1,
            bootstrap_value=float(torch.randn((), generator=g)),
        ) for env in range(num_envs)]
        # on the CPU there is no transfer: each env's rows are views, taken here once
        cpu_rows = ([{h: m[env] for h, m in host_masks.items()} for env in range(num_envs)]
                    if device.type == "cpu" else None)
        steps.append((host_masks, adds, cpu_rows))
    buffers = {
        kind: RolloutBuffer(num_envs, max_steps, STATE_DIM, lstm_hidden_dim=HIDDEN,
                            device=device, variants=Variants(step_counts=kind))
        for kind in ("list", "tensor")
    }
    return {"steps": steps, "buffers": buffers, "device": device}


def _make_call(variant: str, inputs: dict):
    buffer, steps, device = inputs["buffers"][variant], inputs["steps"], inputs["device"]

    def rollout():
        buffer.reset()
        for host_masks, adds, cpu_rows in steps:
            if cpu_rows is None:
                # as the trainer: the step's masks reach the device in one transfer
                masks = masks_to_device(host_masks, device)
                rows = [{h: m[env] for h, m in masks.items()} for env in range(len(adds))]
            else:
                rows = cpu_rows
            for add, env_masks in zip(adds, rows):
                buffer.add(**add, masks=env_masks)
        return buffer.get_batched_sequences(device)

    return rollout


def _max_difference(output: dict, reference: dict) -> float:
    """Largest difference over every tensor of two `get_batched_sequences` dicts."""
    pairs = []
    for key, value in output.items():
        if isinstance(value, dict):
            pairs += [(t, reference[key][head]) for head, t in value.items()]
        else:
            pairs.append((value, reference[key]))
    return max(max_abs_difference(out, ref) for out, ref in pairs)


register(Finding(
    id="B4-PT-05",
    title="Buffer step_counts: Python list vs CPU tensor",
    claim="step_counts is a Python list, not a tensor - prevents vectorized operations and "
          "requires CPU-GPU round trips",
    ticket="B4-PT-05-step-counts-list.md",
    variants=("list", "tensor"),
    baseline="list",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_max_difference,
    tolerance=lambda case: 0.0,
    # the profiler slows its 2,400 add() calls at 16 x 150 ~20x (14 s of a 24 s cell); the
    # counts scale with the steps, so the 4 x 25 case's counts tell the same story
    profile_max_s=0.05,
    notes=(
        "Counters (op calls, allocations, host syncs) come from the 4 x 25 case: calls over "
        "50 ms are not profiled.",
        "One timed call = a full rollout of num_envs x max_steps add() calls into a buffer "
        "on the run's device, then get_batched_sequences() on that device.",
        "Both variants must produce identical batches (the list variant is the reference).",
        "Action masks come from the host as the envs give them and reach the device in one "
        "transfer per step, as in the trainer: on CUDA that copy is part of the timed call.",
    ),
))
