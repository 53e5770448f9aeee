"""esper-lite's reward normaliser: divided by the running std, clipped to +-10."""

from __future__ import annotations

import random

import pytest

from esper.agent.reward_normalizer import RewardNormalizer


class OriginalRewardNormalizer:
    """esper-lite 2df957ed src/esper/simic/control/normalization.py:172-202, re-typed."""

    def __init__(self, clip: float = 10.0, epsilon: float = 1e-8):
        self.mean = 0.0
        self.m2 = 0.0
        self.count = 0
        self.clip = clip
        self.epsilon = epsilon

    def update_and_normalize(self, reward: float) -> float:
        self.count += 1
        delta = reward - self.mean
        self.mean += delta / self.count
        delta2 = reward - self.mean
        self.m2 += delta * delta2
        if self.count < 2:
            return max(-self.clip, min(self.clip, reward))
        std = max(self.epsilon, (self.m2 / (self.count - 1)) ** 0.5)
        normalized = reward / std
        return max(-self.clip, min(self.clip, normalized))


def test_it_normalises_a_stream_as_the_original():
    rng = random.Random(0)
    rewards = [rng.gauss(0.01, 0.02) for _ in range(99)] + [4.0, 0.0, 25.0, -3.0]
    ours, original = RewardNormalizer(), OriginalRewardNormalizer()
    for reward in rewards:
        assert ours.update_and_normalize(reward) == original.update_and_normalize(reward)
    assert ours.update_and_normalize(1e9) == 10.0  # clipped


def test_the_first_reward_is_only_clipped_and_the_state_round_trips():
    normalizer = RewardNormalizer()
    assert normalizer.update_and_normalize(12.5) == 10.0
    normalizer.update_and_normalize(0.5)
    again = RewardNormalizer()
    again.load_state_dict(normalizer.state_dict())
    assert again.update_and_normalize(2.0) == normalizer.update_and_normalize(2.0)
    with pytest.raises(ValueError, match="RewardNormalizer: clip: expected a finite number > 0"):
        RewardNormalizer(clip=0.0)
