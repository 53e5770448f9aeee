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

    `phase_<name>_s` and `gae_share` are host time, from the profiler's CPU time of each
    `record_function` range. On CUDA, where a sync-free GAE returns before its kernels run
    and their time lands in `update` at its first sync, `phase_<name>_device_s` and
    `gae_share_device` add each phase's device-timeline time (CUDA events at the range's
    ends, `esper.device_spans`), beside it; on the CPU the two are one number and only
    the host fields exist. `update` contains `gae` (GAE runs inside the update): both
    are reported exclusive of it. `env_streams` (CUDA only): distinct env streams.
    """
    with profiling(trainer.device) as prof:
        stats = trainer.iteration()
    totals = {name: 0.0 for name in PHASES}
    for event in prof.key_averages():
        if event.key in totals:
            totals[event.key] = event.cpu_time_total / 1e6  # us -> s
    totals["update"] -= totals["gae"]
    out = {f"phase_{name}_s": value for name, value in totals.items()}
    out["gae_share"] = _share(totals)
    if stats.phase_device_seconds:
        device = {name: stats.phase_device_seconds[name] for name in PHASES}
        out.update({f"phase_{name}_device_s": value for name, value in device.items()})
        out["gae_share_device"] = _share(device)
        out["env_streams"] = trainer.env_streams
    return out


def _share(seconds: dict[str, float]) -> float:
    """GAE's fraction of the iteration's phases (NaN when they sum to 0)."""
    iteration = sum(seconds.values())
    return seconds["gae"] / iteration if iteration > 0 else float("nan")


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
    notes=(
        "One timed call = one iteration: rollout (env epochs, policy forwards, buffer adds), "
        "GAE and the PPO update. " + f"original = {Variants.original().spec()}; "
        f"optimized = {Variants.optimized().spec()}.",
        "The correctness check compares the first iteration's return and losses (same seed).",
        "Phase seconds come from one profiled iteration (record_function ranges); the update "
        "is reported without the GAE inside it. On CUDA each phase has host and device "
        "seconds side by side (phase_<name>_s, phase_<name>_device_s): host time of a "
        "sync-free GAE counts its launches, device time its kernels.",
    ),
))
