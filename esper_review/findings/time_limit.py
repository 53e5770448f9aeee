"""TL-bootstrap: an episode's end at the time limit stored as a truncation (bootstrapping
from V(s_T)) vs as a true terminal. A long finding: answered by learning runs.

A learning comparison means something only where learning happened: each arm's trained
policies are compared with the policy that always WAITs (the host left to train alone),
on the same held-out env seeds. Unless both arms beat it, with their intervals clear of
it, the answer is "cannot decide", whatever the difference between the arms.
"""

from __future__ import annotations

import torch

from esper.training.evaluate import evaluate_always_wait, evaluate_random, train_and_evaluate
from esper.training.trainer import TIME_LIMITS, TrainConfig, VectorizedTrainer
from harness.findings import About, Case, Finding, Reading, Recording, register
from harness.measure.stats import t_mean_ci
from harness.measure.timing import pinned_threads
from esper_review.findings.trainer_size import nearest_trainer_size

#: Training seeds per arm: the unit of the intervals (at least 10 at every size).
TRAIN_SEEDS = 10
#: quick: CI-sized (seconds); default: the trainer's size (4 envs x 25 steps), with the
#: per-seed run shrunk (iterations, held-out episodes) so that 10 seeds per arm fit.
SETTINGS = {
    True: dict(num_envs=2, max_steps=5, iterations=1, train_seeds=TRAIN_SEEDS, eval_seeds=4),
    False: dict(num_envs=4, max_steps=25, iterations=40, train_seeds=TRAIN_SEEDS, eval_seeds=8),
}
#: the first held-out env seed of the evaluation (training seeds are small integers)
FIRST_EVAL_SEED = 100
#: the answer's words
CANNOT_DECIDE = "cannot decide"


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


def _eval_seeds(case: Case) -> list[int]:
    return list(range(FIRST_EVAL_SEED, FIRST_EVAL_SEED + case["eval_seeds"]))


def _returns(inputs: dict, variant: str) -> list[float]:
    """Mean held-out return after training, one per training seed (cached per cell).
    The policy's action draws are seeded by the training seed too: with one draw seed
    for all, near-uniform policies would draw the same actions and their returns would
    agree more than independent runs do."""
    cache = inputs.setdefault("returns", {})
    if variant not in cache:
        case = inputs["case"]
        with pinned_threads(1):  # the same runs whatever the run's threads; fast when busy
            cache[variant] = [
                train_and_evaluate(_config(case, train_seed, variant), case["iterations"],
                                   _eval_seeds(case), inputs["device"],
                                   sample_seed=train_seed).mean
                for train_seed in range(case["train_seeds"])]
    return cache[variant]


def _baselines(inputs: dict) -> dict[str, float]:
    """Mean returns of always-WAIT (deterministic) and of uniformly random masked
    actions on the held-out seeds (cached)."""
    if "baselines" not in inputs:
        case = inputs["case"]
        env_config = _config(case, 0, "truncated").env_config
        with pinned_threads(1):
            inputs["baselines"] = {
                "always_wait": evaluate_always_wait(env_config, _eval_seeds(case)).mean,
                "random": evaluate_random(env_config, _eval_seeds(case)).mean}
    return inputs["baselines"]


def beats(low: float) -> bool:
    """Whether an interval of (policy - always-WAIT) returns lies wholly above 0."""
    return low > 0.0


def decision(vs_wait: dict[str, tuple[float, float, float]],
             diff: tuple[float, float, float]) -> str:
    """The answer's words from each arm's (mean, low, high) return minus always-WAIT's
    and the (mean, low, high) paired difference terminal - truncated: CANNOT_DECIDE
    (with the reason) unless every arm beats always-WAIT with its interval clear of it
    and the difference's interval is clear of 0; then which arm's return is higher."""
    losing = [arm for arm, (_, low, _) in vs_wait.items() if not beats(low)]
    if losing:
        return (f"{CANNOT_DECIDE}: {' and '.join(losing)} "
                f"{'does' if len(losing) == 1 else 'do'} not beat always-WAIT (the "
                "interval of return - always-WAIT's is not above 0)")
    _, low, high = diff
    if low > 0.0:
        return "terminal's held-out return is higher"
    if high < 0.0:
        return "truncated's held-out return is higher"
    return f"{CANNOT_DECIDE}: the interval of terminal - truncated holds 0"


