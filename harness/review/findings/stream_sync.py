"""H3 (vectorized-training review): host `stream.synchronize()` per env vs CUDA events."""

from __future__ import annotations

import torch

from esper.training.trainer import TrainConfig, VectorizedTrainer
from esper.variants import Variants
from harness.findings import Case, Finding, max_abs_difference, register
from harness.review.findings.e2e import stream_fields
from harness.review.findings.trainer_size import nearest_trainer_size

STEPS_FOR_BLOCKED_TIME = 10


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=n) for n in ((4,) if quick else (4, 12))]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One trainer per variant, same seed: their envs evolve identically."""
    return {
        sync: VectorizedTrainer(
            TrainConfig(num_envs=case["num_envs"], seed=seed, variants=Variants(sync=sync)), device
        )
        for sync in ("stream", "event")
    }


def _make_call(variant: str, trainers: dict):
    return trainers[variant].env_phase  # one vectorized env step: metrics [N, 3] on the CPU



def _host_blocked(variant: str, trainers: dict) -> dict[str, float]:
    trainer = trainers[variant]
    trainer._blocked_seconds = 0.0
    for _ in range(STEPS_FOR_BLOCKED_TIME):
        trainer.env_phase()
    return {"host_blocked_s_per_step": trainer._blocked_seconds / STEPS_FOR_BLOCKED_TIME,
            **stream_fields(trainer.env_streams, trainer.config.num_envs)}


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    return None if device.type == "cuda" else "needs CUDA"


register(Finding(
    id="H3-stream-sync",
    title="Vectorized env phase: per-env stream.synchronize() vs CUDA events",
    claim="Sync all streams ONCE at epoch end ... Consider using CUDA events for "
          "dependency instead of synchronization",
    ticket="vectorized-training-review.md",
    variants=("stream", "event"),
    baseline="stream",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_abs_difference,
    tolerance=lambda case: 1e-5,
    skip=_skip,
    extra_metrics=_host_blocked,
    gated=False,  # needs CUDA, and the gate counts on the CPU: it would have no cell
    notes=(
        "One timed call = one env step of every env: each env trains one epoch on its own "
        "CUDA stream, then the host reads the metrics.",
        f"Host-blocked time is the host's wait in synchronize / metric reads, averaged over "
        f"{STEPS_FOR_BLOCKED_TIME} steps.",
        "env_streams is how many distinct CUDA streams the envs ran on: torch.cuda.Stream() "
        "cycles through a pool of 32 per device, so above 32 envs some share one.",
        "On a machine without CUDA every row reads 'needs CUDA'.",
    ),
))
