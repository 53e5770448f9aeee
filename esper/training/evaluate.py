"""Mean episode return of a policy, of uniformly random masked actions or of always waiting,
on chosen env seeds; and `train_and_evaluate`, a whole run from a training seed to its
held-out return.

An evaluation episode is one full episode (`max_steps` epochs) of a fresh `MorphoEnv`
built from `env_config` with its `seed` replaced by one of `seeds` (env index 0). A
training run with `EnvConfig.seed = s` uses the data and host inits of (s, 0..num_envs-1),
so seeds other than the training seed are held out: unseen tasks and host inits.

All episodes of one call run in lockstep, so the policy takes one batched forward per
step, as in training. Nothing here updates the normaliser: it is used as frozen.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from esper.agent.heads import HEAD_NAMES, OP_INDEX
from esper.agent.observation_normalizer import ObservationNormalizer
from esper.agent.policy import FactoredRecurrentActorCritic
from esper.checks import check_int
from esper.env.config import EnvConfig
from esper.env.environment import MorphoEnv
from esper.training.trainer import TrainConfig, VectorizedTrainer


@dataclass(frozen=True)
class EvalResult:
    """Undiscounted episode returns, one per seed, in the order of the seeds."""

    seeds: tuple[int, ...]
    returns: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.returns)

    @property
    def std(self) -> float:
        """Sample standard deviation across episodes (0 for a single episode)."""
        return statistics.stdev(self.returns) if len(self.returns) > 1 else 0.0

    @property
    def stderr(self) -> float:
        """Standard error of the mean: std / sqrt(episodes)."""
        return self.std / math.sqrt(len(self.returns))

    def __str__(self) -> str:
        return f"{self.mean:+.4f} ± {self.std:.4f} (n={len(self.returns)})"


#: Chooses the actions of every running episode, once per step: (raw obs [N, D] f32 CPU,
#: masks {head: bool [N, K]} CPU) -> {head: [N] int64 CPU}.
ActionFn = Callable[[torch.Tensor, dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def _check_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds: expected at least one env seed; got none")
    for seed in seeds:
        check_int("seeds", seed, minimum=0)
    return seeds


def _run_episodes(env_config: EnvConfig, seeds: Sequence[int], choose: ActionFn) -> EvalResult:
    """Run one episode per seed in lockstep, the actions chosen by `choose`."""
    seeds = _check_seeds(seeds)
    envs = [MorphoEnv(dataclasses.replace(env_config, seed=s, num_envs=1), 0) for s in seeds]
    obs = torch.stack([env.reset() for env in envs])  # [N, D]
    returns = [0.0] * len(envs)
    for _ in range(env_config.max_steps):
        per_env = [env.action_masks() for env in envs]
        masks = {h: torch.stack([m[h] for m in per_env]) for h in HEAD_NAMES}  # {h: [N, K]}
        actions = choose(obs, masks)
        columns = {h: actions[h].tolist() for h in HEAD_NAMES}
        observed = []
        for i, env in enumerate(envs):
            env.apply_action({h: columns[h][i] for h in HEAD_NAMES})
            next_obs, reward = env.observe(env.launch_epoch().cpu())
            returns[i] += reward
            observed.append(next_obs)
        obs = torch.stack(observed)
    return EvalResult(seeds=seeds, returns=tuple(returns))


def evaluate_random(env_config: EnvConfig, seeds: Sequence[int], sample_seed: int = 0
                    ) -> EvalResult:
    """Returns of a uniformly random masked policy: each head picks uniformly among the
    actions its mask allows, independently of the other heads (what `act` does with
    all-equal logits). `sample_seed` seeds the action draws."""
    gen = torch.Generator().manual_seed(sample_seed)

    def choose(obs: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {h: torch.multinomial(m.float(), 1, generator=gen).squeeze(1)  # [N, 1] -> [N]
                for h, m in masks.items()}

    return _run_episodes(env_config, seeds, choose)


def evaluate_policy(policy: FactoredRecurrentActorCritic, normalizer: ObservationNormalizer,
                    env_config: EnvConfig, seeds: Sequence[int],
                    device: torch.device | str = "cpu", sample_seed: int = 0) -> EvalResult:
    """Returns of `policy` sampling its actions (the stochastic policy PPO trains), with the
    LSTM state carried through each episode from zero, on observations normalised by
    `normalizer` (frozen). `sample_seed` seeds a generator on `device` for the draws."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(sample_seed)
    hidden = policy.initial_hidden(len(_check_seeds(seeds)), device)

    def choose(obs: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        nonlocal hidden
        out = policy.act(normalizer.normalize(obs).to(device),
                         {h: m.to(device) for h, m in masks.items()}, hidden, generator=gen)
        hidden = out.hidden
        return {h: a.cpu() for h, a in out.actions.items()}

    return _run_episodes(env_config, seeds, choose)


def evaluate_always_wait(env_config: EnvConfig, seeds: Sequence[int]) -> EvalResult:
    """Returns of the fixed policy that always chooses WAIT (the host is never changed);
    every other head takes its first allowed action, which WAIT ignores."""

    def choose(obs: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        actions = {h: m.int().argmax(-1) for h, m in masks.items()}  # first True: [N, K] -> [N]
        actions["op"] = torch.full_like(actions["op"], OP_INDEX["WAIT"])
        return actions

    return _run_episodes(env_config, seeds, choose)


def train_and_evaluate(config: TrainConfig, iterations: int, seeds: Sequence[int],
                       device: torch.device | str = "cpu", sample_seed: int = 0) -> EvalResult:
    """Train a fresh `VectorizedTrainer(config)` for `iterations` iterations, then return
    the trained policy's returns on the env `seeds` (`evaluate_policy`).

    `config.seed` is the training seed: it seeds the policy, the action draws and the
    training envs. The evaluation seeds must be held out, so `config.seed` may not be
    one of them (an evaluation env with seed s is the training env 0 of seed s). Torch's
    thread count is the caller's choice. Used to compare training choices, e.g.
    `TrainConfig.time_limit`, over several training seeds.

    Raises:
        ValueError: `iterations` is not a positive int, or `seeds` is empty, holds a
            negative or non-int seed, or holds the training seed.
    """
    check_int("iterations", iterations)
    seeds = _check_seeds(seeds)
    if config.seed in seeds:
        raise ValueError(f"seeds: expected held-out env seeds, without the training seed "
                         f"{config.seed}; got {list(seeds)}")
    trainer = VectorizedTrainer(config, device)
    for _ in range(iterations):
        trainer.iteration()
    return evaluate_policy(trainer.policy, trainer.normalizer, config.env_config, seeds,
                           device, sample_seed)