def _learning(variant: str, inputs: dict) -> dict:
    """Mean held-out return over training seeds and its excess over always-WAIT (95% t
    intervals over training seeds); on the terminal row also the paired difference to
    truncated (same training seed) and the answer's words (`decision`)."""
    returns = _returns(inputs, variant)
    baselines = _baselines(inputs)
    wait = baselines["always_wait"]
    out: dict = {f"return_seed{i}": r for i, r in enumerate(returns)}
    out["train_seeds"] = float(len(returns))
    out["always_wait_return"] = wait
    out["random_return"] = baselines["random"]
    out["heldout_return"], out["heldout_return_low"], out["heldout_return_high"] = (
        t_mean_ci(returns))
    vs_wait = {}
    for arm in TIME_LIMITS:
        vs_wait[arm] = t_mean_ci([r - wait for r in _returns(inputs, arm)])
    out["return_vs_wait"], out["return_vs_wait_low"], out["return_vs_wait_high"] = vs_wait[variant]
    out["beats_always_wait"] = float(beats(vs_wait[variant][1]))
    if variant != "truncated":
        base = _returns(inputs, "truncated")
        diff = t_mean_ci([a - b for a, b in zip(returns, base)])
        out["heldout_return_diff"], out["heldout_return_diff_low"], out["heldout_return_diff_high"] = diff
        out["decision"] = decision(vs_wait, diff)
        if not all(beats(low) for _, low, _ in vs_wait.values()):
            # the runs did not learn enough for the question: said at the end of the run
            out["warning"] = f"TL-bootstrap {out['decision']}"
    return out


register(Finding(
    id="TL-bootstrap",
    title="The time limit: a truncation bootstrapping from V(s_T) vs a true terminal",
    claim="The truncation handling ... correctly computes V(s_{t+1}) for truncated "
          "episodes, avoiding the systematic downward bias that would occur from treating "
          "truncation as termination",
    ours=("terminal",),
    variants=TIME_LIMITS,
    baseline="truncated",
    cases=_cases,
    build=_build,
    make_call=_make_call,
    check=_check,
    tolerance=lambda case: 0.0,
    long=True,
    # not gated: like E2E-iteration, its work depends on the trainer's state
    gated=False,
    about=About(
        ticket="vectorized-training-review.md",
        reviewed="src/esper/simic/training/vectorized.py:1905-1906 @2df957ed (`truncated = "
                 "done` at epoch == max_epochs, then a bootstrap V(s_T), 1912-1973), with the "
                 "terminal reward of src/esper/simic/rewards/rewards.py:657-669 and the reward "
                 "normaliser of vectorized.py:555,1899",
        premise="The bias it avoids is that of cutting a longer task short; here the time "
                "limit is the task's. Every episode of the original ends at max_epochs, the "
                "observation holds the epoch (src/esper/tamiyo/policy/features.py:131,166 "
                "@2df957ed) and the last step pays the terminal reward (rewards.py:660, `if "
                "epoch == max_epochs`); yet it is stored as truncated and bootstrapped from "
                "V(s_T), a state the value head is never trained on.",
        duration_s=(15.0, 750.0),
        notes=(
            "truncated (the reviewed behaviour, TrainConfig.time_limit's default) bootstraps "
            "the last step from V(s_T); terminal (ours) stores a true terminal. Both pay the "
            "original's terminal reward (EnvConfig.terminal_bonus) and normalise rewards online "
            "(TrainConfig.reward_normalizer), as the original does by default.",
            "One timed call = one training iteration (paired rounds, as E2E-iteration); the "
            "check compares the first iteration's mean return, which comes before any update.",
            f"The learning answer: for each of {TRAIN_SEEDS} training seeds per arm, train "
            "`iterations` iterations and evaluate the policy on `eval_seeds` held-out env seeds "
            f"(from {FIRST_EVAL_SEED}); heldout_return is the mean over training seeds, "
            "return_vs_wait its excess over always-WAIT's mean return on the same held-out "
            "seeds (always_wait_return), each with a 95% Student-t interval over training "
            "seeds (each seed's policy draws its actions from a generator of its own seed, so "
            "the seeds' outcomes are independent); on the terminal row heldout_return_diff is "
            "the paired difference terminal - truncated (same training seed), with its t "
            "interval. random_return: uniformly random masked actions on the same seeds, for "
            "scale (random play germinates seeds, which can already beat always-WAIT).",
            f"decision (terminal row) says '{CANNOT_DECIDE}' unless both arms beat always-WAIT "
            "with return_vs_wait's interval above 0 and the difference's interval is clear of "
            "0 (then which arm is higher). A policy that does not beat always-WAIT has not "
            "learned enough to tell the arms apart: that cannot-decide is also the row's "
            "warning, said at the end of the run.",
            "Sizes: the default case runs the trainer's size (4 envs x 25 steps) but shrinks "
            "each seed's run (40 iterations instead of the learning test's 125, 8 held-out "
            "episodes) so that 10 seeds per arm fit in about 12 minutes on a 2-core CPU; "
            "there both arms beat always-WAIT, but by little more than random play does. The "
            "quick case (2 envs x 5 steps, 1 iteration, about 15 s) is a smoke test of the "
            "answer's computation: its policies have barely trained and it cannot decide.",
        ),
    ),
    recording=Recording(
        extra_metrics=_learning,
        paired=True,
    ),
    reading=Reading(
        headline_case=nearest_trainer_size,
        answer=("return_vs_wait", "heldout_return_diff"),
    ),
))
