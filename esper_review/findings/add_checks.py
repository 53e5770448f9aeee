"""Rollout-buffer audit 5.1: "Add shape validation in add()"; what the audit's mask-shape
checks cost per rollout, and checking every argument of `RolloutBuffer.add` (ours),
against the original's unchecked writes."""

from __future__ import annotations

import torch

from esper.rollout.buffer import RolloutBuffer
from esper.variants import AXES, Variants
from harness.findings import About, Case, Finding, Reading, Recording, max_abs_difference, register
from esper_review.findings.step_counts import HIDDEN, STATE_DIM, fill, rollout_steps
from esper_review.findings.trainer_size import nearest_trainer_size, per_iteration

VARIANTS = AXES["add_checks"]


def _cases(quick: bool) -> list[Case]:
    # the trainer's size only: at 16 x 150 the checks cost the same share (1.32x against
    # 1.29x at 4 x 25 in a default run) for 7 s more of the run
    return [Case.of(num_envs=4, max_steps=25)]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    num_envs, max_steps = case["num_envs"], case["max_steps"]
    buffers = {
        checks: RolloutBuffer(num_envs, max_steps, STATE_DIM, lstm_hidden_dim=HIDDEN,
                              device=device, variants=Variants(add_checks=checks))
        for checks in VARIANTS
    }
    return {"steps": rollout_steps(num_envs, max_steps, device, seed), "buffers": buffers}


def _make_call(variant: str, inputs: dict):
    buffer, steps = inputs["buffers"][variant], inputs["steps"]

    def rollout():
        fill(buffer, steps)
        return buffer

    return rollout


def stored_difference(output: RolloutBuffer, reference: RolloutBuffer) -> float:
    """Largest difference over every tensor two buffers hold (inf where the step counts
    differ): both add paths must store the same rollout."""
    if [output.step_count(e) for e in range(output.num_envs)] != \
            [reference.step_count(e) for e in range(reference.num_envs)]:
        return float("inf")
    pairs = []
    for name, value in vars(reference).items():
        if isinstance(value, torch.Tensor) and name != "step_counts":
            pairs.append((getattr(output, name), value))
        elif isinstance(value, dict) and name in ("actions", "log_probs", "masks"):
            pairs += [(getattr(output, name)[h], t) for h, t in value.items()]
    return max(max_abs_difference(out, ref) for out, ref in pairs)


def _per_add(variant: str, inputs: dict) -> dict[str, float]:
    case_adds = sum(len(adds) for _, adds, _ in inputs["steps"])
    return {"adds_per_call": float(case_adds)}


register(Finding(
    id="AUDIT-5.1-add-checks",
    title="RolloutBuffer.add: the original's unchecked writes vs the audit's mask-shape "
          "checks vs every argument checked",
    claim="the buffer will silently accept mismatched masks during add() (broadcasting or "
          "truncation); add shape validation in add()",
    variants=VARIANTS,
    baseline="none",
    proposed="mask_shapes",
    ours=("checked",),
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=stored_difference,
    tolerance=lambda case: 0.0,
    # the profiler slows the 2,400 add() calls at 16 x 150 ~20x; the counts scale with the
    # steps, so the 4 x 25 case's counts tell the same story
    about=About(
        ticket="rollout-buffer-audit.md",
        reviewed="src/esper/simic/agent/rollout_buffer.py:255-345 @599f3895 (add: no check but "
                 "the row's overflow, 297); the audit read the same writes at "
                 "src/esper/simic/tamiyo_buffer.py:194-254 @181a4c41",
        fix="Audit 5.1 (its first recommendation, section 8): 'Add shape validation in add(): "
            "if slot_mask.shape != (self.num_slots,): raise ValueError(...)', for each of the 8 "
            "masks before the writes (`mask_shapes`, esper.rollout.buffer.check_mask_shapes). "
            "Ours (`checked`, RolloutBuffer.validate_step) checks every argument: env_id, "
            "state and hidden shapes, dtypes, action ranges and masks, finite log-probs, "
            "values, rewards, states and hidden states, flags.",
        premise="'Silently accept mismatched masks (broadcasting or truncation)' holds for "
                "[1] masks only: the original's write (`self.slot_masks[env_id, step_idx] = "
                "slot_mask.detach().bool()`, tamiyo_buffer.py:245-248 @181a4c41, "
                "rollout_buffer.py:332-339 @599f3895) broadcasts a one-element mask over the "
                "head's K actions; any other wrong length raises RuntimeError ('The expanded "
                "size of the tensor (K) must match the existing size ...') after the fields "
                "written before it; nothing is truncated. tests/esper/rollout/test_add_checks.py "
                "shows it on a re-typed copy of the original's writes for every head.",
        notes=(
            "One timed call = one rollout: reset(), then num_envs x max_steps add() calls "
            "(adds_per_call); the time per add() is the call's time over adds_per_call. The "
            "rows differ only by the checks (the same writes follow: the original's, in its "
            "order, op for op: tests/esper_review/test_reviewed_baselines.py); their "
            "difference is the checks' own cost per rollout.",
            "Action masks come from the host and reach the device in one transfer per step (as "
            "the trainer's masks=packed moves them): on CUDA that copy is part of the timed call. "
            "On CUDA `checked` reads no tensor on the host: its checks of device tensors are "
            "device-side asserts (a few small kernels per add).",
            "Every row must store the same rollout (the none row is the reference).",
            "Counters (op calls, allocations, host syncs) come from the 4 x 25 case: calls over "
            "50 ms are not profiled.",
        ),
    ),
    recording=Recording(
        extra_metrics=_per_add,
        profile_max_s=0.05,
    ),
    reading=Reading(
        per_iteration=per_iteration(1),  # one rollout
        headline_case=nearest_trainer_size,
    ),
))
