"""L2 (vectorized-training review): two in-place adds to the per-batch accumulators vs one
stacked add."""

from __future__ import annotations

import torch

from esper.env.accumulators import MODES, EpochAccumulators
from harness.findings import About, Case, Finding, Reading, max_abs_difference, register
from esper_review.findings.trainer_size import TRAIN_BATCHES, nearest_trainer_size, per_iteration


def _cases(quick: bool) -> list[Case]:
    return [Case.of(values="0-d")]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    loss = torch.rand((), generator=g).to(device) * 3  # a batch's loss in nats
    # of a 128-sample batch, int64 as `predicted.eq(targets).sum()` (vectorized.py:718-719)
    correct = torch.randint(0, 128, (), generator=g).to(device)
    return {"accumulators": {mode: EpochAccumulators(device, mode) for mode in MODES},
            "loss": loss, "correct": correct}


def _make_call(variant: str, inputs: dict):
    accumulators, loss, correct = inputs["accumulators"][variant], inputs["loss"], inputs["correct"]

    def add() -> EpochAccumulators:
        accumulators.add_(loss, correct)
        return accumulators

    return add


def _check(output: EpochAccumulators, reference: EpochAccumulators) -> float:
    """Both have had the same adds (the first call of each): their sums must be equal."""
    return max_abs_difference(output.sums(), reference.sums())


register(Finding(
    id="L2-fused-accumulators",
    title="Per-batch accumulators: two add_ vs one stacked add_",
    claim="These are two separate in-place operations. For maximum efficiency, consider "
          "fusing ... If losses and correct were stacked, could use single add_",
    variants=MODES,
    baseline="separate",
    proposed="stacked",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_check,
    tolerance=lambda case: 0.0,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1197-1200 @2df957ed (two add_ into "
                 "[1] float32 accumulators, parallel_env_state.py:88-91)",
        fix="the review's: stack loss and correct count, one add_",
        premise="At 2df957ed the correct count is int64 (predicted.eq(targets).sum(), "
                "vectorized.py:718-719), as here: each add into a float32 accumulator casts it "
                "(4 ops more than a float count in `separate`; in `stacked` the cat copies "
                "it).",
        duration_s=(1.0, 1.0),
        notes=(
            "One timed call = one batch's update of an env's accumulators (esper.env.accumulators): "
            "train_loss_accum.add_(loss) and train_correct_accum.add_(correct) into [1] float32 "
            "accumulators, the loss a 0-d float32 and the count a 0-d int64, as reviewed "
            "(op for op: tests/esper_review/test_reviewed_baselines.py), vs the review's "
            "sums.add_(torch.stack([loss, correct])) (two 0-d tensors, so one add needs a "
            "stack first).",
        ),
    ),
    reading=Reading(
        per_iteration=per_iteration(TRAIN_BATCHES),  # one update per training batch
        headline_case=nearest_trainer_size,
    ),
))
