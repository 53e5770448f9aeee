"""The host network: an MLP with a seed slot after each hidden layer."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from esper.env.config import EnvConfig
from esper.env.initialization import init_linear
from esper.env.seed_slot import NUM_SLOTS, SeedSlot


class HostNetwork(nn.Module):
    """`input_dim -> H -> H -> H -> num_classes` ReLU MLP with a seed slot after each hidden layer."""

    def __init__(self, config: EnvConfig) -> None:
        super().__init__()
        h = config.host_hidden
        dims = [config.input_dim, h, h, h]
        self.hidden = nn.ModuleList(nn.Linear(dims[i], dims[i + 1]) for i in range(NUM_SLOTS))
        self.head = nn.Linear(h, config.num_classes)

    def reset_parameters_from(self, gen: torch.Generator) -> None:
        for layer in (*self.hidden, self.head):
            init_linear(layer, gen)

    def forward(self, x: torch.Tensor, slots: Sequence[SeedSlot]) -> torch.Tensor:
        """Logits `[B, num_classes]` f32 from inputs `[B, input_dim]` f32."""
        h = x
        for layer, slot in zip(self.hidden, slots):
            h = slot.blend(torch.relu(layer(h)))
        return self.head(h)
