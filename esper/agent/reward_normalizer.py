"""esper-lite's reward normaliser: each reward divided by the running std of all rewards.

2df957ed src/esper/simic/control/normalization.py:150-224, `RewardNormalizer(clip=10.0)`
(vectorized.py:555), applied per reward, online, as the rollout produces them
(vectorized.py:1899): the stored rewards of one rollout are scaled by a drifting std.
It does not subtract the mean (the critic learns it), and the first reward, whose std is
not defined yet, is only clipped. `TrainConfig.reward_normalizer` turns it on (the
default) or off; the trainer reports raw returns either way, as the original does.
"""

from __future__ import annotations

from esper.checks import check_number


class RewardNormalizer:
    """Welford's running mean and M2 of every reward seen; `update_and_normalize(r)`
    returns `clip(r / max(eps, sample std), -clip, clip)` after folding `r` in."""

    def __init__(self, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.clip = check_number("RewardNormalizer: clip", clip, positive=True)
        self.epsilon = check_number("RewardNormalizer: epsilon", epsilon, positive=True)
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the running mean
        self.count = 0

    def update_and_normalize(self, reward: float) -> float:
        self.count += 1
        delta = reward - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (reward - self.mean)
        if self.count < 2:
            return max(-self.clip, min(self.clip, reward))
        std = max(self.epsilon, (self.m2 / (self.count - 1)) ** 0.5)
        return max(-self.clip, min(self.clip, reward / std))

    def state_dict(self) -> dict:
        return {"mean": self.mean, "m2": self.m2, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.m2, self.count = state["mean"], state["m2"], state["count"]
