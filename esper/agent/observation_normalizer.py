"""Running mean / std of observations, frozen while a rollout is collected.

Two kinds (`TrainConfig.obs_normalizer`): `ema`, esper-lite's (the default), and
`welford`, this project's earlier full-history statistics. Both normalise to float32,
clip to +-10 and are updated by the trainer once per rollout, after it, from the
observations the actions were taken on; docs/differences.md compares them.
"""

from __future__ import annotations

import torch

from esper.checks import check_choice, check_device, check_int


class RunningNormalizer:
    """Per-feature running mean and population variance (Chan et al. parallel update).

    `normalize` uses the statistics as they stand; `update` folds in a batch. The trainer
    calls `update` only after a rollout, so every step of a rollout is normalised the same
    way and the stored observations match those the actions were sampled on.
    """

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        check_int("RunningNormalizer: dim", dim)
        self.mean = torch.zeros(dim, dtype=torch.float64)
        self.var = torch.ones(dim, dtype=torch.float64)
        self.count = 0
        self.clip, self.eps = clip, eps
        self._device_stats: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, batch: torch.Tensor) -> None:
        """Fold in `batch [B, dim]` (CPU)."""
        if batch.dim() != 2 or batch.shape[1] != self.mean.shape[0]:
            raise ValueError(
                f"RunningNormalizer.update: batch: expected [B, {self.mean.shape[0]}]; "
                f"got {tuple(batch.shape)}"
            )
        batch = batch.double()
        n = batch.shape[0]
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.count = total
        self._device_stats = None

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """`obs [..., dim]` on any device -> float32, standardised and clipped to +-clip.

        The statistics are copied to `obs`'s device once per update, and the arithmetic is
        float64 on every device, so a CPU and a device normalisation agree exactly.
        """
        if self.count == 0:
            return obs.float()
        mean, std = self._stats_on(obs.device)
        z = (obs.double() - mean) / std
        return z.clamp(-self.clip, self.clip).float()

    def _stats_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`(mean, sqrt(var + eps))` float64 on `device`, cached until the next update."""
        if self._device_stats is None or self._device_stats[0].device != device:
            std = torch.sqrt(self.var + self.eps)
            self._device_stats = (self.mean.to(device), std.to(device))
        return self._device_stats

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"].clone(), state["var"].clone(), state["count"]
        self._device_stats = None


class EmaNormalizer:
    """esper-lite's observation normaliser: an exponential moving average of the batch
    moments, float32 on the device (2df957ed src/esper/simic/control/normalization.py:15-147,
    `RunningMeanStd(momentum=0.99)` at simic/training/vectorized.py:551).

    Starts at mean 0, variance 1; `update(x [B, dim])` folds in the batch's mean and
    population variance with weight `1 - momentum`, the variance with the between-means
    term; `normalize` is `clamp((x - mean) / sqrt(var + eps), -clip, clip)`. After k
    updates the mean holds only `1 - momentum**k` of the data's (22% after 25 rollouts):
    observations stay near their raw scale for most of a short run, as in the original.
    `count` (observations folded in) is kept for diagnostics only, as there.
    """

    def __init__(self, dim: int, device: torch.device | str = "cpu", momentum: float = 0.99,
                 eps: float = 1e-4, clip: float = 10.0) -> None:
        check_int("EmaNormalizer: dim", dim)
        self.device = check_device("EmaNormalizer: device", device)
        self.mean = torch.zeros(dim, device=self.device)
        self.var = torch.ones(dim, device=self.device)
        self.count = 0
        self.momentum, self.eps, self.clip = momentum, eps, clip

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold in `batch [B, dim]` (any device; moved to the statistics')."""
        if batch.dim() != 2 or batch.shape[1] != self.mean.shape[0]:
            raise ValueError(
                f"EmaNormalizer.update: batch: expected [B, {self.mean.shape[0]}]; "
                f"got {tuple(batch.shape)}"
            )
        batch = batch.to(self.device, torch.float32)
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, unbiased=False)
        delta = batch_mean - self.mean  # before the mean moves: the between-means term
        m = self.momentum
        self.mean = m * self.mean + (1 - m) * batch_mean
        self.var = m * self.var + (1 - m) * batch_var + m * (1 - m) * delta ** 2
        self.count += batch.shape[0]

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """`obs [..., dim]` -> float32 on the statistics' device, standardised and clipped."""
        obs = obs.to(self.device, torch.float32)
        return torch.clamp((obs - self.mean) / torch.sqrt(self.var + self.eps),
                           -self.clip, self.clip)

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean = state["mean"].to(self.device, torch.float32)
        self.var = state["var"].to(self.device, torch.float32)
        self.count = state["count"]


#: `TrainConfig.obs_normalizer`'s values, esper-lite's first
OBS_NORMALIZERS: tuple[str, ...] = ("ema", "welford")
ObservationNormalizer = EmaNormalizer | RunningNormalizer


def make_obs_normalizer(kind: str, dim: int, device: torch.device | str) -> ObservationNormalizer:
    """A normaliser of `kind` (`OBS_NORMALIZERS`) for observations of `dim` features."""
    check_choice("obs_normalizer", kind, OBS_NORMALIZERS)
    return EmaNormalizer(dim, device) if kind == "ema" else RunningNormalizer(dim)
