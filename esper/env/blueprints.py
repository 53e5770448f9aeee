"""The seed modules a GERMINATE grows: 13 blueprints, one per choice of the blueprint head.

Each is a residual branch `[B, H] -> [B, H]` whose output layer starts at zero, so a
new seed does not perturb the host (`esper.env.seed_slot.SeedSlot.blend` adds
`alpha * seed(h)` to the slot's hidden features `h`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from esper.env.initialization import assign, init_linear

_GATE_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gate_tanh": torch.tanh,
    "gate_gelu": F.gelu,
    "gate_silu": F.silu,
}


class _ResidualMLP(nn.Module):
    """`Linear(H, width) -> ReLU -> Linear(width, H)`; input/output `[B, H]` float32."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(width, hidden)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        init_linear(self.up, gen)
        init_linear(self.down, gen, zero=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(h)))


class _LowRankAdapter(nn.Module):
    """Bias-free `Linear(H, rank) -> Linear(rank, H)`; input/output `[B, H]` float32."""

    def __init__(self, hidden: int, rank: int) -> None:
        super().__init__()
        self.a = nn.Linear(hidden, rank, bias=False)
        self.b = nn.Linear(rank, hidden, bias=False)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        init_linear(self.a, gen)
        init_linear(self.b, gen, zero=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(h))


class _FeatureGate(nn.Module):
    """Per-feature nonlinearity `act(h * scale + shift) * out`; `[B, H]` float32."""

    def __init__(self, hidden: int, kind: str) -> None:
        super().__init__()
        self.act = _GATE_FNS[kind]
        self.scale = nn.Parameter(torch.empty(hidden))
        self.shift = nn.Parameter(torch.empty(hidden))
        self.out = nn.Parameter(torch.empty(hidden))

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        hidden = self.scale.shape[0]
        assign(self.scale, 1.0 + 0.1 * torch.randn(hidden, generator=gen))
        assign(self.shift, torch.zeros(hidden))
        assign(self.out, torch.zeros(hidden))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.act(h * self.scale + self.shift) * self.out


class _NormAdapter(nn.Module):
    """`LayerNorm(H)` whose affine weight starts at zero; `[B, H]` float32."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        assign(self.norm.weight, torch.zeros(self.norm.normalized_shape))
        assign(self.norm.bias, torch.zeros(self.norm.normalized_shape))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)


@dataclass(frozen=True)
class Blueprint:
    """A seed module kind: `mlp` (width), `lowrank` (rank), `gate_*` or `norm` (width 0)."""

    kind: str
    width: int = 0

    @property
    def name(self) -> str:
        return f"{self.kind}{self.width}" if self.width else self.kind

    def build(self, hidden: int, device: torch.device, gen: torch.Generator) -> nn.Module:
        """A fresh residual branch `[B, hidden] -> [B, hidden]` on `device`, init from `gen`."""
        with torch.device("meta"):  # no init work and no draw from the global RNG
            if self.kind == "mlp":
                module: nn.Module = _ResidualMLP(hidden, self.width)
            elif self.kind == "lowrank":
                module = _LowRankAdapter(hidden, self.width)
            elif self.kind in _GATE_FNS:
                module = _FeatureGate(hidden, self.kind)
            else:
                module = _NormAdapter(hidden)
        module.to_empty(device=device)
        module.reset_parameters_from(gen)
        return module


#: blueprint head index -> seed module kind (13 entries, one per head choice).
BLUEPRINTS: tuple[Blueprint, ...] = (
    *(Blueprint("mlp", w) for w in (8, 16, 32, 64, 128)),
    *(Blueprint("lowrank", r) for r in (1, 2, 4, 8)),
    Blueprint("gate_tanh"),
    Blueprint("gate_gelu"),
    Blueprint("gate_silu"),
    Blueprint("norm"),
)
