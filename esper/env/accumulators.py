"""Per-env sums over one epoch's training batches, allocated once (review P3 and L2).

The reviewed system keeps two pre-allocated accumulators per env, the summed training
loss and the count of correct predictions, updated on every batch with two in-place adds
(`train_loss_accum.add_(loss)`, `train_correct_accum.add_(correct)`); the review (L2)
suggests one stacked add. `Variants.accumulators` picks `separate` or `stacked`; both
add the same float32 values in the same order, so their sums are equal.
"""

from __future__ import annotations

import torch

from esper.checks import check_choice, check_device
from esper.variants import AXES

Tensor = torch.Tensor
#: `Variants.accumulators`' values, the original's first
MODES = AXES["accumulators"]


class EpochAccumulators:
    """Sums of (loss in nats, correct predictions) over the batches since `zero_()`."""

    def __init__(self, device: torch.device | str, mode: str = "separate") -> None:
        self.mode = check_choice("EpochAccumulators: mode", mode, MODES)
        device = check_device("EpochAccumulators: device", device)
        if mode == "separate":  # [1] float32 each, as parallel_env_state.py:88-89 @2df957ed
            self._loss = torch.zeros(1, device=device)
            self._correct = torch.zeros(1, device=device)
        else:
            self._sums = torch.zeros(2, device=device)  # [loss, correct]

    def zero_(self) -> None:
        if self.mode == "separate":
            self._loss.zero_()
            self._correct.zero_()
        else:
            self._sums.zero_()

    def add_(self, loss: Tensor, correct: Tensor) -> None:
        """Add one batch: `loss` a 0-d float32 and `correct` a 0-d float32 or int64 (the
        reviewed count's dtype, `predicted.eq(targets).sum()`) on the accumulators'
        device; an int64 count is cast as it is added (in `add_` or in the `stack`)."""
        if self.mode == "separate":
            self._loss.add_(loss)
            self._correct.add_(correct)
        else:
            self._sums.add_(torch.stack([loss, correct]))  # 2 x [] -> [2]

    def sums(self) -> Tensor:
        """`[2]` float32 `[loss sum, correct count]`, a new tensor (later adds leave it be)."""
        if self.mode == "separate":
            return torch.cat([self._loss, self._correct])
        return self._sums.clone()
