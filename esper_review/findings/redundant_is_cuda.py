"""H2 (vectorized-training review): the `.is_cuda` check beside the stream check, per batch."""

from __future__ import annotations

import torch

from esper.env.stream_guard import GUARDS
from harness.findings import About, Case, Finding, Reading, register
from esper_review.findings.trainer_size import (
    ENV_STEPS, TRAIN_BATCHES, nearest_trainer_size, per_iteration,
)

VARIANTS = tuple(GUARDS)


class _StandInStream:
    """Where the run has no GPU: an object in the place of the env's CUDA stream (the guard
    only tests it for None)."""


def _cases(quick: bool) -> list[Case]:
    return [Case.of(batch_size=128)]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else _StandInStream()
    inputs = torch.zeros(case["batch_size"], 32, device=device)  # a batch of the env's inputs
    return {"stream": stream, "inputs": inputs, "device": device}


def _make_call(variant: str, inputs: dict):
    guard, stream, batch = GUARDS[variant], inputs["stream"], inputs["inputs"]
    return lambda: guard(stream, batch)


register(Finding(
    id="H2-redundant-is-cuda",
    title="Per-batch record_stream guard: stream and .is_cuda vs stream alone",
    claim="The .is_cuda check happens inside the stream context for every batch. Since "
          "env_state.stream existence already implies CUDA usage, this is redundant",
    variants=VARIANTS,
    baseline="is_cuda",
    proposed="stream",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=None,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:939-941 (train) and 1066-1068 (val) "
                 "@2df957ed: `if env_state.stream and inputs.is_cuda: inputs.record_stream(...)`",
        fix="the review's: drop `.is_cuda`, the stream's existence implies CUDA",
        duration_s=(1.0, 1.0),
        notes=(
            "One timed call = the guard of one batch (esper.env.stream_guard, as each env's "
            "launch_epoch evaluates it): `stream is not None and inputs.is_cuda` vs `stream is "
            "not None`; nanoseconds per call (the record_stream calls it guards are the same "
            "in both and not timed).",
            "On the CPU the stream is a stand-in object and the inputs a CPU tensor, so the "
            "is_cuda guard returns False where the stream guard returns True: the cost of "
            "`.is_cuda` is the same on either device, but the decisions are only comparable on "
            "CUDA, where both record the batch. No equality check here for that reason; "
            "tests/esper_review/test_review_findings.py checks both decide alike for CUDA-typed inputs.",
        ),
    ),
    reading=Reading(
        per_iteration=per_iteration(TRAIN_BATCHES + ENV_STEPS),  # per training batch and validation
        headline_case=nearest_trainer_size,
    ),
))
