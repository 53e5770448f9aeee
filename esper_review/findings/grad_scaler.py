"""C1 (vectorized-training review): one GradScaler shared by the host and seed optimizers
vs one per optimizer, under float16 mixed precision.

The answer is what happens in real episodes, nothing injected: how often each side's
gradients overflow on their own, and what sharing the scaler costs when they do (host
steps skipped, the loss scale left at the episode's end), with 95% intervals over
independent episodes (one per env seed). The timed call, one epoch of each arrangement,
is the cost.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.env.optimizers import HOST, amp_dtype
from esper.variants import Variants
from harness.findings import About, Case, Finding, Reading, Recording, max_abs_difference, register
from harness.measure.stats import t_mean_ci, wilson_interval
from harness.measure.timing import pinned_threads
from esper_review.findings.random_play import play_episode

VARIANTS = ("shared", "per_optimizer")
#: where mixed precision runs: `cuda`, float16 autocast and GradScaler('cuda'), the
#: original's configuration; `cpu`, the CPU's float16 autocast and GradScaler('cpu'), a
#: stand-in the original never runs (its AMP is CUDA only)
AMP_DEVICES = ("cuda", "cpu")
#: the original's seed learning rate (EnvConfig's default, DEFAULT_SEED_LR) ...
ORIGINAL_SEED_LR = EnvConfig.seed_lr
#: ... and 30x it, at which seeds diverge within an episode: overflows really happen
STRESS_SEED_LR = 0.3
#: the env seed of the first episode (apart from the seeds the timed envs use)
FIRST_EPISODE_SEED = 1000


def _cases(quick: bool) -> list[Case]:
    """The original's seed lr (5 episodes quick, 20 full) and, in full runs, the stress
    lr; each on CUDA and on the CPU stand-in."""
    episodes = 5 if quick else 20
    seed_lrs = (ORIGINAL_SEED_LR,) if quick else (ORIGINAL_SEED_LR, STRESS_SEED_LR)
    return [Case.of(amp=amp, seed_lr=lr, episodes=episodes)
            for lr in seed_lrs for amp in AMP_DEVICES]


def _headline(cases: list[Case]) -> Case:
    """The original's seed lr on this machine's device kind (CUDA when there is one)."""
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    return next((c for c in cases if c["amp"] == kind and c["seed_lr"] == ORIGINAL_SEED_LR),
                cases[0])


def _skip(variant: str, case: Case, device: torch.device) -> str | None:
    if case["amp"] == "cuda" and device.type != "cuda":
        return "needs CUDA"
    if case["amp"] == "cpu" and device.type != "cpu":
        return "the CPU stand-in runs on CPU runs only; the cuda case is the faithful one"
    return None


def germinated_env(config: EnvConfig, variant: str, device: torch.device) -> MorphoEnv:
    """A mixed-precision env with one training seed (slot 0): a host and a seed optimizer."""
    env = MorphoEnv(dataclasses.replace(config, amp=True), 0, device,
                    Variants(scaler=variant))
    action = {h: 0 for h in HEAD_NAMES}
    action.update(op=OP_INDEX["GERMINATE"], blueprint=2)  # a 32-wide MLP seed in slot 0
    env.apply_action(action)
    return env


def _build(case: Case, device: torch.device, seed: int) -> dict:
    config = EnvConfig(num_envs=1, seed=seed, seed_lr=case["seed_lr"])
    return {"envs": {v: germinated_env(config, v, device) for v in VARIANTS},
            "config": config, "device": device, "case": case}


def _make_call(variant: str, inputs: dict):
    return inputs["envs"][variant].launch_epoch  # one epoch: train_batches steps of each optimizer


def overflow_episode(config: EnvConfig, env_seed: int, arrangement: str,
                     device: torch.device) -> dict[str, float]:
    """One episode (`play_episode`: random masked actions seeded by `env_seed`) of a
    fresh float16 mixed-precision env of `config` (seed `env_seed`; the original's
    optimizers by default), its scaler(s) arranged by `arrangement`. Counts, from what each `scaler.step` found: the host's
    steps and those skipped for an inf/NaN in its gradients (`host_overflows`), the same
    for all seed steps, the batches in which a seed overflowed and the host did not
    (`seed_only_overflows`: under a shared scaler each one halves the host's scale too),
    and log2 of the host's scale at the end (`final_scale_log2`; 16 is the initial)."""
    config = dataclasses.replace(config, num_envs=1, seed=env_seed, amp=True)
    env = MorphoEnv(config, 0, device, Variants(scaler=arrangement))
    env.step_overflows = []
    play_episode(env, env_seed)
    batches: list[tuple[float, list[float]]] = []  # per batch: the host's, then its seeds'
    for name, found in env.step_overflows:
        if name == HOST:
            batches.append((float(found), []))  # host sync: reads after the episode
        else:
            batches[-1][1].append(float(found))
    scale = env.scalers["shared" if arrangement == "shared" else HOST].get_scale()
    return {
        "host_steps": len(batches),
        "host_overflows": sum(host for host, _ in batches),
        "seed_steps": sum(len(seeds) for _, seeds in batches),
        "seed_overflows": sum(sum(seeds) for _, seeds in batches),
        "seed_only_overflows": sum(1 for host, seeds in batches if not host and any(seeds)),
        "final_scale_log2": math.log2(scale),
    }


def _episodes(inputs: dict, variant: str) -> list[dict[str, float]]:
    """The episodes of `variant`, run once per cell (the per_optimizer row reads shared's)."""
    cache = inputs.setdefault("episodes", {})
    if variant not in cache:
        case = inputs["case"]
        seeds = range(FIRST_EPISODE_SEED, FIRST_EPISODE_SEED + case["episodes"])
        with pinned_threads(1):  # the same outcomes whatever the run's threads; fast when busy
            cache[variant] = [overflow_episode(inputs["config"], s, variant, inputs["device"])
                              for s in seeds]
    return cache[variant]


def _with_interval(out: dict, name: str, values: list[float],
                   bounds: tuple[float, float] = (-math.inf, math.inf)) -> None:
    """`out[name]`, `_low`, `_high`: the mean of `values` (one per episode) with its 95%
    t interval, cut to the `bounds` the quantity cannot leave (a rate's [0, 1])."""
    mean, low, high = t_mean_ci(values)
    out[name], out[f"{name}_low"], out[f"{name}_high"] = (
        mean, max(low, bounds[0]), min(high, bounds[1]))


def _stability(variant: str, inputs: dict) -> dict[str, float]:
    """Per episode (mean, 95% t interval over episodes): the host's and the seeds'
    overflow rates (skipped steps / steps), host steps skipped, seed-only overflows, the
    final scale; how many episodes saw any overflow (95% Wilson interval); on the
    per_optimizer row the paired differences to shared (same env seed, same actions)."""
    episodes = _episodes(inputs, variant)
    out: dict[str, float] = {"episodes": float(len(episodes))}
    _with_interval(out, "host_overflow_rate",
                   [e["host_overflows"] / e["host_steps"] for e in episodes], (0.0, 1.0))
    seeded = [e for e in episodes if e["seed_steps"]]
    out["episodes_with_seed_steps"] = float(len(seeded))
    if len(seeded) >= 2:
        _with_interval(out, "seed_overflow_rate",
                       [e["seed_overflows"] / e["seed_steps"] for e in seeded], (0.0, 1.0))
    for name in ("host_overflows", "seed_overflows", "seed_only_overflows"):
        _with_interval(out, name, [e[name] for e in episodes], (0.0, math.inf))
    _with_interval(out, "final_scale_log2", [e["final_scale_log2"] for e in episodes])
    out["host_skipped_steps"] = out["host_overflows"]
    out["host_skipped_steps_low"] = out["host_overflows_low"]
    out["host_skipped_steps_high"] = out["host_overflows_high"]
    for side in ("host", "seed"):
        hits = sum(e[f"{side}_overflows"] > 0 for e in episodes)
        out[f"episodes_with_{side}_overflow"] = float(hits)
        out[f"episodes_with_{side}_overflow_rate"] = hits / len(episodes)
        (out[f"episodes_with_{side}_overflow_rate_low"],
         out[f"episodes_with_{side}_overflow_rate_high"]) = wilson_interval(hits, len(episodes))
    if variant != "shared":
        base = _episodes(inputs, "shared")
        _with_interval(out, "host_skipped_steps_diff",
                       [e["host_overflows"] - b["host_overflows"] for e, b in zip(episodes, base)])
        _with_interval(out, "final_scale_log2_diff",
                       [e["final_scale_log2"] - b["final_scale_log2"]
                        for e, b in zip(episodes, base)])
    return out


CPU_AMP = str(amp_dtype(torch.device("cpu"))).removeprefix("torch.")

register(Finding(
    id="C1-grad-scaler",
    title="Mixed precision: one GradScaler shared by host and seed optimizers vs one each",
    claim="If one optimizer step skips due to NaN/Inf gradients, the scaler still updates "
          "its scale factor based on that failure, which can cause the subsequent optimizer "
          "steps to also be affected inconsistently",
    variants=VARIANTS,
    baseline="shared",
    proposed="per_optimizer",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    skip=_skip,
    check=max_abs_difference,
    tolerance=lambda case: 0.0,
    long=True,  # episodes of real training per case: out of the default run's 150 s
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1031-1035 @2df957ed (one GradScaler "
                 "per env, 853, shared by the host's SGD and every live seed's, 844-846 and "
                 "970-981; float16 autocast on CUDA only, 725 and 987-990; AMP off by default, 397)",
        fix="separate GradScalers for the host and the seed optimizers (the review's "
            "recommendation 1, vectorized-training-review.md C1)",
        premise="Half of it. PyTorch's GradScaler.step checks each optimizer's own gradients "
                "(found_inf_per_device per optimizer, torch/amp/grad_scaler.py _maybe_opt_step), "
                "so an overflow skips only the step of the optimizer that overflowed, and it "
                "unscales every optimizer's gradients before its step, so the scale never enters "
                "an effective learning rate (the review's risk, 'different effective learning "
                "rates during scale adjustments', does not arise). What is shared is the one "
                "update(): any optimizer's overflow halves the scale all of them use next, which "
                "moves only their margin to float16 overflow and underflow.",
        duration_s=(12.0, 90.0),
        notes=(
            "The environment as reviewed: mixed precision (EnvConfig.amp) and the original's "
            "optimizers (esper.env.optimizers): the host's SGD (lr 0.01, momentum 0.9, weight "
            "decay 5e-4) and one SGD per live seed (lr 0.01 x the style's scale, momentum 0.9), "
            "kept through the episode; a new scaler per episode, as the original's per env.",
            "amp=cuda rows are the original's configuration (float16 autocast, "
            "GradScaler('cuda')): 'needs CUDA' on a CPU run. amp=cpu rows are a CPU stand-in "
            f"the original never runs (CPU autocast in {CPU_AMP}, GradScaler('cpu')): the same "
            "arrangement of scalers, not CUDA's kernels.",
            "One timed call = one epoch (4 steps of each optimizer) of an env with one training "
            "seed; the check: both arrangements give identical metrics when nothing overflows.",
            "The answer: `episodes` episodes per variant (env seeds from "
            f"{FIRST_EPISODE_SEED}; uniformly random masked actions seeded by the env seed, the "
            "same under both), nothing injected. Per episode, from what each scaler.step found: "
            "host_overflow_rate and seed_overflow_rate (steps skipped for an inf/NaN / steps), "
            "host_skipped_steps, seed_only_overflows (batches where a seed overflowed and the "
            "host did not: under a shared scaler each halves the host's scale), "
            "final_scale_log2 (log2 of the host's scale at the end; 16 at the start); each a "
            "mean with a 95% Student-t interval over episodes, which are independent (cut to "
            "the range a rate or count cannot leave). On the "
            "per_optimizer row host_skipped_steps_diff and final_scale_log2_diff are the "
            "paired differences per_optimizer - shared (same env seed).",
            "Values that are equal in every episode (all 0) give a point interval: "
            "episodes_with_{host,seed}_overflow_rate, with a 95% Wilson interval over episodes, "
            "bounds how often an episode overflows at all.",
            f"seed_lr={STRESS_SEED_LR} (full runs) is 30x the original's seed learning rate: "
            "seeds diverge within the episode, so overflows happen and the arrangements can "
            "differ.",
            "The original's shared scaler would raise 'No inf checks were recorded for this "
            "optimizer' on a live seed without gradients (2df957ed calls scaler.step on every "
            "live seed); ours steps such an optimizer without the scaler, as 599f3895 does "
            "(vectorized.py:1456-1465). Every live seed here is in the forward pass, so the "
            "case does not arise in these episodes.",
        ),
    ),
    recording=Recording(
        extra_metrics=_stability,
    ),
    reading=Reading(
        headline_case=_headline,
        answer=("host_overflow_rate", "seed_overflow_rate", "host_skipped_steps_diff",
                "final_scale_log2_diff"),
    ),
))
