"""The observation normalisers: esper-lite's EMA (the default) and this project's Welford."""

from __future__ import annotations

import pytest
import torch

from esper.agent.observation_normalizer import (
    OBS_NORMALIZERS,
    EmaNormalizer,
    RunningNormalizer,
    make_obs_normalizer,
)
from esper.training.trainer import TrainConfig


def original_running_mean_std(batches, dim, momentum=0.99, epsilon=1e-4):
    """esper-lite 2df957ed src/esper/simic/control/normalization.py:33-120, RunningMeanStd
    with momentum (as vectorized.py:551 builds it), re-typed: mean, var, and normalize."""
    mean = torch.zeros(dim)
    var = torch.ones(dim)
    for x in batches:
        batch_mean = x.mean(dim=0)
        batch_var = x.var(dim=0, unbiased=False)
        delta = batch_mean - mean
        mean = momentum * mean + (1 - momentum) * batch_mean
        var = momentum * var + (1 - momentum) * batch_var + momentum * (1 - momentum) * delta ** 2

    def normalize(x, clip=10.0):
        return torch.clamp((x - mean) / torch.sqrt(var + epsilon), -clip, clip)

    return mean, var, normalize


def test_the_ema_normaliser_is_the_originals():
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(100, 5, generator=g) * 30 + 7 for _ in range(3)]
    ema = EmaNormalizer(5)
    for batch in batches:
        ema.update(batch)
    mean, var, normalize = original_running_mean_std(batches, 5)
    torch.testing.assert_close(ema.mean, mean)
    torch.testing.assert_close(ema.var, var)
    probe = torch.randn(4, 5, generator=g) * 40
    got = ema.normalize(probe)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, normalize(probe))
    assert ema.count == 300


def test_the_ema_normaliser_starts_at_mean_0_var_1_and_clips():
    """Before any update the original divides by sqrt(1 + 1e-4) and clips to +-10."""
    ema = EmaNormalizer(2)
    got = ema.normalize(torch.tensor([[1.0, 100.0]]))
    torch.testing.assert_close(got, torch.tensor([[1.0 / (1.0 + 1e-4) ** 0.5, 10.0]]))


def test_state_dicts_round_trip():
    for kind in OBS_NORMALIZERS:
        a = make_obs_normalizer(kind, 3, "cpu")
        a.update(torch.arange(12.0).reshape(4, 3))
        b = make_obs_normalizer(kind, 3, "cpu")
        b.load_state_dict(a.state_dict())
        x = torch.randn(2, 3)
        assert torch.equal(a.normalize(x), b.normalize(x))


def test_the_trainer_normalises_as_the_original_by_default():
    assert TrainConfig().obs_normalizer == "ema" == OBS_NORMALIZERS[0]
    assert isinstance(make_obs_normalizer("welford", 3, "cpu"), RunningNormalizer)
    with pytest.raises(ValueError, match="obs_normalizer: expected one of ema, welford; got 'x'"):
        TrainConfig(obs_normalizer="x")
