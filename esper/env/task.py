"""The synthetic classification task a host learns, and the random streams of an env.

Every random draw of an env comes from a CPU generator of its own (seed, env index,
purpose) stream, so data and initial weights are the same on every device and do not
depend on what else drew from torch's global generator.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from esper.env.config import EnvConfig

#: purposes of an env's random streams (`random_stream`)
DATA, HOST_INIT, SEED_INIT = 0, 1, 2


def random_stream(config: EnvConfig, env_index: int, purpose: int) -> torch.Generator:
    """A CPU generator for one (seed, env, purpose) stream: 0 data, 1 host init, 2 seed init."""
    state = np.random.SeedSequence([config.seed, env_index, purpose]).generate_state(1)
    return torch.Generator().manual_seed(int(state[0]))


def make_task(config: EnvConfig, gen: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gaussian inputs labelled by a random tanh teacher, on CPU.

    Returns `train_x [train_batches, batch_size, input_dim] f32`, `train_y
    [train_batches, batch_size] int64`, `val_x [val_size, input_dim] f32`,
    `val_y [val_size] int64`.
    """
    d, c, teacher_hidden = config.input_dim, config.num_classes, 32
    w1 = torch.randn(d, teacher_hidden, generator=gen) / math.sqrt(d)
    w2 = torch.randn(teacher_hidden, c, generator=gen) / math.sqrt(teacher_hidden)
    n_train = config.train_batches * config.batch_size
    x = torch.randn(n_train + config.val_size, d, generator=gen)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=-1)
    train_x = x[:n_train].reshape(config.train_batches, config.batch_size, d)  # [N, D] -> [b, B, D]
    train_y = y[:n_train].reshape(config.train_batches, config.batch_size)  # [N] -> [b, B]
    return train_x, train_y, x[n_train:], y[n_train:]
