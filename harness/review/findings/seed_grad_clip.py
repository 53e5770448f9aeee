"""C3 (vectorized-training review): seed optimizers stepped without vs with gradient
clipping. A long finding: its stability answer takes many seeded episodes."""

from __future__ import annotations

import math

import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.env.config import EnvConfig
from esper.env.environment import MAX_LOSS_FEATURE, MorphoEnv
from esper.variants import Variants
from harness.findings import Case, Finding, register
from harness.measure.stats import bootstrap_mean_ci, wilson_interval
from harness.measure.timing import pinned_threads
from harness.review.findings.trainer_size import nearest_trainer_size

VARIANTS = ("none", "clip")


def _cases(quick: bool) -> list[Case]:
    return [Case.of(episodes=8 if quick else 96)]


def _env(config: EnvConfig, variant: str, device: torch.device) -> MorphoEnv:
    return MorphoEnv(config, 0, device, Variants(seed_clip=variant))


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """Per variant an env with a seed training at the highest learning-rate scale (the
    timed epoch); the episodes of the stability answer are built in `_episodes`."""
    config = EnvConfig(num_envs=1, seed=seed)
    envs = {}
    for variant in VARIANTS:
        env = _env(config, variant, device)
        action = {h: 0 for h in HEAD_NAMES}
        action.update(op=OP_INDEX["GERMINATE"], blueprint=4, style=3)  # mlp128, lr x4
        env.apply_action(action)
        envs[variant] = env
    return {"envs": envs, "episodes": case["episodes"], "seed": seed, "device": device}


def _make_call(variant: str, inputs: dict):
    return inputs["envs"][variant].launch_epoch  # one epoch: the seed steps train_batches times


def run_episode(env_seed: int, variant: str, device: torch.device) -> dict:
    """One episode of a fresh env (seed `env_seed`) under uniformly random masked actions
    drawn from a generator seeded by `env_seed` (the same actions under both variants:
    the masks depend on seed stages, not on weights). Returns the seed steps' gradient
    norms before clipping, whether the host diverged (a training loss that is not finite
    or above MAX_LOSS_FEATURE x ln(classes)) and the final validation accuracy."""
    config = EnvConfig(num_envs=1, seed=env_seed)
    env = _env(config, variant, device)
    env.seed_grad_norms = []  # each seed step appends its norm before clipping
    gen = torch.Generator().manual_seed(env_seed)
    cap = MAX_LOSS_FEATURE * math.log(config.num_classes)
    diverged, val_acc = False, 0.0
    for _ in range(config.max_steps):
        masks = env.action_masks()
        env.apply_action({h: int(torch.multinomial(masks[h].float(), 1, generator=gen))
                          for h in HEAD_NAMES})
        metrics = env.launch_epoch().cpu()  # host sync: once per epoch
        env.observe(metrics)
        train_loss, _, val_acc = metrics.tolist()
        diverged |= not train_loss <= cap  # NaN fails `<=` too
    norms = [float(n) for _, n in env.seed_grad_norms]  # host sync: after the episode
    return {"norms": norms, "diverged": diverged, "final_val_acc": val_acc}


#: the first env seed of the episodes (held apart from the seeds the timed envs use)
FIRST_EPISODE_SEED = 1000


def _results(inputs: dict, variant: str) -> list[dict]:
    """The episodes of `variant`, run once per cell (the clip row reads none's too)."""
    cache = inputs.setdefault("results", {})
    if variant not in cache:
        seeds = range(FIRST_EPISODE_SEED, FIRST_EPISODE_SEED + inputs["episodes"])
        with pinned_threads(1):  # the same outcomes whatever the run's threads; fast when busy
            cache[variant] = [run_episode(s, variant, inputs["device"]) for s in seeds]
    return cache[variant]


def _stability(variant: str, inputs: dict) -> dict[str, float]:
    """Rates (95% Wilson intervals) of seed steps and episodes whose gradient norm
    exceeded the clip limit, of diverged hosts, and the final validation accuracy (mean,
    95% bootstrap interval); on the clip row, the paired difference to none."""
    episodes = _results(inputs, variant)
    limit = EnvConfig().seed_clip_norm
    norms = [n for e in episodes for n in e["norms"]]
    out: dict[str, float] = {"episodes": float(len(episodes)), "seed_steps": float(len(norms)),
                             "seed_grad_norm_max": max(norms, default=0.0)}
    counts = {
        "norm_exceeded_steps": (sum(n > limit for n in norms), len(norms)),
        "norm_exceeded_episodes": (sum(any(n > limit for n in e["norms"]) for e in episodes),
                                   len(episodes)),
        "diverged_episodes": (sum(e["diverged"] for e in episodes), len(episodes)),
    }
    for name, (hits, total) in counts.items():
        out[name] = float(hits)
        if total:
            out[f"{name}_rate"] = hits / total
            out[f"{name}_rate_low"], out[f"{name}_rate_high"] = wilson_interval(hits, total)
    accuracy = [e["final_val_acc"] for e in episodes]
    out["final_val_acc"], out["final_val_acc_low"], out["final_val_acc_high"] = (
        bootstrap_mean_ci(accuracy, seed=inputs["seed"]))
    if variant != "none":
        base = [e["final_val_acc"] for e in _results(inputs, "none")]
        diff, low, high = bootstrap_mean_ci([a - b for a, b in zip(accuracy, base)],
                                            seed=inputs["seed"])
        out["final_val_acc_diff"], out["final_val_acc_diff_low"], out["final_val_acc_diff_high"] = (
            diff, low, high)
    return out


register(Finding(
    id="C3-seed-grad-clip",
    title="Seed optimizers: stepped without vs with gradient clipping",
    claim="Seed optimizers are stepped directly without gradient clipping. Seeds are smaller "
          "networks that can be more susceptible to gradient explosions",
    ticket="vectorized-training-review.md",
    variants=VARIANTS,
    baseline="none",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    extra_metrics=_stability,
    answer=("norm_exceeded_steps_rate", "diverged_episodes_rate", "final_val_acc_diff"),
    long=True,
    duration_s=(6.0, 30.0),
    notes=(
        "The environment as reviewed: each training seed has its own SGD optimizer "
        "(esper.env.optimizers); clip = clip_grad_norm_(seed parameters, 1.0) before its "
        "step, as the review suggests.",
        "One timed call = one epoch (4 steps) of an env whose seed (a 128-wide MLP) trains "
        "at 4x the host's learning rate: the time cost of clipping. Clipping changes the "
        "training by design, so there is no equality check (tests/test_review_findings.py "
        "proves the two equal when no norm exceeds the limit).",
        "The stability answer: `episodes` seeded episodes per variant (env seeds from "
        f"{FIRST_EPISODE_SEED}, the same random masked actions under both): seed steps and "
        "episodes whose gradient norm before clipping exceeded 1.0 (norm_exceeded_*), hosts "
        "that diverged (diverged_episodes: a training loss not finite or above 10 x "
        "ln(classes)), with 95% Wilson intervals; the final validation accuracy with a 95% "
        "bootstrap interval, and on the clip row its paired difference to none "
        "(final_val_acc_diff).",
    ),
))
