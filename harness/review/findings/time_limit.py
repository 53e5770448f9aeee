"""TL-bootstrap: an episode's end at the time limit stored as a truncation (bootstrapping
from V(s_T)) vs as a true terminal. A long finding: answered by learning runs."""

from __future__ import annotations

import torch

from esper.training.evaluate import train_and_evaluate
from esper.training.trainer import TIME_LIMITS, TrainConfig, VectorizedTrainer
from harness.findings import Case, Finding, register
from harness.measure.stats import bootstrap_mean_ci
from harness.measure.timing import pinned_threads
from harness.review.findings.trainer_size import nearest_trainer_size

#: quick: CI-sized; default: enough iterations for the policy to beat random play
SETTINGS = {
    True: dict(num_envs=2, max_steps=5, iterations=3, train_seeds=2, eval_seeds=8),
    False: dict(num_envs=4, max_steps=25, iterations=40, train_seeds=4, eval_seeds=32),
}
#: the first held-out env seed of the evaluation (training seeds are small integers)
FIRST_EVAL_SEED = 100


def _cases(quick: bool) -> list[Case]:
    s = SETTINGS[quick]
    return [Case.of(num_envs=s["num_envs"], max_steps=s["max_steps"],
                    iterations=s["iterations"], train_seeds=s["train_seeds"],
                    eval_seeds=s["eval_seeds"])]


def _config(case: Case, seed: int, time_limit: str) -> TrainConfig:
    return TrainConfig(num_envs=case["num_envs"], max_steps=case["max_steps"], seed=seed,
                       time_limit=time_limit)


def _build(case: Case, device: torch.device, seed: int) -> dict:
    """One trainer per variant from one seed (the timed iterations), and the case."""
    return {"trainers": {v: VectorizedTrainer(_config(case, seed, v), device) for v in TIME_LIMITS},
            "case": case, "device": device}


def _make_call(variant: str, inputs: dict):
    trainer = inputs["trainers"][variant]

    def iteration() -> float:
        return trainer.iteration().mean_return

    return iteration


def _check(output: float, reference: float) -> float:
    """The first iteration's mean return: its rollout comes before any update, and the
    time limit only decides how the last step is stored, so it must be equal."""
    return abs(output - reference)


def _returns(inputs: dict, variant: str) -> list[float]:
    """Mean held-out return after training, one per training seed (cached per cell)."""
    cache = inputs.setdefault("returns", {})
    if variant not in cache:
        case = inputs["case"]
        seeds = list(range(FIRST_EVAL_SEED, FIRST_EVAL_SEED + case["eval_seeds"]))
        with pinned_threads(1):  # the same runs whatever the run's threads; fast when busy
            cache[variant] = [
                train_and_evaluate(_config(case, train_seed, variant), case["iterations"],
                                   seeds, inputs["device"]).mean
                for train_seed in range(case["train_seeds"])]
    return cache[variant]


def _learning(variant: str, inputs: dict) -> dict[str, float]:
    """Mean held-out return over training seeds (95% bootstrap interval); on the terminal
    row also the paired difference to truncated (same training seed)."""
    returns = _returns(inputs, variant)
    out = {f"return_seed{i}": r for i, r in enumerate(returns)}
    out["heldout_return"], out["heldout_return_low"], out["heldout_return_high"] = (
        bootstrap_mean_ci(returns))
    if variant != "truncated":
        base = _returns(inputs, "truncated")
        out["heldout_return_diff"], out["heldout_return_diff_low"], out["heldout_return_diff_high"] = (
            bootstrap_mean_ci([a - b for a, b in zip(returns, base)]))
    return out


register(Finding(
    id="TL-bootstrap",
    title="The time limit: a truncation bootstrapping from V(s_T) vs a true terminal",
    claim="The truncation handling ... correctly computes V(s_{t+1}) for truncated "
          "episodes, avoiding the systematic downward bias that would occur from treating "
          "truncation as termination",
    ticket="vectorized-training-review.md",
    variants=TIME_LIMITS,
    baseline="truncated",
    headline_case=nearest_trainer_size,
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_check,
    tolerance=lambda case: 0.0,
    extra_metrics=_learning,
    answer=("heldout_return", "heldout_return_diff"),
    paired=True,
    long=True,
    duration_s=(10.0, 600.0),
    # not gated: like E2E-iteration, its work depends on the trainer's state
    gated=False,
    notes=(
        "Every episode ends at max_steps, and the observation holds the epoch counter: the "
        "time limit is part of the task. truncated (the reviewed behaviour, "
        "TrainConfig.time_limit's default) bootstraps the last step from V(s_T), a state "
        "the value head is never trained on; terminal stores a true terminal.",
        "One timed call = one training iteration (paired rounds, as E2E-iteration); the "
        "check compares the first iteration's mean return, which comes before any update.",
        "The learning answer: for each training seed (train_seeds of them), train "
        "`iterations` iterations and evaluate the policy on `eval_seeds` held-out env seeds "
        f"(from {FIRST_EVAL_SEED}): heldout_return is the mean over training seeds with a "
        "95% bootstrap interval (return_seed<i> each), and on the terminal row "
        "heldout_return_diff is the paired difference terminal - truncated.",
    ),
))
