"""One seed slot of the host: its lifecycle stage, its seed module and blend weight.

Seed lifecycle of one slot::

    EMPTY --GERMINATE--> TRAINING --ADVANCE--> BLENDING --FOSSILIZE--> FOSSILIZED
                            |  ^                  |  ^
                            +--+ SET_ALPHA        +--+ SET_ALPHA
                 PRUNE from TRAINING or BLENDING --> EMPTY

A seed adds `alpha * seed(h)` to the hidden features `h` of its slot. In TRAINING the
seed reads `h.detach()`, so it learns without pushing gradients into the host's lower
layers; in BLENDING gradients flow both ways; a FOSSILIZED seed's blend weight is fixed
for good, while its weights train on, as the original's do (`esper.env.optimizers`).
Every seed's output is zero-initialised, so germination does not perturb the host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable

import torch
from torch import nn

from esper.agent.heads import HEAD_SIZES
from esper.env.blueprints import Blueprint

#: seed slots of the host, one after each hidden layer (the slot head's choices).
NUM_SLOTS: int = HEAD_SIZES["slot"]
#: alpha_target head index -> blend weight a seed ramps towards.
ALPHA_TARGETS: tuple[float, ...] = (0.3, 0.7, 1.0)
#: alpha_speed head index -> epochs a SET_ALPHA ramp takes.
ALPHA_SPEEDS: tuple[int, ...] = (1, 2, 4, 8)
#: alpha_curve head index -> shape of the ramp, a map from progress in [0, 1] to [0, 1].
ALPHA_CURVES: tuple[str, ...] = ("linear", "cosine", "step")
#: style head index -> multiplier of the seed's learning rate `EnvConfig.seed_lr` (this
#: project's: the original's style picks a blend and alpha algorithm, its seeds one lr).
STYLE_LR_SCALES: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
#: tempo head index -> TRAINING epochs a seed needs before ADVANCE is allowed.
TEMPO_EPOCHS: tuple[int, ...] = (1, 2, 4)

_CURVE_FNS: dict[str, Callable[[float], float]] = {
    "linear": lambda p: p,
    "cosine": lambda p: 0.5 - 0.5 * math.cos(math.pi * p),
    "step": lambda p: 1.0 if p >= 1.0 else 0.0,
}
class Stage(IntEnum):
    """Lifecycle stage of one seed slot; the value is its one-hot index in observations."""

    EMPTY = 0
    TRAINING = 1
    BLENDING = 2
    FOSSILIZED = 3


@dataclass
class SeedSlot:
    """Host-side state of one seed slot; `module` is None exactly when `stage` is EMPTY."""

    stage: Stage = Stage.EMPTY
    module: nn.Module | None = None
    blueprint: Blueprint | None = None
    alpha: float = 0.0
    """Current blend weight: the slot adds `alpha * module(h)` to `h`."""
    lr_scale: float = 1.0
    tempo: int = 1
    """TRAINING epochs needed before ADVANCE is valid."""
    epochs_in_stage: int = 0
    ramp_start: float = 0.0
    ramp_target: float = 0.0
    ramp_epochs: int = 0
    ramp_elapsed: int = 0
    ramp_curve: str = "linear"
    initial_val_acc: float | None = None
    """The host's validation accuracy (a fraction) at the end of the seed's first epoch,
    as esper-lite's seed metrics record it (kasmina/slot.py:145-147 @2df957ed); None
    before it."""

    @property
    def num_parameters(self) -> int:
        return 0 if self.module is None else sum(p.numel() for p in self.module.parameters())

    def valid_ops(self) -> tuple[str, ...]:
        """Ops other than WAIT that may target this slot now."""
        if self.stage is Stage.EMPTY:
            return ("GERMINATE",)
        if self.stage is Stage.TRAINING:
            ready = self.epochs_in_stage >= self.tempo
            return ("SET_ALPHA", "PRUNE", "ADVANCE") if ready else ("SET_ALPHA", "PRUNE")
        if self.stage is Stage.BLENDING:
            return ("SET_ALPHA", "PRUNE", "FOSSILIZE")
        return ()

    def start_ramp(self, target: float, epochs: int, curve: str) -> None:
        """Move `alpha` from its current value to `target` over `epochs` epoch ends."""
        self.ramp_start, self.ramp_target = self.alpha, target
        self.ramp_epochs, self.ramp_elapsed, self.ramp_curve = epochs, 0, curve

    def end_epoch(self) -> None:
        """Advance stage time and, unless fossilized, the alpha ramp by one epoch."""
        if self.stage is Stage.EMPTY:
            return
        self.epochs_in_stage += 1
        if self.stage is Stage.FOSSILIZED or self.ramp_elapsed >= self.ramp_epochs:
            return
        self.ramp_elapsed += 1
        progress = _CURVE_FNS[self.ramp_curve](self.ramp_elapsed / self.ramp_epochs)
        self.alpha = self.ramp_start + (self.ramp_target - self.ramp_start) * progress

    def blend(self, h: torch.Tensor) -> torch.Tensor:
        """`h + alpha * module(h)`, `[B, H]` float32; a TRAINING seed reads `h.detach()`."""
        if self.module is None:
            return h
        seed_in = h.detach() if self.stage is Stage.TRAINING else h
        return h + self.alpha * self.module(seed_in)
