"""E2E-iteration: does any of it matter end to end? original() vs optimized() per PPO iteration."""

from __future__ import annotations

import torch

from esper.trainer import PHASES, TrainConfig, VectorizedTrainer
from esper.variants import Variants
from harness.measure.counters import profiling
from harness.findings import Case, Finding, max_abs_difference, register

PRESETS = {"original": Variants.original, "optimized": Variants.optimized}


def _cases(quick: bool) -> list[Case]:
    return [Case.of(num_envs=4, max_steps=10 if quick else 25)]


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One trainer per preset, same seed: variants change speed, not results."""
    return {
        name: VectorizedTrainer(TrainConfig(num_envs=case["num_envs"], max_steps=case["max_steps"],
                                            seed=seed, variants=preset()), device)
        for name, preset in PRESETS.items()
    }


def _make_call(variant: str, trainers: dict):
    trainer = trainers[variant]

    def iteration() -> torch.Tensor:
        stats = trainer.iteration()
        u = stats.update
        return torch.tensor([stats.mean_return, u["policy_loss"], u["value_loss"],
                             u["entropy"], u["approx_kl"]], dtype=torch.float64)

    return iteration



def phase_seconds(trainer: VectorizedTrainer) -> dict[str, float]:
    """Seconds per phase of one iteration, from the trainer's profiler ranges.

    `update` contains `gae` (GAE runs inside the update): it is reported exclusive of it.
    """
    with profiling(trainer.device) as prof:
        trainer.iteration()
    totals = {name: 0.0 for name in PHASES}
    for event in prof.key_averages():
        if event.key in totals:
            totals[event.key] = event.cpu_time_total / 1e6  # us -> s
    totals["update"] -= totals["gae"]
    iteration = sum(totals.values())
    out = {f"phase_{name}_s": value for name, value in totals.items()}
    out["gae_share"] = totals["gae"] / iteration if iteration > 0 else float("nan")
    return out


register(Finding(
    id="E2E-iteration",
    title="A full PPO iteration: original vs optimized variants",
    claim="This runs once per rollout, not in the hot training path",
    ticket="B4-CR-03-gae-vectorization.md",
    variants=tuple(PRESETS),
    baseline="original",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=max_abs_difference,
    tolerance=lambda case: 1e-5,
    extra_metrics=lambda variant, trainers: phase_seconds(trainers[variant]),
    # not gated: its work depends on the trainer's state (86,499 then 89,310 op calls in
    # iterations 2 and 3 of its quick case; the PPO update's KL early stop decides on float
    # values, which can round differently on another CPU), and its allocated bytes changed
    # with the torch thread count
    gated=False,
    notes=(
        "One timed call = one iteration: rollout (env epochs, policy forwards, buffer adds), "
        "GAE and the PPO update. " + f"original = {Variants.original().spec()}; "
        f"optimized = {Variants.optimized().spec()}.",
        "The correctness check compares the first iteration's return and losses (same seed).",
        "Phase seconds come from one profiled iteration (record_function ranges); the update "
        "is reported without the GAE inside it.",
    ),
))
