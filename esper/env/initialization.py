"""Weights drawn from a generator: every host and seed parameter starts from a CPU draw.

Parameters are built on `meta` and moved to their device empty (no init work, no draw
from the global RNG), then filled from a CPU generator of their (seed, env, purpose)
stream (`esper.env.task.random_stream`): a host or seed starts the same on every device.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def he_normal(out_features: int, in_features: int, gen: torch.Generator) -> torch.Tensor:
    """He-normal weight `[out, in]` float32 on CPU, drawn from `gen`."""
    return torch.randn(out_features, in_features, generator=gen) * math.sqrt(2.0 / in_features)


def assign(param: torch.Tensor, value: torch.Tensor) -> None:
    """Copy a CPU init value into a (device) parameter in place."""
    with torch.no_grad():
        param.copy_(value)


def init_linear(layer: nn.Linear, gen: torch.Generator, zero: bool = False) -> None:
    """He-normal weight and zero bias, or all zeros (a residual branch's output layer)."""
    if zero:
        assign(layer.weight, torch.zeros_like(layer.weight, device="cpu"))
    else:
        assign(layer.weight, he_normal(layer.out_features, layer.in_features, gen))
    if layer.bias is not None:
        assign(layer.bias, torch.zeros(layer.out_features))
