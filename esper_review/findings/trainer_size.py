"""The trainer's sizes, as the review's findings use them: which case heads a finding (the
one nearest the trainer's default size, 4 envs x 25 steps, where the reviewed training
loop runs and a finding's answer matters most: every review finding's `headline_case`);
how many of a finding's calls one training iteration of that size makes; and how deep the
policy's arithmetic is (the depth its findings' tolerances are derived from,
`harness.rounding_tolerance`).
"""

from __future__ import annotations

import math
import numbers

from esper.env.config import EnvConfig
from esper.training.trainer import TrainConfig
from harness.findings import Case

#: the size the reviewed training loop runs at by default
DEFAULT_SIZE = {"num_envs": TrainConfig.num_envs, "max_steps": TrainConfig.max_steps}
#: the finding whose baseline call is one training iteration at DEFAULT_SIZE
ITERATION = "E2E-iteration"
#: env steps of one iteration (each one host epoch of one env)
ENV_STEPS = TrainConfig.num_envs * TrainConfig.max_steps
#: host training batches of one iteration: every env's epochs' minibatches
TRAIN_BATCHES = ENV_STEPS * EnvConfig.train_batches


def per_iteration(calls: float) -> tuple[float, str]:
    """A finding's `per_iteration`: `calls` of its headline call per training iteration."""
    return (float(calls), ITERATION)


def nearest_trainer_size(cases: list[Case]) -> Case:
    """The case nearest DEFAULT_SIZE: the smallest sum, over the size parameters a case
    has, of |log(value / default)|; ties go to the first (so 'dones=episode' before
    'random')."""

    def distance(case: Case) -> float:
        params = dict(case.params)
        total = 0.0
        for name, default in DEFAULT_SIZE.items():
            value = params.get(name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and value > 0:
                total += abs(math.log(float(value) / default))
        return total

    return min(cases, key=lambda case: (distance(case), cases.index(case)))


def policy_depth(obs_dim: int, hidden_dim: int = TrainConfig.hidden_dim, steps: int = 1) -> int:
    """Roundings in the longest chain of one value of `FactoredRecurrentActorCritic`
    (esper/agent/policy.py) over `steps` LSTM steps: the trunk's Linear(D, H) and
    LayerNorm (D + H), each LSTM step's gates over input and hidden state (2H per step, the
    state carried from step to step), the LayerNorm after it (H) and the value head's
    Linear(H, 64) -> Linear(64, 1) (H + 64)."""
    return obs_dim + hidden_dim + 2 * hidden_dim * steps + hidden_dim + hidden_dim + 64
