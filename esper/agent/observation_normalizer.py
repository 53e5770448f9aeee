"""Running mean / std of observations, frozen while a rollout is collected."""

from __future__ import annotations

import torch

from esper.checks import check_int


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
