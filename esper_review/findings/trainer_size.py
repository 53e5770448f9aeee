"""Which case heads a finding of the review: the one nearest the trainer's default size.

The reviewed training loop runs at `TrainConfig`'s size (4 envs x 25 steps), so that is
where a finding's answer matters most. Given as every review finding's `headline_case`.
"""

from __future__ import annotations

import math
import numbers

from esper.training.trainer import TrainConfig
from harness.findings import Case

#: the size the reviewed training loop runs at by default
DEFAULT_SIZE = {"num_envs": TrainConfig.num_envs, "max_steps": TrainConfig.max_steps}


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
